"""What the processes a rank starts do with Slurm's stop signals.

Slurm does not signal one process of a step: ``--signal=USR2@lead`` (no ``B:``), ``scancel
--signal`` and the SIGTERM of a cancel, a preemption or a time limit reach *every* process of
the step: a ``command:`` program, ``torchrun`` and its workers, each DataLoader worker. The
default action of USR1/USR2 and of SIGTERM ends a process, so without care one warning kills
a whole tree that was meant to stop at an agreed step and save:

- a ``command:`` child is started with the requeue signal ignored (:func:`start_ignoring`).
  An ignored signal stays ignored across ``fork`` and ``exec``, so a program without a
  session, ``torchrun`` and torchrun's workers all live through the warning; ``hpc-ddp run``
  above them turns it into the SIGTERM such programs expect. A session (or the user's own
  handler) installs a handler again, and so hears it.
- a DataLoader worker started with :func:`data_worker_init` ignores the warning (a forked
  worker would run the rank's handler harmlessly, but ``spawn`` and ``forkserver`` reset
  handled signals to the default), and hears SIGTERM and SIGINT on a thread of its own: it
  ends only for a SIGTERM from its owner (``Process.terminate``: the DataLoader shutting it
  down). It cannot simply ignore SIGTERM: ``multiprocessing`` ends workers with it, and one
  that never dies of it hangs the interpreter's exit. Slurm's SIGTERM to every process is left
  to the rank, which stops at an agreed step, saves, and ends its workers itself.
  :func:`blocked_while_starting` closes the window between a worker's start and its
  ``worker_init_fn`` (a blocked signal is inherited by a forked child, and the warning's
  block by a spawned one too).

The rank's own main thread never keeps a stop signal blocked: a signal it sends itself must
reach its handler at once, as it does in every plain Python program.

Nothing here imports torch: ``hpc-ddp run`` uses it before (or without) torch.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

_WORKER_STOPS = frozenset({signal.SIGTERM, signal.SIGINT})
"""What a data worker leaves to its rank: SIGTERM (cancel, preemption, time limit, a requeue)
and SIGINT (Ctrl-C reaches the whole foreground process group)."""
_WARNINGS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
"""The requeue signals ``requeue.signal`` may name: a worker has no use for either."""


def start_ignoring(signum: int, argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)`` with ``signum`` ignored in the child (and in
    everything it starts, until one of them handles it).

    The disposition is set to ``SIG_IGN`` around the ``fork`` only: this process's own handler
    is put back at once (a signal in that moment is not heard here; the caller installs its
    handlers right after, before anything slow)."""
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        return subprocess.Popen(argv, **popen)
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def blocked_while_starting() -> Iterator[None]:
    """Block the stop signals in the calling thread while it starts worker processes: a
    worker begins with them blocked, until its :func:`data_worker_init` takes them over. A
    signal for this process meanwhile waits (or is taken by another of its threads)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_STOPS | _WARNINGS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def data_worker_init(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` that keeps the worker alive through Slurm's stop
    signals: the requeue warning (USR1, USR2) is ignored; SIGTERM and SIGINT are taken by a
    thread of the worker's, which ends the worker only for a SIGTERM from its owner (the
    DataLoader shutting it down). The rank hears the stop itself, finishes the step, saves,
    and ends its workers.

    ``hpc_ddp.session().loader`` uses it; pass it to a DataLoader of your own
    (``worker_init_fn=hpc_ddp.data_worker_init``), or call it first in your own
    ``worker_init_fn``. With the ``fork`` start method (Linux's default) a worker created inside
    a session is covered from its first instruction; with ``spawn`` or ``forkserver`` only from
    this call on.
    """
    del worker_id
    for warning in _WARNINGS:
        signal.signal(warning, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WARNINGS)  # pending ones are dropped now
    signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_STOPS)
    # The process that owns the worker: its parent, except under forkserver, whose workers are
    # the server's children but are ended by the rank that asked for them.
    owner = multiprocessing.parent_process()
    owners = frozenset({os.getppid(), *([owner.pid] if owner and owner.pid else [])})
    threading.Thread(
        target=_end_on_owners_term, args=(owners,), name="hpc-ddp-worker-signals", daemon=True
    ).start()


def _end_on_owners_term(owners: frozenset[int]) -> None:
    while True:
        info = signal.sigwaitinfo(_WORKER_STOPS)
        if info.si_signo == signal.SIGTERM and info.si_pid in owners:
            # Its owner ends it (shutting the DataLoader down): quietly, as a finished worker,
            # so that the SIGCHLD handler torch installs in the owner reports no failure.
            os._exit(0)
