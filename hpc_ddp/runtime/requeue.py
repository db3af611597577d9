"""The requeue coordinator: ledger entries, the budget, and the one requeue request.

The session calls it at four moments, on every rank (only global rank 0 acts):

* :meth:`Coordinator.begin` when the attempt starts: a ledger ``attempt_start``; an attempt
  beyond the budget (Slurm requeued the job itself once too often) ends at once, non-zero.
* :meth:`Coordinator.stop` after the ranks agreed on a stop signal and the checkpoint is
  durable: ask Slurm why (``scontrol show job``), decide with the budget, request the requeue
  when Slurm is not already requeueing the job, and write ``attempt_end``. A requeue that was
  needed and failed ends the attempt ``requeue_failed`` with :data:`REQUEUE_FAILED_EXIT_CODE`:
  the job must end FAILED, never COMPLETED with training unfinished. Slurm's silence is never
  taken for "Slurm is requeueing it" (see :mod:`hpc_ddp.runtime.stopcause`).
* :meth:`Coordinator.finish` when training ended normally, :meth:`Coordinator.crash` when it
  raised (on whichever rank it raised).

Exactly one process asks for a requeue, once, for ``ARRAYJOB_TASK`` in an array: after a stop
signal global rank 0; after a crash with ``requeue.on_crash`` the first rank to crash, chosen by
an exclusive create (see :meth:`Coordinator.crash` and :mod:`hpc_ddp.runtime.crash_claim`).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.config.model import RequeueConfig
from hpc_ddp.errors import SlurmError
from hpc_ddp.runtime.attempt import RequeueDecision
from hpc_ddp.runtime.crash_claim import claim_crash_requeue
from hpc_ddp.runtime.distenv import DistEnv
from hpc_ddp.runtime.ledger import EndCause, decide_requeue, record_end, record_start
from hpc_ddp.runtime.requeue_messages import (
    outside_slurm_message,
    requeue_failed_message,
    slurm_failure_summary,
    unconfirmed_message,
)
from hpc_ddp.runtime.stopcause import (
    StopVerdict,
    classify_stop,
    classify_unanswered_stop,
    signal_number,
)
from hpc_ddp.slurm.client import SlurmClient

log = logging.getLogger(__name__)

BUDGET_EXIT_CODE = 3
"""Exit status of a run whose requeue budget ran out: Slurm records the job as FAILED."""
REQUEUE_FAILED_EXIT_CODE = 4
"""Exit status of an attempt that needed a requeue and did not get one: ``scontrol requeue``
failed, or (after a SIGTERM) Slurm could not be asked whether it is requeueing the job. Slurm
records the job FAILED, unless it requeues or cancels the job itself."""


@dataclass(frozen=True)
class StopOutcome:
    """What happened at a stop: the cause, whether a requeue was asked for, the exit code."""

    cause: EndCause
    requeue_requested: bool
    exit_code: int
    message: str


class Coordinator:
    """Ledger and requeue decisions for one attempt of one run (see the module docstring)."""

    def __init__(
        self,
        dist: DistEnv,
        ledger: Path,
        cfg: RequeueConfig,
        slurm: SlurmClient | None = None,
    ) -> None:
        self.dist = dist
        self.ledger = ledger
        self.run_dir = str(ledger.parent)  # named in the hints: `hpc-ddp resume RUN_DIR`
        self.cfg = cfg
        self.client = slurm if slurm is not None else SlurmClient()
        # Inside a Slurm job, also for a `command:` child that got torchrun-style variables.
        self.under_slurm = dist.job_ref is not None
        self._ended = False

    @property
    def attempt(self) -> int:
        """This attempt's number: Slurm's restart count (0 for the first run)."""
        return self.dist.restart_count

    def begin(self, *, resumed_from_step: int | None, checkpoint: str | None) -> StopOutcome | None:
        """Record the start; returns an outcome (end now) when the budget is already spent."""
        if not self.dist.is_main:
            return None
        record_start(
            self.ledger,
            attempt=self.attempt,
            job_id=self.dist.job_id,
            job_ref=self.dist.job_ref,
            nodelist=",".join(self.dist.nodelist),
            world_size=self.dist.world_size,
            resumed_from_step=resumed_from_step,
            checkpoint=checkpoint,
        )
        if self.attempt > self.cfg.max_requeues:
            message = (
                f"attempt {self.attempt} is beyond the requeue budget "
                f"(requeue.max_requeues={self.cfg.max_requeues}); not training. "
                "HINT: go on from the newest checkpoint with a larger budget: "
                f"`hpc-ddp resume {self.run_dir} "
                f"requeue.max_requeues={max(2 * self.cfg.max_requeues, self.attempt + 1)}`."
            )
            log.error(message)
            self._end(EndCause.BUDGET_EXHAUSTED, resumed_from_step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE, message)
        return None

    def _ask_slurm(self) -> tuple[dict[str, str] | None, str]:
        """``scontrol show job`` of this job: (its fields, "") or (None, why it failed)."""
        assert self.dist.job_ref is not None
        try:
            return self.client.show_job(self.dist.job_ref), ""
        except SlurmError as exc:
            log.warning("could not ask Slurm about job %s: %s", self.dist.job_ref, exc)
            return None, slurm_failure_summary(exc)

    def stop(self, signum: int, *, step: int, checkpoint: str | None) -> StopOutcome:
        """Handle an agreed stop on rank 0 (other ranks get a neutral outcome)."""
        if not self.dist.is_main:
            return StopOutcome(EndCause.UNKNOWN, False, 0, "")
        requeue_signum = signal_number(self.cfg.signal)
        fields, error = self._ask_slurm() if self.under_slurm else (None, "")
        if self.under_slurm and fields is None:
            # Never read "Slurm did not answer" as "Slurm is requeueing it" (see preemption).
            verdict = classify_unanswered_stop(signum, requeue_signum=requeue_signum, error=error)
        else:
            verdict = classify_stop(
                signum, requeue_signum=requeue_signum, restart_count=self.attempt, job=fields
            )
        return self._act(verdict, step=step, checkpoint=checkpoint)

    def _decide(self, cause: EndCause) -> RequeueDecision:
        return decide_requeue(
            cause, self.attempt, self.cfg.max_requeues, self.cfg.on_crash, self.run_dir
        )

    def _act(self, verdict: StopVerdict, *, step: int, checkpoint: str | None) -> StopOutcome:
        decision = self._decide(verdict.cause)
        if verdict.request_requeue and not decision.requeue:
            message = f"requeue budget exhausted: {decision.reason}"
            log.error("%s", message)
            self._end(EndCause.BUDGET_EXHAUSTED, step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE, message)
        requested = False
        if verdict.request_requeue and self.under_slurm:
            error = self._request_requeue()
            if error is None:
                requested = True
            else:
                after = self._after_refusal(error)
                if after is None:
                    return self._requeue_failed(verdict, error, step, checkpoint)
                verdict = after
                decision = self._decide(verdict.cause)
        if not verdict.slurm_answered and not requested:
            return self._unconfirmed(verdict, step, checkpoint)
        reason = decision.reason
        if verdict.request_requeue and not self.under_slurm:
            reason = outside_slurm_message(self.run_dir)
        message = f"{verdict.cause.value}: {verdict.explanation}; {reason}"
        log.info("stopping at step %d: %s", step, message)
        self._end(verdict.cause, step, checkpoint, requested, message)
        return StopOutcome(verdict.cause, requested, 0, message)

    def _request_requeue(self) -> str | None:
        """``scontrol requeue`` this job: None when Slurm accepted, else what went wrong."""
        assert self.dist.job_ref is not None
        try:
            self.client.requeue(self.dist.job_ref)
        except SlurmError as exc:
            log.warning("scontrol requeue %s failed: %s", self.dist.job_ref, exc)
            return slurm_failure_summary(exc)
        log.info("asked Slurm to requeue job %s", self.dist.job_ref)
        return None

    def _after_refusal(self, error: str) -> StopVerdict | None:
        """Why Slurm refused a requeue, when its answer shows a reason; None: the request failed.

        Slurm may have won a race (the preemption's grace ran out, someone requeued or
        cancelled the job by hand meanwhile): only a ``Restarts`` count that went up, or a
        cancellation, in Slurm's own answer says so. No answer proves nothing.
        """
        fields, _ = self._ask_slurm()
        if fields is None:
            return None
        verdict = classify_stop(
            int(signal.SIGTERM),
            requeue_signum=signal_number(self.cfg.signal),
            restart_count=self.attempt,
            job=fields,
        )
        if verdict.request_requeue:  # still running and not being requeued: it just failed
            return None
        log.info("Slurm refused the requeue of %s: %s", self.dist.job_ref, verdict.explanation)
        return StopVerdict(
            verdict.cause, False, f"{verdict.explanation} (scontrol requeue said: {error})"
        )

    def _requeue_failed(
        self, verdict: StopVerdict, error: str, step: int, checkpoint: str | None
    ) -> StopOutcome:
        """A requeue was needed and could not be had: the job must end FAILED, and say so."""
        message = requeue_failed_message(
            self.dist.job_ref, verdict, error, step, checkpoint, REQUEUE_FAILED_EXIT_CODE,
            self.run_dir,
        )  # fmt: skip
        log.error("%s", message)
        self._end(EndCause.REQUEUE_FAILED, step, checkpoint, False, message)
        return StopOutcome(EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE, message)

    def _unconfirmed(self, verdict: StopVerdict, step: int, checkpoint: str | None) -> StopOutcome:
        """A stop Slurm could not be asked about and no requeue was asked for: exit non-zero."""
        message = unconfirmed_message(
            self.dist.job_ref, verdict, step, checkpoint, REQUEUE_FAILED_EXIT_CODE,
            self.run_dir,
        )  # fmt: skip
        log.error("%s", message)
        self._end(verdict.cause, step, checkpoint, False, message)
        return StopOutcome(verdict.cause, False, REQUEUE_FAILED_EXIT_CODE, message)

    def finish(self, *, step: int, checkpoint: str | None) -> None:
        """Record a normal end of training (rank 0)."""
        if self.dist.is_main:
            self._end(EndCause.FINISHED, step, checkpoint, False, "training finished")

    def crash(
        self,
        *,
        step: int | None,
        checkpoint: str | None,
        error: BaseException | str,
        claimed: bool = False,
    ) -> None:
        """Record a crash of this rank, and with ``requeue.on_crash`` requeue the job.

        Any rank may write it (one O_APPEND line): the first end of an attempt wins in the
        ledger, so the rank that failed first is the one named, not a peer that merely lost
        its connection to it. A crash needs no agreement between the ranks (the others are
        typically stuck in a collective, or die of the lost connection), so when it is to be
        requeued the first rank to crash claims that by creating a file exclusively: it alone
        asks ``scontrol requeue`` and writes the end; a rank that loses the claim writes
        nothing, so the ledger's first end is always the one that says what was requested.
        ``error``: the exception, or what happened in words (a ``command`` child killed by a
        signal); ``claimed``: the caller already holds this attempt's claim.
        """
        where = self.dist.node_name or "?"
        what = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        message = f"rank {self.dist.rank} on {where}: {what}"
        log.error("crash: %s", message)
        decision = self._decide(EndCause.CRASH)
        if not (decision.requeue and self.under_slurm):
            why = outside_slurm_message(self.run_dir) if decision.requeue else decision.reason
            self._end(EndCause.CRASH, step, checkpoint, False, f"{message}; {why}")
            return
        claims = self.ledger.parent / "rendezvous"
        if not claimed and not claim_crash_requeue(claims, self.dist.job_id, self.attempt):
            log.info("another rank crashed first and requests the requeue")
            self._ended = True
            return
        error_text = self._request_requeue()
        if error_text is None:
            self._end(EndCause.CRASH, step, checkpoint, True, f"{message}; {decision.reason}")
            return
        ref = self.dist.job_ref
        message += (
            f"; requeue.on_crash: could not requeue job {ref}: {error_text}. "
            f"HINT: `hpc-ddp resume {self.run_dir}` goes on from the newest checkpoint."
        )
        log.error("%s", message)
        self._end(EndCause.CRASH, step, checkpoint, False, message)

    def _end(
        self, cause: EndCause, step: int | None, checkpoint: str | None, requested: bool, msg: str
    ) -> None:
        if self._ended:
            return
        self._ended = True
        record_end(
            self.ledger,
            attempt=self.attempt,
            cause=cause,
            steps_done=step,
            checkpoint=checkpoint,
            requeue_requested=requested,
            message=msg,
        )
