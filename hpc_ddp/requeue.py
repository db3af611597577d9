"""The requeue coordinator: ledger entries, the budget, and the one requeue request.

The session calls it at four moments, on every rank (only global rank 0 acts):

* :meth:`Coordinator.begin` when the attempt starts: a ledger ``attempt_start``; an attempt
  beyond the budget (Slurm requeued the job itself once too often) ends at once, non-zero.
* :meth:`Coordinator.stop` after the ranks agreed on a stop signal and the checkpoint is
  durable: ask Slurm why (``scontrol show job``), decide with the budget, request the requeue
  when Slurm is not already requeueing the job, and write ``attempt_end``.
* :meth:`Coordinator.finish` when training ended normally, :meth:`Coordinator.crash` when it
  raised.

Exactly one process asks for a requeue: global rank 0, once, for ``ARRAYJOB_TASK`` in an array.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.config import RequeueConfig
from hpc_ddp.distenv import DistEnv
from hpc_ddp.errors import SlurmError
from hpc_ddp.ledger import EndCause, decide_requeue, record_end, record_start
from hpc_ddp.preemption import StopVerdict, classify_stop, signal_number
from hpc_ddp.slurm_client import SlurmClient

log = logging.getLogger(__name__)

BUDGET_EXIT_CODE = 3
"""Exit status of a run whose requeue budget ran out: Slurm records the job as FAILED."""


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
        client: SlurmClient | None = None,
    ) -> None:
        self.dist = dist
        self.ledger = ledger
        self.cfg = cfg
        self.client = client or SlurmClient()
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
                "HINT: raise requeue.max_requeues and resubmit; the checkpoints are kept."
            )
            log.error(message)
            self._end(EndCause.BUDGET_EXHAUSTED, resumed_from_step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE, message)
        return None

    def _job_fields(self) -> dict[str, str] | None:
        if not self.under_slurm or self.dist.job_ref is None:
            return None
        try:
            return self.client.show_job(self.dist.job_ref)
        except SlurmError as exc:
            log.warning("could not ask Slurm about job %s: %s", self.dist.job_ref, exc)
            return None

    def stop(self, signum: int, *, step: int, checkpoint: str | None) -> StopOutcome:
        """Handle an agreed stop on rank 0 (other ranks get a neutral outcome)."""
        if not self.dist.is_main:
            return StopOutcome(EndCause.UNKNOWN, False, 0, "")
        verdict = classify_stop(
            signum,
            requeue_signum=signal_number(self.cfg.signal),
            restart_count=self.attempt,
            job=self._job_fields(),
        )
        return self._act(verdict, step=step, checkpoint=checkpoint)

    def _act(self, verdict: StopVerdict, *, step: int, checkpoint: str | None) -> StopOutcome:
        decision = decide_requeue(
            verdict.cause, self.attempt, self.cfg.max_requeues, self.cfg.on_crash
        )
        requested = False
        exit_code = 0
        message = f"{verdict.cause.value}: {verdict.explanation}; {decision.reason}"
        if verdict.request_requeue and decision.requeue and self.under_slurm:
            requested = self._request_requeue()
            if not requested:
                message += "; the requeue request failed (see the log)"
                exit_code = 1
        elif (
            verdict.request_requeue
            and not decision.requeue
            and verdict.cause
            not in (
                EndCause.CANCELLED,
                EndCause.FINISHED,
            )
        ):
            exit_code = BUDGET_EXIT_CODE
            message = f"requeue budget exhausted: {decision.reason}"
            log.error("%s", message)
            self._end(EndCause.BUDGET_EXHAUSTED, step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, exit_code, message)
        log.info("stopping at step %d: %s", step, message)
        self._end(verdict.cause, step, checkpoint, requested, message)
        return StopOutcome(verdict.cause, requested, exit_code, message)

    def _request_requeue(self) -> bool:
        assert self.dist.job_ref is not None
        try:
            self.client.requeue(self.dist.job_ref)
        except SlurmError as exc:
            # Lost a race with Slurm (preemption grace ran out, or someone requeued by hand)?
            fields = self._job_fields()
            verdict = classify_stop(
                int(signal.SIGTERM),
                requeue_signum=signal_number(self.cfg.signal),
                restart_count=self.attempt,
                job=fields,
            )
            if not verdict.request_requeue and verdict.cause is not EndCause.CANCELLED:
                log.info("Slurm requeued job %s itself meanwhile", self.dist.job_ref)
                return True
            log.error("scontrol requeue %s failed: %s", self.dist.job_ref, exc)
            return False
        log.info("asked Slurm to requeue job %s", self.dist.job_ref)
        return True

    def finish(self, *, step: int, checkpoint: str | None) -> None:
        """Record a normal end of training (rank 0)."""
        if self.dist.is_main:
            self._end(EndCause.FINISHED, step, checkpoint, False, "training finished")

    def crash(self, *, step: int | None, checkpoint: str | None, error: BaseException) -> None:
        """Record a crash of this rank.

        Any rank may write it (one O_APPEND line): the first end of an attempt wins in the
        ledger, so the rank that failed first is the one named, not a peer that merely lost
        its connection to it.
        """
        where = self.dist.node_name or "?"
        message = f"rank {self.dist.rank} on {where}: {type(error).__name__}: {error}"
        log.error("crash: %s", message)
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
