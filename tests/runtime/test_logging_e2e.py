"""Logging on the real two-node dev cluster: one run id and one TensorBoard history per run.

The job is a ``command:`` script on the session API with ``train.tensorboard: true`` that
crashes on rank 1 at step 8 of its first attempt (``requeue.on_crash``): Slurm requeues it and
the second attempt resumes from the step-5 checkpoint, so steps 6-8 are trained and logged
twice. TensorBoard must show each step once, from the attempt that counts; the run id each
attempt reads (and a later ``hpc-ddp resume``) must be the one written at submit time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

# tensorboard ships no type information
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
    EventAccumulator,
)

from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.run_id import read_run_id
from hpc_ddp.sweep.results import read_metrics
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 12
CRASH_AT = 8
CKPT_EVERY = 5


@dataclass(frozen=True)
class CrashedRun:
    run_dir: Path
    submitted_id: str
    """``RUN_DIR/run_id`` as it was right after ``hpc-ddp submit`` returned."""


@pytest.fixture(scope="module")
def crashed_run(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> CrashedRun:
    tmp = tmp_path_factory.mktemp("logging")
    config = e2e.crashy_job(
        tmp, STEPS, CKPT_EVERY, CRASH_AT, on_crash=True, extra="train: {tensorboard: true}\n"
    )
    job = e2e.submit(slurm_cluster, tmp / "runs", str(config))
    submitted = (job.run_dir / "run_id").read_text().strip()  # before any attempt ran
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), fields
    first, second = e2e.ledger(job.run_dir)
    assert (first.steps_done, first.checkpoint) == (CRASH_AT, f"step-{CKPT_EVERY:08d}.pt")
    assert second.resumed_from_step == CKPT_EVERY
    return CrashedRun(job.run_dir, submitted)


def test_tensorboard_shows_each_step_once_from_the_attempt_that_counts(
    crashed_run: CrashedRun,
) -> None:
    """Needs the session to pass ``train.tensorboard`` and the resumed step to MetricsWriter."""
    rows = e2e.metric_rows(crashed_run.run_dir)  # the raw record: every attempt's rows
    replayed = [r["step"] for r in rows if CKPT_EVERY < r["step"] <= CRASH_AT]
    assert sorted(replayed) == [6, 6, 7, 7, 8, 8]  # the crash made the job log these twice
    [marker] = [r for r in rows if r.get("event") == "resume"]  # ... and marked the resume
    assert marker["step"] == CKPT_EVERY
    # `results` and `status` read the file as TensorBoard does: each step once, the last row.
    counted = read_metrics(crashed_run.run_dir / "metrics.jsonl")
    assert [r["step"] for r in counted] == list(range(1, STEPS + 1))
    counts = {r["step"]: r for r in counted}
    tb_dir = crashed_run.run_dir / "tensorboard"
    assert len(list(tb_dir.glob("events.out.tfevents.*"))) >= 2  # one per attempt (rank 0)
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "attempt"}
    attempt = [(e.step, int(e.value)) for e in acc.Scalars("attempt")]
    assert attempt == [(s, counts[s]["attempt"]) for s in range(1, STEPS + 1)]
    assert attempt[CKPT_EVERY - 1 : CRASH_AT] == [(5, 0), (6, 1), (7, 1), (8, 1)]
    losses = acc.Scalars("loss")
    assert [e.step for e in losses] == list(range(1, STEPS + 1))
    want = [counts[s]["loss"] for s in range(1, STEPS + 1)]
    assert [e.value for e in losses] == pytest.approx(want, rel=1e-6)  # float32 on disk


def test_the_run_id_survives_a_requeue_and_a_resume(
    slurm_cluster: Cluster, crashed_run: CrashedRun
) -> None:
    run_dir = crashed_run.run_dir
    assert crashed_run.submitted_id.startswith("crashy-")
    seen = (run_dir / "logs" / "rank-0.out").read_text().splitlines()
    assert seen == [f"run id {crashed_run.submitted_id}"] * 2  # both attempts, one id
    again = e2e.hpc(slurm_cluster, "resume", str(run_dir), "--force", "--wait", timeout_s=300)
    assert again.returncode == 0
    assert read_run_id(RunPaths(run_dir)) == crashed_run.submitted_id
    seen = (run_dir / "logs" / "rank-0.out").read_text().splitlines()
    assert seen == [f"run id {crashed_run.submitted_id}"] * 3
