"""A local run's stop (:mod:`hpc_ddp.backends.local.stop`): a cancel that must kill leaves no
process of the run behind, and a forced stop says what it lost and where the run goes on from.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import time
import zipfile
from functools import partial
from pathlib import Path

from hpc_ddp.backends.local.stop import ForcedStop, force_stop
from hpc_ddp.rundir.layout import Checkpoint, RunPaths
from hpc_ddp.rundir.manifest import read_manifest
from tests import e2e_util as e2e
from tests.backends.local.machine import hpc, pids_running, says

STUBBORN = """
import signal, sys, time
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
print("ignoring every stop signal", flush=True)
while True:
    time.sleep(1)
"""


def _stubborn_job(tmp_path: Path) -> Path:
    """A ``command:`` job of 2 tasks whose program ignores TERM, USR1, USR2, INT and HUP."""
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    job = tmp_path / "stubborn.yaml"
    job.write_text(
        "name: stubborn\n"
        f"command: [python, {tmp_path / 'stubborn.py'}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
    )
    return job


def test_cancel_kills_a_local_job_that_ignores_every_stop_signal(tmp_path: Path) -> None:
    """SIGTERM changes nothing; after the grace (``--kill-wait``) every process of the run is
    SIGKILLed (the controller, the supervisor, both ranks and both programs), and only once
    they are all gone does cancel say "cancelled", and that it killed."""
    job = _stubborn_job(tmp_path)
    done = hpc("submit", str(job), "--backend", "local", "--json", "--runs-dir",
                str(tmp_path / "runs"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    script = str(tmp_path / "stubborn.py")
    try:
        for rank in (0, 1):
            log = run_dir / "logs" / f"rank-{rank}.out"
            e2e.wait_for(
                f"rank {rank} ignoring", partial(says, log, "ignoring every"), timeout_s=120
            )
        programs = pids_running(script)
        assert len(programs) == 2
        ran = pids_running(str(run_dir))  # controller, supervisor, ranks
        assert len(ran) >= 4
        said = hpc("cancel", str(run_dir), "--kill-wait", "2")
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith(f"cancelled local job {read_manifest(run_dir).job_id} ")
        assert "; killed after 2 s: " in said.stdout, said.stdout
        assert "still ran after SIGTERM" in said.stdout
        assert pids_running(script) == []
        assert pids_running(str(run_dir)) == []
        row = json.loads(hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "CANCELLED"
        again = hpc("cancel", str(run_dir))
        assert "already ended; nothing was signalled" in again.stdout
    finally:
        for pid in pids_running(script) + pids_running(str(run_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_forced_stop_names_the_checkpoint_it_goes_on_from_file_or_shard_set() -> None:
    """What a forced local stop writes to the ledger and says was lost names an FSDP run's
    shard set by its directory (step-N), a DDP run's checkpoint by its file (step-N.pt)."""
    assert (
        ForcedStop([0], 25, Checkpoint(20, "step-00000020"))
        .lost()
        .endswith("the 5 step(s) after checkpoint step-00000020 are lost")
    )
    assert ForcedStop([0], 25, None).lost().startswith("no checkpoint was saved")


def _labelled(path: Path, step: int, run_id: str) -> None:
    """A zip archive whose pickle says ``step`` and ``run_id``, as a checkpoint's does."""
    payload = {"progress": {"step": step}, "meta": {"run_id": run_id}, "pad": "x" * 400}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def test_a_forced_stop_goes_on_from_this_runs_newest_checkpoint_not_another_runs(
    tmp_path: Path,
) -> None:
    """A checkpoint copied in from another run (its label names that run) is passed over, as
    the ranks' resume passes it over: the stop says the run goes on from its own newest."""
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    paths.run_id_file.write_text("mine-1\n")
    _labelled(paths.checkpoints / "step-00000010.pt", 10, "mine-1")
    _labelled(paths.checkpoints / "step-00000030.pt", 30, "theirs-2")
    forced = force_stop(tmp_path, None, time.time())
    assert (forced.ranks, forced.checkpoint) == ([], Checkpoint(10, "step-00000010.pt"))
