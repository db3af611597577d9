"""What the ledger and the log say when a stop could not be settled with Slurm.

The texts of :class:`hpc_ddp.runtime.requeue.Coordinator`'s failure paths: each names what
failed, which checkpoint is kept, and what a person does next. Pure string building: the
coordinator decides, logs and writes them.
"""

from __future__ import annotations

from hpc_ddp.errors import SlurmError
from hpc_ddp.runtime.stopcause import StopVerdict

__all__ = [
    "outside_slurm_message",
    "requeue_failed_message",
    "slurm_failure_summary",
    "unconfirmed_message",
]


def requeue_failed_message(
    ref: str | None,
    verdict: StopVerdict,
    error: str,
    step: int,
    checkpoint: str | None,
    code: int,
    run_dir: str,
) -> str:
    """A requeue was needed and could not be had: the job ends FAILED (its tasks exit ``code``)."""
    why = verdict.explanation if verdict.slurm_answered else "Slurm could not be asked either"
    return (
        f"could not requeue job {ref} after {verdict.cause.value} ({why}): "
        f"{error}. The job will not come back by itself: its tasks exit "
        f"{code}, so Slurm records it FAILED. {_kept(step, checkpoint)} "
        "HINT: let the job reach Slurm (scontrol on PATH inside the container, munged's "
        f"socket, SLURM_CONF), and run `scontrol requeue {ref}` where Slurm's commands "
        "work: the run resumes from that checkpoint. Slurm forgets a finished job after "
        f"MinJobAge; then, or any time, `hpc-ddp resume {run_dir}` goes on from it as a new job."
    )


def unconfirmed_message(
    ref: str | None,
    verdict: StopVerdict,
    step: int,
    checkpoint: str | None,
    code: int,
    run_dir: str,
) -> str:
    """A stop Slurm could not be asked about, and no requeue asked for (tasks exit ``code``)."""
    return (
        f"{verdict.cause.value}: {verdict.explanation}. The tasks exit "
        f"{code}: the job ends FAILED unless Slurm requeues or cancels "
        f"it. {_kept(step, checkpoint)} HINT: if the job does not come back (`hpc-ddp "
        f"status`), run `scontrol requeue {ref}` where Slurm's commands work, or "
        f"`hpc-ddp resume {run_dir}` (also once Slurm has forgotten the job, after MinJobAge); "
        "and let the job reach Slurm (scontrol on PATH inside the container, munged's socket, "
        "SLURM_CONF)."
    )


def outside_slurm_message(run_dir: str) -> str:
    """Why a stop or crash that Slurm would requeue is not followed by another attempt here."""
    return (
        "not a Slurm job, so no requeue is possible: nothing starts the run again by itself. "
        f"HINT: `hpc-ddp resume {run_dir}` goes on from the newest checkpoint."
    )


def slurm_failure_summary(exc: SlurmError) -> str:
    """A Slurm failure on one line for the ledger: what failed and what Slurm said, no hint."""
    text = str(exc).split("HINT:", 1)[0]
    lines = (line.strip().rstrip(".") for line in text.splitlines())
    return "; ".join(line for line in lines if line and not line.startswith("command:"))


def _kept(step: int, checkpoint: str | None) -> str:
    if checkpoint is None:
        return (
            f"No checkpoint was saved at step {step} (session.restore() named nothing to save): "
            "a new attempt starts from the beginning."
        )
    return f"The checkpoint at step {step} ({checkpoint}) is kept."
