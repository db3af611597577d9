"""The attempt recorder: one attempt's ledger entries and the one requeue request.

Acting (:class:`Coordinator`). The session calls it at these moments, on every rank (only global
rank 0 acts):

* :meth:`Coordinator.begin` when the attempt starts: a ledger ``attempt_start``; an attempt
  beyond the budget (Slurm requeued the job itself once too often) ends at once, non-zero.
* :meth:`Coordinator.stop` after the ranks agreed on a stop signal and the checkpoint is
  durable: ask Slurm why, decide with the budget, request the requeue when Slurm is not already
  requeueing the job, and write ``attempt_end``. A requeue that was needed and failed ends the
  attempt ``requeue_failed`` with :data:`REQUEUE_FAILED_EXIT_CODE`: the job must end FAILED,
  never COMPLETED with training unfinished.
* :meth:`Coordinator.finish` when training ended normally, :meth:`Coordinator.crash` when it
  raised (on whichever rank it raised), :meth:`Coordinator.fault` when the rank's watchdog
  declared a fault (on its thread).

Exactly one process asks for a requeue, once, for ``ARRAYJOB_TASK`` in an array: after a stop
signal global rank 0; after a crash with ``requeue.on_crash`` the first rank to crash, chosen by
an exclusive create (:func:`claim_crash_requeue`): a crash needs no agreement between the ranks
(the others are typically stuck in a collective, or die of the lost connection). The
``hpc_ddp run`` process above a ``command`` child races for the same claim when its child dies
(:func:`hpc_ddp.job.command.record_child_crash`), so a crash its child's session already claimed
is never requeued twice. The texts of the failure paths (``*_message``) name what failed, which
checkpoint is kept, and what a person does next.

What Slurm is asked goes through the allocation this process runs in
(:class:`~hpc_ddp.backends.allocation.Allocation`); what its answers mean is
:mod:`hpc_ddp.fault.requeue`'s.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.backends.allocation import Allocation, JobStanding
from hpc_ddp.config.elastic import Resize
from hpc_ddp.config.model import RequeueConfig
from hpc_ddp.durable import append_line
from hpc_ddp.errors import BackendError, DistEnvError, RunDirError
from hpc_ddp.exitcodes import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.fault.blame import PEER_ERROR, FaultRecord, fault_cause
from hpc_ddp.fault.requeue import (
    RequeueDecision,
    StopVerdict,
    backend_failure_summary,
    classify_stop,
    classify_unanswered_stop,
    decide_requeue,
    outside_slurm_message,
    requeue_failed_message,
    signal_number,
    unconfirmed_message,
)
from hpc_ddp.rundir.attempt import Attempt, AutoInterval
from hpc_ddp.rundir.checkpoints import checkpoint_on_disk
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import attempt_number, read_ledger
from hpc_ddp.rundir.ledger_events import (
    LaunchId,
    checkpoint_event,
    end_event,
    lost_stop_lines,
    rescue_event,
    start_event,
    stop_save_event,
)
from hpc_ddp.runtime.distenv import DistEnv

log = logging.getLogger(__name__)


def claim_crash_requeue(rendezvous: Path, job_id: str | None, attempt: str) -> bool:
    """True for the one process that creates this attempt's crash claim first.

    The claim is ``rendezvous/crash-requeue-<job id>-<attempt>``, ``attempt`` the launch's
    :attr:`~hpc_ddp.runtime.distenv.DistEnv.attempt_key`. ``O_CREAT | O_EXCL`` is atomic on a
    local filesystem and on NFSv3+, which run directories live on; the name holds the job id
    and attempt, so a requeued attempt, an in-job restart (or a resumed run, a new job) can
    claim again.
    """
    name = f"crash-requeue-{job_id or 'local'}-{attempt}"
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        os.close(os.open(rendezvous / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    except OSError as exc:
        # Better two requests (Slurm refuses the second) than none for a run that needs one.
        log.warning("could not create the crash claim %s (%s); requeueing anyway", name, exc)
    return True


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
        allocation: Allocation,
        *,
        since: float | None = None,
    ) -> None:
        self.dist = dist
        self.ledger = ledger
        self.run_dir = str(ledger.parent)  # named in the hints: `hpc-ddp resume RUN_DIR`
        self.cfg = cfg
        self.allocation = allocation
        """The scheduler's node face: what it says of the job, its requeue, its nodes."""
        # Inside a scheduler's job, also for a `command:` child that got torchrun-style variables.
        self.scheduled = dist.job_ref is not None
        self._ended = False
        self.since = time.time() if since is None else since
        """When this process's attempt began at the latest: entries of a run without job ids
        (local) that started earlier are an earlier job's."""
        self._number: int | None = None

    @property
    def restart(self) -> int:
        """Slurm's restart count of this job (0 for its first run): the requeue budget's count."""
        return self.dist.restart_count

    @property
    def launch_id(self) -> LaunchId:
        """Whose this process's ledger lines are: its job, restart and launch."""
        return LaunchId(self.dist.job_id, self.dist.job_ref, self.restart, self.dist.launch)

    def _attempts(self) -> list[Attempt]:
        try:
            return read_ledger(self.ledger)
        except RunDirError as exc:  # never hide the event being written: number it alone
            log.warning("%s", exc)
            return []

    def number(self) -> int:
        """This attempt's number in the run (the ledger's ``attempt``): the one its start took
        when this process wrote it, else the one its job, restart and launch have in the
        ledger."""
        if self._number is None:
            self._number = attempt_number(
                self._attempts(),
                job_id=self.dist.job_id,
                restart=self.restart,
                since=self.since,
                launch=self.dist.launch,
            )
        return self._number

    def begin(
        self,
        *,
        resumed_from_step: int | None,
        checkpoint: str | None,
        grad_accum: int | None = None,
        resize: Resize | None = None,
    ) -> StopOutcome | None:
        """Record the start (with the session's accumulation and, after an elastic resume,
        its resize); returns an outcome (end now) when the budget is already spent."""
        if not self.dist.is_main:
            return None
        self.write_start(
            resumed_from_step=resumed_from_step,
            checkpoint=checkpoint,
            grad_accum=grad_accum,
            resize=resize,
        )
        if self.restart > self.cfg.max_requeues:
            message = (
                f"restart {self.restart} of job {self.dist.job_ref} is beyond the requeue budget "
                f"(requeue.max_requeues={self.cfg.max_requeues}); not training. "
                "HINT: go on from the newest checkpoint with a larger budget: "
                f"`hpc-ddp resume {self.run_dir} "
                f"requeue.max_requeues={max(2 * self.cfg.max_requeues, self.restart + 1)}`."
            )
            log.error(message)
            self._end(EndCause.BUDGET_EXHAUSTED, resumed_from_step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE, message)
        return None

    def _ask_scheduler(self) -> tuple[JobStanding | None, str]:
        """``scontrol show job`` of this job: (its standing, "") or (None, why it failed)."""
        assert self.dist.job_ref is not None
        try:
            return self.allocation.standing(self.dist.job_ref), ""
        except BackendError as exc:
            log.warning("could not ask Slurm about job %s: %s", self.dist.job_ref, exc)
            return None, backend_failure_summary(exc)

    def stop(
        self,
        signum: int,
        *,
        step: int | None,
        checkpoint: str | None,
        verdict: StopVerdict | None = None,
    ) -> StopOutcome:
        """Handle an agreed stop on rank 0 (other ranks get a neutral outcome). ``step`` None:
        a ``command`` program without a session, which keeps its own snapshot. ``verdict``:
        :meth:`verdict`'s, when the caller asked already."""
        if not self.dist.is_main:
            return StopOutcome(EndCause.UNKNOWN, False, 0, "")
        if verdict is None:
            verdict = self.verdict(signum)
        return self._act(verdict, step=step, checkpoint=checkpoint)

    def verdict(self, signum: int) -> StopVerdict:
        """Why a stop for ``signum`` came, as Slurm's answer (or the signal alone) says."""
        requeue_signum = signal_number(self.cfg.signal)
        standing, error = self._ask_scheduler() if self.scheduled else (None, "")
        if self.scheduled and standing is None:
            # Never read "Slurm did not answer" as "Slurm is requeueing it" (see preemption).
            verdict = classify_unanswered_stop(signum, requeue_signum=requeue_signum, error=error)
        else:
            verdict = classify_stop(
                signum,
                requeue_signum=requeue_signum,
                restart_count=self.restart,
                job=standing,
                lost_nodes=self._lost_nodes(standing),
            )
        return verdict

    def _lost_nodes(self, standing: JobStanding | None) -> list[str]:
        """The job's nodes Slurm holds down, asked only when Slurm requeued the job by itself
        (without a preemption): a node failure's requeue looks like a person's otherwise."""
        if standing is None or (standing.restarts or 0) <= self.restart:
            return []
        if standing.preempting:
            return []
        nodes = standing.nodes or self.dist.nodelist
        try:
            down = self.allocation.down(nodes) if nodes else {}
        except (BackendError, DistEnvError) as exc:
            log.warning("could not ask Slurm about the job's nodes: %s", exc)
            return []
        return list(down)

    def _decide(self, cause: EndCause, *, own_snapshots: bool = False) -> RequeueDecision:
        return decide_requeue(
            cause,
            self.restart,
            self.cfg.max_requeues,
            self.cfg.on_crash,
            self.run_dir,
            own_snapshots=own_snapshots,
        )

    def _act(
        self, verdict: StopVerdict, *, step: int | None, checkpoint: str | None
    ) -> StopOutcome:
        decision = self._decide(verdict.cause, own_snapshots=step is None)
        if verdict.request_requeue and not decision.requeue:
            message = f"{verdict.cause.value}: {decision.reason}"  # the reason names the budget
            log.error("%s", message)
            self._end(EndCause.BUDGET_EXHAUSTED, step, checkpoint, False, message)
            return StopOutcome(EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE, message)
        requested = False
        if verdict.request_requeue and self.scheduled:
            error = self._request_requeue()
            if error is None:
                requested = True
            else:
                after = self._after_refusal(error)
                if after is None:
                    return self._requeue_failed(verdict, error, step, checkpoint)
                verdict = after
                decision = self._decide(verdict.cause, own_snapshots=step is None)
        if not verdict.slurm_answered and not requested:
            return self._unconfirmed(verdict, step, checkpoint)
        reason = decision.reason
        if verdict.request_requeue and not self.scheduled:
            reason = outside_slurm_message(self.run_dir)
        message = f"{verdict.cause.value}: {verdict.explanation}; {reason}"
        log.info("stopping at step %s: %s", step, message)
        self._end(verdict.cause, step, checkpoint, requested, message)
        return StopOutcome(verdict.cause, requested, 0, message)

    def _request_requeue(self) -> str | None:
        """``scontrol requeue`` this job: None when Slurm accepted, else what went wrong."""
        assert self.dist.job_ref is not None
        try:
            self.allocation.requeue(self.dist.job_ref)
        except BackendError as exc:
            log.warning("scontrol requeue %s failed: %s", self.dist.job_ref, exc)
            return backend_failure_summary(exc)
        log.info("asked Slurm to requeue job %s", self.dist.job_ref)
        return None

    def _after_refusal(self, error: str) -> StopVerdict | None:
        """Why Slurm refused a requeue, when its answer shows a reason; None: the request failed.

        Slurm may have won a race (the preemption's grace ran out, someone requeued or
        cancelled the job by hand meanwhile): only a ``Restarts`` count that went up, or a
        cancellation, in Slurm's own answer says so. No answer proves nothing.
        """
        standing, _ = self._ask_scheduler()
        if standing is None:
            return None
        verdict = classify_stop(
            int(signal.SIGTERM),
            requeue_signum=signal_number(self.cfg.signal),
            restart_count=self.restart,
            job=standing,
        )
        if verdict.request_requeue:  # still running and not being requeued: it just failed
            return None
        log.info("Slurm refused the requeue of %s: %s", self.dist.job_ref, verdict.explanation)
        return StopVerdict(
            verdict.cause, False, f"{verdict.explanation} (scontrol requeue said: {error})"
        )

    def _requeue_failed(
        self, verdict: StopVerdict, error: str, step: int | None, checkpoint: str | None
    ) -> StopOutcome:
        """A requeue was needed and could not be had: the job must end FAILED, and say so."""
        message = requeue_failed_message(
            self.dist.job_ref, verdict, error, step, checkpoint, REQUEUE_FAILED_EXIT_CODE,
            self.run_dir,
        )  # fmt: skip
        log.error("%s", message)
        self._end(EndCause.REQUEUE_FAILED, step, checkpoint, False, message)
        return StopOutcome(EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE, message)

    def _unconfirmed(
        self, verdict: StopVerdict, step: int | None, checkpoint: str | None
    ) -> StopOutcome:
        """A stop Slurm could not be asked about and no requeue was asked for: exit non-zero."""
        message = unconfirmed_message(
            self.dist.job_ref, verdict, step, checkpoint, REQUEUE_FAILED_EXIT_CODE,
            self.run_dir,
        )  # fmt: skip
        log.error("%s", message)
        self._end(verdict.cause, step, checkpoint, False, message)
        return StopOutcome(verdict.cause, False, REQUEUE_FAILED_EXIT_CODE, message)

    def finish(
        self, *, step: int | None, checkpoint: str | None, message: str = "training finished"
    ) -> None:
        """Record a normal end of training (rank 0)."""
        if self.dist.is_main:
            self._end(EndCause.FINISHED, step, checkpoint, False, message)

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
        if not self.dist.is_main:
            # Only rank 0 writes, and its session waits for its save in flight as it closes;
            # another rank knows only what rank 0 was asked to write.
            checkpoint = self._on_disk(checkpoint)
        message = f"rank {self.dist.rank} on {where}: {what}"
        log.error("crash: %s", message)
        if self.dist.supervised:
            # The supervisor weighs every rank's word and decides (restart, requeue, stop);
            # a survivor's lost connection is only a witness's word, never a second blame.
            witness = PEER_ERROR.search(what) is not None
            self._end(EndCause.CRASH, step, checkpoint, False, message, witness=witness)
            return
        decision = self._decide(EndCause.CRASH)
        if not (decision.requeue and self.scheduled):
            why = outside_slurm_message(self.run_dir) if decision.requeue else decision.reason
            self._end(EndCause.CRASH, step, checkpoint, False, f"{message}; {why}")
            return
        claims = self.ledger.parent / "rendezvous"
        if not claimed and not claim_crash_requeue(claims, self.dist.job_id, self.dist.attempt_key):
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

    def fault(self, record: FaultRecord, *, step: int | None, checkpoint: str | None) -> None:
        """Record a fault this rank's watchdog declared (the first end of an attempt wins).
        The process ends without waiting for a save in flight: only one on disk is named."""
        cause = fault_cause(record.kind)
        where = ", ".join(f"rank {r}" for r in record.ranks) or "no rank"
        nodes = f" on {','.join(record.nodes)}" if record.nodes else ""
        message = f"{cause.value}: {where}{nodes}: {record.why} (declared by {record.by})"
        self._end(cause, step, self._on_disk(checkpoint), False, message)

    def _on_disk(self, checkpoint: str | None) -> str | None:
        """``checkpoint`` if it is on disk, else the newest one on disk before it: a failed
        attempt names what it can resume from, never a save still in flight when it failed
        (a hung or interrupted write)."""
        if checkpoint is None:
            return None
        return checkpoint_on_disk(RunPaths(self.ledger.parent).checkpoints, checkpoint)

    def record_checkpoint(
        self,
        step: int,
        stall_s: float,
        *,
        durable_s: float | None = None,
        auto: AutoInterval | None = None,
        now: float | None = None,
    ) -> None:
        """Rank 0 notes a save at ``now`` (default: now), how long training waited for it and
        how long it took to be durable (for the goodput account and the auto interval), and
        the auto interval in force. Thread-safe: the checkpoint writer calls it."""
        if not self.dist.is_main:
            return
        self._append(
            checkpoint_event(
                launch_id=self.launch_id,
                step=step,
                stall_s=stall_s,
                durable_s=durable_s,
                auto=auto,
                now=now,
            )
        )

    def record_stop_save(self, step: int) -> None:
        """Rank 0: an agreed stop begins saving ``step`` (its ``checkpoint`` line follows once
        durable; without one, the next attempt finds the save lost)."""
        if not self.dist.is_main:
            return
        self._append(
            stop_save_event(
                launch_id=self.launch_id,
                step=step,
                lead_time_s=self.cfg.lead_s,
            )
        )

    def record_rescue(
        self,
        *,
        step: int | None,
        checkpoint: str | None,
        why: str | None,
        took_s: float,
        now: float | None = None,
    ) -> None:
        """The survivor's save after the launch's fault (:mod:`hpc_ddp.fault.rescue`), from the
        rank that wrote it, or tried to: any rank, on the watchdog's thread."""
        self._append(
            rescue_event(
                launch_id=self.launch_id,
                rank=self.dist.rank,
                step=step,
                checkpoint=checkpoint,
                why=why,
                took_s=took_s,
                now=now,
            )
        )

    def _end(
        self,
        cause: EndCause,
        step: int | None,
        checkpoint: str | None,
        requested: bool,
        msg: str,
        *,
        witness: bool = False,
    ) -> None:
        if self._ended:
            return
        self._ended = True
        self._append(
            end_event(
                attempt=self.number(),
                launch_id=self.launch_id,
                cause=cause,
                steps_done=step,
                checkpoint=checkpoint,
                requeue_requested=requested,
                message=msg,
                witness=witness,
            )
        )

    def write_start(
        self,
        *,
        resumed_from_step: int | None,
        checkpoint: str | None,
        now: float | None = None,
        grad_accum: int | None = None,
        resize: Resize | None = None,
    ) -> None:
        """Append this attempt's ``attempt_start`` to the ledger (no budget check), with the
        run's next attempt number. ``now``: when the attempt started (default: now). First,
        an earlier attempt's stop whose save the kill beat is recorded (its ranks died with the
        save: only a later reader can say so)."""
        attempts = self._attempts()
        for line in lost_stop_lines(attempts, found_by="attempt", now=time.time()):
            log.warning("the last stop's save was lost: %s", line.strip())
            self._append(line)
        self._number = len(attempts)
        self._append(
            start_event(
                attempt=self._number,
                launch_id=self.launch_id,
                now=now,
                nodelist=",".join(self.dist.nodelist),
                world_size=self.dist.world_size,
                resumed_from_step=resumed_from_step,
                checkpoint=checkpoint,
                grad_accum=grad_accum,
                resize=resize,
            )
        )

    def _append(self, line: str) -> None:
        self.ledger.parent.mkdir(parents=True, exist_ok=True)
        append_line(self.ledger, line)
