"""Whether a run may be resumed now: a pure decision over the state ``status`` shows.

``hpc-ddp resume RUN_DIR`` submits the run's job again in the same directory, where the runtime
finds the newest good checkpoint and goes on from its step. Two jobs writing one run directory
would corrupt it, so a run Slurm (or the local controller) says is queued or running is never
resumed, ``--force`` or not. ``--force`` only overrides the two cases where resuming is
probably, not certainly, a mistake: a run that already finished (to train longer, with an
override such as ``train.epochs=20``) and a run whose state nobody could confirm.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_ddp.backends.jobs import JobState

ENDED_UNFINISHED = frozenset(
    {"INCOMPLETE", "FAILED", "CANCELLED", "GONE?"}
    | {s.value for s in JobState if s.finished and s is not JobState.COMPLETED}
)
"""States of a run that ended without finishing: resumable as they are."""


@dataclass(frozen=True)
class ResumeCheck:
    """The decision: ``refusal`` is None when the run may be resumed."""

    refusal: str | None
    forceable: bool = False
    """True when ``--force`` would override the refusal."""


def check_resumable(state: str, run_dir: str, job_id: str | None, *, force: bool) -> ResumeCheck:
    """May the run in ``run_dir``, whose ``status`` state is ``state``, be resumed now?"""
    if state in ENDED_UNFINISHED:
        return ResumeCheck(None)
    if state == "DAMAGED":
        return ResumeCheck(
            f"{run_dir} is damaged (see `hpc-ddp status {run_dir}`): its manifest or files "
            "cannot be read, so it cannot be resubmitted. HINT: submit the job again with "
            "`hpc-ddp submit`; copy its checkpoints/ into the new run directory to go on."
        )
    if state == "COMPLETED":
        if force:
            return ResumeCheck(None)
        return ResumeCheck(
            f"{run_dir} already finished training. HINT: to train further, raise the budget and "
            f"force it: `hpc-ddp resume {run_dir} train.epochs=N --force`.",
            forceable=True,
        )
    if state.endswith("?"):  # Slurm did not answer: the ledger's guess, not a fact
        if force:
            return ResumeCheck(None)
        return ResumeCheck(
            f"{run_dir}: Slurm could not confirm that job {job_id} has ended (status shows "
            f"{state}). HINT: check `squeue -j {job_id}`; if it is gone, rerun with --force.",
            forceable=True,
        )
    return ResumeCheck(
        f"{run_dir}: its job {job_id} is still {state}; two jobs must never write one run "
        f"directory. HINT: wait for it to end, or `hpc-ddp cancel {run_dir}` first."
    )
