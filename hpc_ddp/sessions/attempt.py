"""A session's attempt, as the ledger sees it: its start (rank 0 writes it; an attempt past the
requeue budget ends there) and its agreed stop (rank 0 records it and asks for the requeue),
each answered to every rank.
"""

from __future__ import annotations

import signal
import threading

from hpc_ddp.checkpoint.checkpointer import broadcast_object
from hpc_ddp.config.elastic import Resize
from hpc_ddp.fault.coordinator import Coordinator


def begin_attempt(
    coordinator: Coordinator,
    step: int,
    checkpoint: str | None,
    *,
    grad_accum: int | None = None,
    resize: Resize | None = None,
) -> int | None:
    """Rank 0 writes the attempt's start; every rank gets the exit code of an attempt past the
    budget (it must end at once), else None."""
    outcome = coordinator.begin(
        resumed_from_step=step if checkpoint else None,
        checkpoint=checkpoint,
        grad_accum=grad_accum,
        resize=resize,
    )
    code: int | None = broadcast_object(None if outcome is None else outcome.exit_code)
    return code


def let_data_workers_go() -> None:
    """From here on a data-loader worker that dies is no error in this process.

    Once rank 0 asks Slurm to requeue, Slurm SIGTERMs every process of the step, the
    data-loader workers too (even ``scontrol`` itself, before it returns), and torch's SIGCHLD
    handler would raise "DataLoader worker ... is killed by signal" in whatever the rank does
    next: asking Slurm what became of the request, writing the ledger, hearing rank 0's answer.
    A clean stop would be recorded as a crash. The attempt is over and no batch is wanted, so
    the default disposition comes back (not SIG_IGN, which would break ``waitpid``), and stays
    until the process is gone. Only the main thread may set a handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


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
