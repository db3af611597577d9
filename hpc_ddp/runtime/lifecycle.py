"""How a session's attempt begins and ends: its phases, the exit it leaves with (collective).

:class:`~hpc_ddp.runtime.session.Session` moves through :class:`Phase`; the two collective
moments that talk to the :class:`~hpc_ddp.runtime.requeue.Coordinator` (rank 0 decides, every
rank learns the decision by broadcast) are :func:`begin_attempt` and :func:`end_attempt`.
"""

from __future__ import annotations

import enum

from hpc_ddp.runtime.checkpointer import broadcast_object
from hpc_ddp.runtime.requeue import Coordinator

REQUEUE_EXIT_CODE = 0


class RequeueExit(SystemExit):
    """Raised on every rank once a stop is handled: checkpoint durable, process group gone.

    Exit status 0 (:data:`REQUEUE_EXIT_CODE`): the process ended on purpose and nothing was
    lost. A run that will not come back exits non-zero, so Slurm records it FAILED, never
    COMPLETED with training unfinished: :data:`hpc_ddp.runtime.requeue.BUDGET_EXIT_CODE` when its
    requeue budget ran out,
    :data:`hpc_ddp.runtime.requeue.REQUEUE_FAILED_EXIT_CODE` when the requeue
    request failed (or Slurm could not be asked whether it is requeueing the job).
    ``signal`` is the agreed stop signal (None for a requeue asked for from code) and
    ``requeued`` whether this process asked Slurm to requeue the job.
    """

    def __init__(self, signum: int | None, requeued: bool, code: int = REQUEUE_EXIT_CODE) -> None:
        super().__init__(code)
        self.signal = signum
        self.requeued = requeued


class Phase(enum.Enum):
    """Where a :class:`Session` is in its life; it only ever moves down this list."""

    NEW = "new"
    """Constructed; :meth:`Session.start` not called yet."""
    STARTED = "started"
    """Process group joined and stop signals caught; the attempt's start not in the ledger yet."""
    TRAINING = "training"
    """The attempt's start is in the ledger (written by ``restore`` or the first step)."""
    STOPPING = "stopping"
    """A stop is being handled (``requeue``, or an attempt past the budget): no second one."""
    CLOSED = "closed"
    """Process group left; nothing collective works any more."""


def begin_attempt(coordinator: Coordinator, step: int, checkpoint: str | None) -> int | None:
    """Rank 0 writes the attempt's start; every rank gets the exit code of an attempt past the
    budget (it must end at once), else None."""
    outcome = coordinator.begin(
        resumed_from_step=step if checkpoint else None, checkpoint=checkpoint
    )
    code: int | None = broadcast_object(None if outcome is None else outcome.exit_code)
    return code


def end_attempt(
    coordinator: Coordinator, signum: int, step: int, checkpoint: str | None
) -> tuple[bool, int]:
    """Rank 0 handles the agreed stop (ledger, requeue); every rank gets (requeue asked, exit
    code)."""
    outcome = None
    if coordinator.dist.is_main:
        outcome = coordinator.stop(signum, step=step, checkpoint=checkpoint)
    asked, code = broadcast_object(
        (False, 0) if outcome is None else (outcome.requeue_requested, outcome.exit_code)
    )
    return bool(asked), int(code)
