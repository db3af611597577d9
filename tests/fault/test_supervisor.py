"""The supervisor's files: the bad nodes of a job, a launch's directory, the newest checkpoint.

Its policy is pinned in tests/fault/test_plan.py; the supervisor itself runs on the real dev
cluster in tests/fault/test_faults_e2e.py.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

from hpc_ddp.fault.blame import BEAT_BYTES
from hpc_ddp.fault.supervisor import (
    newest_checkpoint_step,
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


def _labelled(path: Path, step: int) -> None:
    """A zip archive whose pickle says ``step``, as a checkpoint's does (no torch needed)."""
    payload = {"progress": {"step": step}, "meta": {}}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def test_the_newest_checkpoint_step_is_the_newest_whose_label_says_it(tmp_path: Path) -> None:
    """Issue 31: a copy named step-00009999.pt, a FIFO or a cut file was taken for the newest
    checkpoint (the launch said "from step 9999", and no_progress compared with it)."""
    assert newest_checkpoint_step(tmp_path / "none") is None
    for step in (10, 140):
        _labelled(tmp_path / f"step-{step:08d}.pt", step)
    for name in (".tmp-step-00000150.pt", "latest"):
        (tmp_path / name).write_text("x")
    assert newest_checkpoint_step(tmp_path) == 140
    _labelled(tmp_path / "step-00009999.pt", 140)  # a copy under a newer name
    os.mkfifo(tmp_path / "step-00000160.pt")  # never opened
    (tmp_path / "step-00000150.pt").write_bytes((tmp_path / "step-00000140.pt").read_bytes()[:-9])
    assert newest_checkpoint_step(tmp_path) == 140
