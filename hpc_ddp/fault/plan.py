"""What follows a launch that failed: restart, requeue or stop. Pure.

The supervisor (:mod:`hpc_ddp.fault.supervisor`) runs each attempt as launches and, when one
fails, names whom to blame (:func:`~hpc_ddp.fault.blame.assign_blame`); what it does next is
decided here, from the finding, the submission's launches so far (the ledger) and its budget:

- :func:`decide_next`: restart in the same allocation from the newest checkpoint, on healthy
  nodes (``slurm.spare_nodes``), within ``fault.max_restarts``; requeue through Slurm, asking
  it to avoid the bad nodes, when too few healthy nodes are left (or, past the restart budget,
  with ``requeue.on_crash``); or stop: ``no_progress`` after ``fault.no_progress_limit``
  launches in a row that died without a newer checkpoint (:func:`no_progress_streak`);
- :func:`exclusion`: which nodes a fault makes bad for the rest of the submission, and
  :func:`likely_exclusion`: the same, guessed from the fault alone when it is found (the next
  launch's processes start while the failed one is ended);
- :func:`decide_refused`: what follows a step srun could not start at all;
- :func:`with_own_words`, :func:`with_scheduler_words`, :func:`with_detected_at`: a finding
  with better evidence (the rank's own words, the scheduler's) or the time it was detected;
- :func:`ended_on_purpose`: whether a launch ended without a fault (finished, an agreed stop),
  so the job ends with the ranks' own exit status.

Nothing here runs a command, reads the environment or writes a file: every fact (the nodes,
the checkpoints on disk, Slurm's restart count) comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from hpc_ddp.config.model import FaultConfig, RequeueConfig
from hpc_ddp.exitcodes import NO_PROGRESS_EXIT_CODE, NOT_CURRENT_EXIT_CODE, OWN_OUTCOMES
from hpc_ddp.fault.blame import FaultRecord, Finding, fault_cause
from hpc_ddp.rundir.attempt import Attempt, Blame
from hpc_ddp.rundir.endcause import EndCause, is_restartable


@dataclass(frozen=True)
class Restart:
    """Launch again in this allocation, leaving out ``exclude``."""

    word: ClassVar[str] = "restart"
    """What the ledger's ``launch_end`` says came next."""
    exclude: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class Requeue:
    """Give the allocation back: Slurm queues the job again, avoiding ``exclude``."""

    word: ClassVar[str] = "requeue"
    cause: EndCause
    exclude: tuple[str, ...]
    message: str


@dataclass(frozen=True)
class Stop:
    """End the job with ``exit_code``."""

    word: ClassVar[str] = "stop"
    cause: EndCause
    exit_code: int
    message: str


Next = Restart | Requeue | Stop


def started_from(a: Attempt) -> int | None:
    """The newest checkpoint step a launch had when it began: the newer of the one on disk
    when the supervisor relaunched (``from_step``) and the one its ranks resumed from
    (``resumed_from_step``, their own word). They differ when a checkpoint was committed
    after the supervisor looked (a straggler of the launch before), or when the ranks'
    full check passed the newest over for an older one; either way only a checkpoint newer
    than both is one the launch made."""
    steps = [s for s in (a.from_step, a.resumed_from_step) if s is not None]
    return max(steps) if steps else None


def no_progress_streak(history: Sequence[Attempt]) -> list[Attempt]:
    """The launches at the end of ``history`` that, one after another, ended in a fault
    (crash, hang, lost node) with no checkpoint newer than the one they started from
    (:func:`started_from`)."""
    streak: list[Attempt] = []
    for a in reversed(history):
        if not is_restartable(a.cause):
            break
        began = started_from(a)
        start = began if began is not None else -1
        end = a.checkpoint_step if a.checkpoint_step is not None else -1
        if end > start:
            break
        streak.append(a)
    return list(reversed(streak))


def restarts_used(history: Sequence[Attempt], restart: int | None = None) -> int:
    """In-job restarts (``launch_end`` said ``restart``) in the allocation of Slurm's restart
    count ``restart`` (None: the whole submission). Each requeue's allocation gets the budget
    anew: a long run that makes progress between faults must not spend it for good (a crash
    loop is ``fault.no_progress_limit``'s, and requeues are ``requeue.max_requeues``')."""
    return sum(1 for a in history if a.next == "restart" and restart in (None, a.restart))


def exclusion(
    finding: Finding,
    *,
    own_error: bool,
    spare: bool,
    previous: Blame | None,
    enabled: bool,
    launch_nodes: int = 0,
) -> tuple[str, ...]:
    """The nodes a fault makes bad for the rest of the submission.

    A lost node, a hardware error, or a node blamed in the previous launch too: always (with
    ``fault.exclude_bad_nodes``). A rank that hung or died on a node while a spare node is
    free (``spare``): that node, since leaving it out costs nothing. A Python exception
    (``own_error``: the program's own fault) never, nor a fault that blamed every one of the
    launch's ``launch_nodes`` alike ("no rank stands out": it singles no node out). Otherwise
    the launch is retried in place: without spares, leaving a node out would mean giving the
    whole allocation back.
    """
    blame = finding.blame
    if not enabled or not blame.nodes:
        return ()
    if blame.node_level or finding.cause is EndCause.NODE_FAIL:
        return blame.nodes
    if own_error and finding.cause is EndCause.CRASH:
        return ()
    if launch_nodes and len(set(blame.nodes)) >= launch_nodes:
        return ()
    again = tuple(n for n in blame.nodes if previous is not None and n in previous.nodes)
    if again:
        return again
    return blame.nodes if spare else ()


def spare_free(
    alloc: Sequence[str], bad: Iterable[str], blamed: Sequence[str], launch_nodes: int
) -> bool:
    """Whether the allocation ``alloc`` still holds ``launch_nodes`` healthy nodes once the
    ``blamed`` ones are left out too: leaving them out then costs nothing (:func:`exclusion`)."""
    out = set(bad)
    return len([n for n in alloc if n not in out]) - len(blamed) >= launch_nodes


def likely_exclusion(
    fault: FaultRecord,
    *,
    spare: bool,
    previous: Blame | None,
    enabled: bool,
    launch_nodes: int = 0,
) -> tuple[str, ...]:
    """What :func:`exclusion` will most likely say once the launch ``fault`` was found in has
    ended, guessed from the declared fault alone: its ranks and nodes, and a crash or an early
    exit taken as the program's own error. The supervisor starts the next launch's processes
    on it while the failed launch is still being ended and saved; a wrong guess only costs a
    cold start (:meth:`~hpc_ddp.fault.standby.Standby.prepare`)."""
    blame = Blame(
        fault.ranks, fault.nodes, fault.why, fault.node_level, fault.time, fault.last_progress
    )
    return exclusion(
        Finding(fault_cause(fault.kind), blame),
        own_error=fault.kind in ("crash", "early_exit"),
        spare=spare,
        previous=previous,
        enabled=enabled,
        launch_nodes=launch_nodes,
    )


@dataclass(frozen=True)
class Budget:
    """What the submission may still spend."""

    fault: FaultConfig
    requeue: RequeueConfig
    restart_count: int
    """Slurm's restart count of this attempt (what ``requeue.max_requeues`` counts)."""
    scheduled: bool
    """The run is a scheduler's job, which a requeue can start again (not a local run)."""


def no_progress_message(streak: Sequence[Attempt], limit: int, run_dir: str) -> str:
    """The ``no_progress`` verdict: the error, the step it dies at, what to do."""
    last = streak[-1]
    steps = sorted({a.steps_done for a in streak if a.steps_done is not None})
    at = f"at step {steps[-1]}" if len(steps) == 1 else f"at steps {', '.join(map(str, steps))}"
    ckpt = started_from(last)
    since = f"a checkpoint newer than step {ckpt}" if ckpt is not None else "any checkpoint"
    who = last.blame.describe() if last.blame is not None else (last.message or "no word")
    log_hint = (
        f"logs/rank-{last.blame.ranks[0]}.err" if last.blame and last.blame.ranks else "logs/"
    )
    resume_from = f"from step {ckpt}" if ckpt is not None else "from the start"
    return (
        f"no_progress: {len(streak)} launches in a row died {at} without {since} "
        f"(fault.no_progress_limit={limit}); last error: {who}. HINT: fix the error "
        f"({log_hint}), then `hpc-ddp resume {run_dir}` goes on {resume_from}."
    )


def decide_next(
    finding: Finding,
    history: Sequence[Attempt],
    *,
    healthy: int,
    needed: int,
    bad: Sequence[str],
    budget: Budget,
    run_dir: str,
) -> Next:
    """What follows a launch that ended in ``finding`` (pure). ``history``: the submission's
    launches, this one last (with its ``from_step``/``checkpoint_step``); ``healthy``: usable
    nodes of the allocation once ``bad`` are left out; ``needed``: nodes a launch uses."""
    f, rq = budget.fault, budget.requeue
    what = f"{finding.cause.value}: {finding.blame.describe()}"
    streak = no_progress_streak(history)
    if f.no_progress_limit and len(streak) >= f.no_progress_limit:
        message = no_progress_message(streak, f.no_progress_limit, run_dir)
        return Stop(EndCause.NO_PROGRESS, NO_PROGRESS_EXIT_CODE, message)
    requeues_left = budget.scheduled and budget.restart_count < rq.max_requeues
    if healthy < needed:
        why = (
            f"{what}; {healthy} healthy node(s) left of the {needed} a launch needs "
            f"(bad: {', '.join(bad) or 'none'})"
        )
        if requeues_left:
            return Requeue(
                EndCause.NODE_FAIL,
                tuple(bad),
                f"{why}; requeued, asking Slurm to avoid {', '.join(bad) or 'no node'} "
                f"(requeue {budget.restart_count + 1} of {rq.max_requeues})",
            )
        return Stop(finding.cause, 1, f"{why}; no requeue left. HINT: `hpc-ddp resume {run_dir}`")
    used = restarts_used(history[:-1], history[-1].restart if history else None)
    if used < f.max_restarts:
        where = f" without {', '.join(bad)}" if bad else ""
        return Restart(
            tuple(bad),
            f"{what}; restart {used + 1} of {f.max_restarts} (fault.max_restarts) in this "
            f"allocation{where}, from the newest checkpoint",
        )
    spent = f"{what}; fault.max_restarts={f.max_restarts} in-job restarts spent"
    if rq.on_crash and requeues_left:
        return Requeue(
            finding.cause,
            tuple(bad),
            f"{spent}; requeue.on_crash: requeue {budget.restart_count + 1} of {rq.max_requeues}",
        )
    return Stop(
        finding.cause,
        1,
        f"{spent}. HINT: fix the error in the rank logs, then `hpc-ddp resume {run_dir}` goes "
        "on from the newest checkpoint; or raise fault.max_restarts, or set "
        "requeue.on_crash=true to requeue after the in-job restarts.",
    )


def with_own_words(finding: Finding, entry: Attempt | None) -> Finding:
    """A crash blamed on the rank that recorded it (a ``command:`` child's exception, seen by
    srun only as an exit code): its own words are the better evidence."""
    blame = finding.blame
    said = entry.message if entry is not None else None
    if finding.cause is not EndCause.CRASH or len(blame.ranks) != 1 or not said:
        return finding
    prefix = f"rank {blame.ranks[0]} on "
    if not said.startswith(prefix) or ": " not in said:
        return finding
    words = said.split(": ", 1)[1]
    return Finding(
        finding.cause,
        Blame(blame.ranks, blame.nodes, words, blame.node_level, blame.detected_at,
              blame.last_progress_at),
    )  # fmt: skip


def with_scheduler_words(finding: Finding, down: Mapping[str, str]) -> Finding:
    """A finding whose blamed nodes the scheduler says are down (``down``: node -> its state,
    none when it says nothing): a lost node (``node_fail``), the scheduler's words added to the
    evidence."""
    if not down:
        return finding
    said = ", ".join(f"{n} is {s}" for n, s in down.items())
    blame = finding.blame
    return Finding(
        EndCause.NODE_FAIL,
        Blame(blame.ranks, blame.nodes, f"{blame.evidence}; Slurm: {said}", True,
              blame.detected_at, blame.last_progress_at),
    )  # fmt: skip


def with_detected_at(finding: Finding, detected: float | None) -> Finding:
    """The finding with ``detected`` as the time its fault was detected."""
    blame = finding.blame
    return Finding(
        finding.cause,
        Blame(blame.ranks, blame.nodes, blame.evidence, blame.node_level, detected,
              blame.last_progress_at),
    )  # fmt: skip


def decide_refused(
    why: str, bad: Sequence[str], *, scheduled: bool, requeues_left: bool, now: float
) -> tuple[Requeue | Stop, Blame]:
    """What follows a step srun could not create (``why``: its words), and the blame: too few
    usable nodes left means a requeue avoiding ``bad`` (under Slurm, with requeues left);
    anything else ends the job."""
    blame = Blame((), tuple(bad), f"srun could not start the step: {why}", True, now)
    too_few = "node configuration is not available" in why
    if too_few and scheduled and requeues_left:
        return Requeue(
            EndCause.NODE_FAIL, tuple(bad), f"node_fail: {blame.evidence}; requeued"
        ), blame
    return Stop(EndCause.CRASH, 1, f"crash: {blame.evidence}"), blame


def ended_on_purpose(code: int | None, entry: Attempt | None) -> bool:
    """A launch with no fault declared ended on purpose (the job ends with its ranks' status):
    its exit status is one of the ranks' own outcomes (finished, an agreed stop, not the run's
    current job), or its ledger entry ended with a cause the supervisor does not restart."""
    return (
        code in OWN_OUTCOMES
        or code == NOT_CURRENT_EXIT_CODE
        or (entry is not None and entry.cause is not None and not is_restartable(entry.cause))
    )


def recorded_cause(nxt: Next, finding: Finding) -> EndCause:
    """The cause the ledger records for a failed launch: the finding's, unless the decision
    was to stop a crash loop (``no_progress``)."""
    if isinstance(nxt, Stop) and nxt.cause is EndCause.NO_PROGRESS:
        return nxt.cause
    return finding.cause


__all__ = [
    "Budget",
    "Next",
    "Requeue",
    "Restart",
    "Stop",
    "decide_next",
    "decide_refused",
    "ended_on_purpose",
    "exclusion",
    "no_progress_message",
    "no_progress_streak",
    "recorded_cause",
    "restarts_used",
    "started_from",
    "with_detected_at",
    "with_own_words",
    "with_scheduler_words",
]
