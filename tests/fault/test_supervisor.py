"""The supervisor's files: the bad nodes of a job, a launch's directory, the newest checkpoint.

Its policy is pinned in tests/fault/test_plan.py; the supervisor itself runs on the real dev
cluster in tests/fault/test_faults_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

from hpc_ddp.fault.blame import BEAT_BYTES
from hpc_ddp.fault.supervisor import (
    prepare_launch,
    read_bad_nodes,
    write_bad_nodes,
)
from hpc_ddp.rundir.layout import RunPaths


def test_bad_nodes_are_remembered_for_the_same_job_only(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_bad_nodes(paths, "42", {"n2": "srun: Node failure"})
    assert read_bad_nodes(paths, "42") == {"n2": "srun: Node failure"}
    assert read_bad_nodes(paths, "43") == {}  # `hpc-ddp resume` is a new job: it starts clean


def test_a_launch_directory_is_made_whole_before_any_rank_starts(tmp_path: Path) -> None:
    lp = RunPaths(tmp_path).launch("42.0.1")
    lp.root.mkdir(parents=True)
    lp.fault.write_text("{}")  # a stale claim must never end the new launch
    prepare_launch(lp, 3)
    assert not lp.fault.exists()
    for path in (lp.supervisor, lp.beat(0), lp.beat(2), lp.exit_note(0), lp.exit_note(2)):
        assert path.stat().st_size == BEAT_BYTES
