"""Issue 42 item 3 on the real dev cluster: the save at a preemption's SIGTERM against the
partition's grace time.

A 2-node ``command:`` job on the session API (``tests/helpers/slow_stop.py``) in ``low`` is
preempted by a job in ``high`` that needs every CPU. Rank 0's save at the agreed stop takes
:data:`SLOW_S` in the first attempt. With ``GraceTime`` 10 (+ ``KillWait`` 5) the kill beats the
save: the next attempt resumes from the periodic save before it and records the lost stop, and
``status`` shows it with its HINT. With ``GraceTime`` 40 the save lands: the next attempt
resumes at the stop's step, and ``requeue.lead_time: auto`` is then sized from that save.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS, EVERY, STEP_S, SLOW_S = 40, 8, 0.25, 20.0
DEFAULT_GRACE_S = 10  # hpc_ddp/devcluster/conf.py's `low`


@pytest.fixture
def grace(slurm_cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, with ``low``'s GraceTime set back to the dev cluster's after the test."""
    yield slurm_cluster
    slurm_cluster.run("scontrol", "update", "PartitionName=low", f"GraceTime={DEFAULT_GRACE_S}")


def _preempted_run(cluster: Cluster, tmp_path: Path, grace_s: int) -> e2e.Submitted:
    cluster.run("scontrol", "update", "PartitionName=low", f"GraceTime={grace_s}")
    config = e2e.helper_job(
        tmp_path, "slowstop", "slow_stop.py", f"'{STEPS}', '{EVERY}', '{STEP_S}', '{SLOW_S}'"
    )
    job = e2e.submit(cluster, tmp_path, str(config), "slurm.partition=low", "slurm.exclusive=true")
    e2e.wait_checkpoint(job.run_dir, EVERY, timeout_s=180)
    e2e.wait_step(job.run_dir, EVERY + 2)  # the stop then comes between two periodic saves
    cluster.run(
        "sbatch", "--parsable", "-p", "high", "-N2", "--ntasks-per-node=1", "-c", "4",
        "-o", str(tmp_path / "high-%j.out"), "--wrap", "sleep 1",
    )  # fmt: skip
    fields = e2e.wait_done(cluster, job.job_id, timeout_s=240)
    assert fields["JobState"] == "COMPLETED", fields
    assert e2e.last_step(job.run_dir) == STEPS
    return job


def test_a_short_grace_kills_the_stop_save_and_the_loss_is_recorded_and_shown(
    grace: Cluster, tmp_path: Path
) -> None:
    job = _preempted_run(grace, tmp_path, DEFAULT_GRACE_S)  # 10 + KillWait 5 < SLOW_S
    attempts = e2e.ledger(job.run_dir)
    [stopped] = [a for a in attempts if a.stop_save is not None]
    assert stopped.stop_save is not None
    assert stopped.lost is not None, attempts
    assert stopped.lost.recorded  # by the next attempt: the ranks died with the save
    assert stopped.lost.step == stopped.stop_save.step
    saved = stopped.lost.saved_step
    assert saved is not None
    assert saved % EVERY == 0
    assert saved < stopped.lost.step
    assert all(s.step < stopped.lost.step for s in stopped.saves)
    after = attempts[attempts.index(stopped) + 1]
    assert after.resumed_from_step == saved
    assert attempts[-1].cause is EndCause.FINISHED
    row = e2e.status(grace, job.run_dir)
    assert f"the stop's save of step {stopped.lost.step} was not durable" in row["note"]
    assert "HINT: raise requeue.lead_time" in row["note"]
    assert (job.run_dir / "ledger.jsonl").read_text().count('"stop_save_lost"') == 1


def test_a_long_grace_lets_the_stop_save_land_and_sizes_auto_from_it(
    grace: Cluster, tmp_path: Path
) -> None:
    job = _preempted_run(grace, tmp_path, 40)  # 40 + 5 > SLOW_S
    attempts = e2e.ledger(job.run_dir)
    [stopped] = [a for a in attempts if a.stop_save is not None]
    assert stopped.stop_save is not None
    assert stopped.lost is None
    assert stopped.cause is EndCause.PREEMPTED
    assert stopped.steps_done == stopped.stop_save.step
    [stop_save] = [s for s in stopped.saves if s.step == stopped.stop_save.step]
    assert stop_save.durable_s is not None
    assert stop_save.durable_s >= SLOW_S
    after = attempts[attempts.index(stopped) + 1]
    assert after.resumed_from_step == stopped.stop_save.step  # nothing lost
    assert "not durable" not in (e2e.status(grace, job.run_dir)["note"] or "")
    # The next submit's auto lead time comes from the save that just landed (rank 0 wrote it
    # to this test's $XDG_STATE_HOME/hpc-ddp/savetimes.json), and the grace check warns of
    # low's GraceTime, set back to 10.
    grace.run("scontrol", "update", "PartitionName=low", f"GraceTime={DEFAULT_GRACE_S}")
    config = tmp_path / "slowstop.yaml"
    dry = ["--dry-run", "--json", "--runs-dir", str(tmp_path)]
    auto = ["slurm.partition=low", "requeue.lead_time=auto", *dry]
    shown = json.loads(e2e.hpc(grace, "submit", str(config), *auto).stdout)
    lead = shown["lead_time"]
    assert lead["source"] == "history"
    assert lead["slowest_s"] >= SLOW_S
    assert lead["seconds"] >= 2 * (SLOW_S + 15)
    assert f"--signal=USR2@{lead['seconds']}\n" in shown["script"]
    assert "GraceTime 10 s of partition low + KillWait 5 s" in shown["grace_warning"]
    print(f"auto lead time: {lead}")
