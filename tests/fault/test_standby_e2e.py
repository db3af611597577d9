"""The next launch on standby, on the real dev cluster: a dead rank's restart calls processes
that were started, imported and waiting, and a launch nobody needs is dismissed.

The built-in trainer (a small MLP whose data loads at a wall-clock pace) on 2 ranks of 2 nodes,
``fault.standby_after_s: 0``: launch 1's processes start as soon as launch 0 trains. Once they
are idle (their imports done), rank 1 of launch 0 is SIGKILLed. The restart must run in exactly
those processes (their pids in launch 1's beats), go on from the survivor's save (no step
trained twice), and count its start-up from the call. At the end the standby started for
launch 2 is dismissed: it leaves no process behind and the job completes.
"""

from __future__ import annotations

import os
import re
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from benchmarks.cluster import idle
from hpc_ddp.fault.watchdog import read_beat
from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 240
JOB = f"""name: standby
slurm: {{nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:10:00'}}
env: {{vars: {{OMP_NUM_THREADS: "1"}}}}
dist: {{timeout_s: 60}}
train: {{model: mlp, dataset: "tests.e2e_util:io_bound_synthetic", max_steps: {STEPS},
        checkpoint_every: 50, log_every: 10, batch_size: 32, synthetic_samples: 4096,
        eval_every: 0}}
fault: {{beat_s: 0.5, stale_s: 3, startup_timeout_s: 120, step_timeout_s: 10,
        standby_after_s: 0}}
"""


def test_a_dead_ranks_restart_runs_in_the_processes_waiting_on_standby(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "standby.yaml"
    config.write_text(JOB)
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(config))
    standby = {
        rank: e2e.wait_for(
            f"rank {rank}'s standby", partial(e2e.rank_pids, job.job_id, rank, launch=1),
            timeout_s=120,
        )[-1]
        for rank in (0, 1)
    }  # fmt: skip
    e2e.wait_for("the standby's imports", lambda: idle(list(standby.values())), timeout_s=60)
    [victim] = e2e.rank_pids(job.job_id, 1, launch=0)
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    dead, again = e2e.ledger(job.run_dir)
    assert (dead.cause, dead.next) == (EndCause.CRASH, "restart")
    assert dead.rescue is not None, dead
    assert dead.rescue.step is not None, dead.rescue
    assert (again.launch, again.resumed_from_step, again.cause) == (
        1, dead.rescue.step, EndCause.FINISHED,
    )  # fmt: skip
    [launch1] = (job.run_dir / "launches").glob("*.0.1")
    ran = {rank: read_beat(launch1 / f"rank-{rank}.beat") for rank in (0, 1)}
    assert {r: b.pid for r, b in ran.items() if b is not None} == standby
    batch = e2e.batch_log(job.run_dir, job.job_id)
    assert "launch 1: its standby processes called" in batch
    # Its start-up counts from the call, and is a fraction of a cold one's imports.
    rank1 = (job.run_dir / "logs" / "rank-1.err").read_text(errors="replace")
    lines = re.findall(r"start-up ([\d.]+) s from (\w+) to the end of the first step", rank1)
    assert [w for _, w in lines] == ["process", "call"], lines
    assert again.started - killed < 10.0
    # Launch 2's standby (started once launch 1 trained) was dismissed when the job finished.
    assert e2e.rank_pids(job.job_id, 0, launch=2) == []
    assert e2e.rank_pids(job.job_id, 1, launch=2) == []
    assert "Traceback" not in rank1
    goodput = e2e.hpc(slurm_cluster, "status", str(job.run_dir), "--json", "--goodput").stdout
    assert '"redone_steps": 0' in goodput
