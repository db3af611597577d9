"""Why an attempt ended (:class:`EndCause`), and what each cause means, in one table. Pure.

The ledger records a cause for every attempt's end. What follows from it is read here, never
from a set of causes kept elsewhere: whether it is a fault (the supervisor blamed someone),
whether the supervisor restarts it within the allocation, whether a requeue follows it, whether
it ends the run in failure, the state word ``status`` shows for it without Slurm's word, and
where the goodput account puts the time it cost. A new cause is one member of :class:`EndCause`
and one row of :data:`END_CAUSES`; a test refuses a cause without a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import TypeGuard


class EndCause(str, Enum):
    """Why an attempt ended.

    Only ``time_limit``, ``preempted`` and ``manual_requeue`` are followed by another attempt
    (when ``requeue_requested`` is true, or Slurm was requeueing the job itself). The run is
    over, unfinished, after ``crash``, ``budget_exhausted``, ``requeue_failed`` (a requeue was
    needed and ``scontrol requeue`` failed: the job ends FAILED with the checkpoint kept) and
    ``cancelled``; after ``unknown`` it is over unless Slurm itself brings the job back.
    """

    FINISHED = "finished"
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    MANUAL_REQUEUE = "manual_requeue"
    CRASH = "crash"
    BUDGET_EXHAUSTED = "budget_exhausted"
    REQUEUE_FAILED = "requeue_failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    HANG = "hang"
    """A rank stopped beating or overran its phase's deadline; the step was ended."""
    NODE_FAIL = "node_fail"
    """A node of the step was lost (srun's ``Node failure``, the node down in Slurm)."""
    NO_PROGRESS = "no_progress"
    """A crash loop: launches kept ending in a fault without a newer checkpoint; stopped."""


class RequeueRule(str, Enum):
    """Whether an attempt that ended with a cause is requeued (``requeue:`` in the config)."""

    NEVER = "never"
    ON_CRASH = "on_crash"
    """Only with ``requeue.on_crash``, within ``requeue.max_requeues``."""
    WITHIN_BUDGET = "within_budget"
    """While fewer than ``requeue.max_requeues`` requeues were spent."""


class Bucket(str, Enum):
    """Where the goodput account puts a launch's time from its last progress to its end (the
    names of :data:`hpc_ddp.state.goodput.PARTS`)."""

    PRODUCTIVE = "productive"
    """Nothing was lost: it ended on purpose, its time is the training's."""
    RECOVERY = "recovery"
    """From the blamed ranks' last progress to the end: ending the step, the decision."""
    HANG_UNDETECTED = "hang_undetected"
    """From the last progress to the fault's detection (where the ledger knows it), then
    recovery to the end: a rank or node went quiet before anyone saw it."""


@dataclass(frozen=True)
class Meaning:
    """What one end cause means to each part of hpc-ddp that weighs it."""

    fault: bool
    """A fault ended it (the supervisor's verdict outranks a rank's own word on it)."""
    restartable: bool
    """The supervisor answers it with an in-job restart (within ``fault.max_restarts``); a
    run of such launches without a newer checkpoint is a crash loop."""
    requeue: RequeueRule
    failure: bool
    """It ends a run in failure by itself: the ledger says why, as a crash does."""
    signalled: bool
    """Slurm's stop signal ended it (a time limit, a preemption, a requeue): the ranks agreed
    to stop and saved, and the job goes on in a requeue."""
    status: str
    """The state the ledger alone suggests for a run it ended (in Slurm's words)."""
    goodput: Bucket


_C, _M = EndCause, Meaning
_NEVER, _ON_CRASH, _BUDGET = RequeueRule.NEVER, RequeueRule.ON_CRASH, RequeueRule.WITHIN_BUDGET
_OK, _RECOVERY, _HANG = Bucket.PRODUCTIVE, Bucket.RECOVERY, Bucket.HANG_UNDETECTED

END_CAUSES: Mapping[EndCause, Meaning] = MappingProxyType({
    #                      fault  restart requeue    failure signal status            goodput
    _C.FINISHED:         _M(False, False, _NEVER,    False, False, "FINISHED",         _OK),
    _C.TIME_LIMIT:       _M(False, False, _BUDGET,   False, True,  "TIME_LIMIT",       _OK),
    _C.PREEMPTED:        _M(False, False, _BUDGET,   False, True,  "PREEMPTED",        _OK),
    _C.MANUAL_REQUEUE:   _M(False, False, _BUDGET,   False, True,  "MANUAL_REQUEUE",   _OK),
    _C.CRASH:            _M(True,  True,  _ON_CRASH, True,  False, "FAILED",           _RECOVERY),
    _C.BUDGET_EXHAUSTED: _M(False, False, _NEVER,    False, False, "BUDGET_EXHAUSTED", _OK),
    _C.REQUEUE_FAILED:   _M(False, False, _NEVER,    False, False, "REQUEUE_FAILED",   _OK),
    _C.CANCELLED:        _M(False, False, _NEVER,    False, False, "CANCELLED",        _OK),
    _C.UNKNOWN:          _M(False, False, _NEVER,    False, False, "UNKNOWN",          _OK),
    _C.HANG:             _M(True,  True,  _ON_CRASH, True,  False, "FAILED",           _HANG),
    _C.NODE_FAIL:        _M(True,  True,  _BUDGET,   True,  False, "NODE_FAIL",        _HANG),
    _C.NO_PROGRESS:      _M(True,  False, _NEVER,    True,  False, "FAILED",           _RECOVERY),
})  # fmt: skip
"""Every :class:`EndCause` and what it means. A lost node is requeued whatever
``requeue.on_crash`` says (the program was not at fault); a crash loop (``no_progress``) is a
fault and a failure, but neither restarted nor requeued: it already was, in vain."""


def meaning(cause: EndCause) -> Meaning:
    """The row of ``cause`` in :data:`END_CAUSES`."""
    return END_CAUSES[cause]


def is_fault(cause: EndCause | None) -> TypeGuard[EndCause]:
    """A fault ended it (None, no end recorded: not yet)."""
    return cause is not None and END_CAUSES[cause].fault


def is_restartable(cause: EndCause | None) -> TypeGuard[EndCause]:
    """The supervisor restarts a launch that ended so, within the allocation."""
    return cause is not None and END_CAUSES[cause].restartable


def is_failure(cause: EndCause | None) -> TypeGuard[EndCause]:
    """It ends a run in failure by itself."""
    return cause is not None and END_CAUSES[cause].failure


__all__ = [
    "END_CAUSES",
    "Bucket",
    "EndCause",
    "Meaning",
    "RequeueRule",
    "is_failure",
    "is_fault",
    "is_restartable",
    "meaning",
]
