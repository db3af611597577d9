"""The stop flag: signals are only recorded; ranks agree on them at a step boundary.

A signal handler that logs, writes a checkpoint or calls a collective can deadlock: a rank may
be blocked inside an all-reduce when its signal arrives, and a peer that took the same signal
earlier is already waiting in a different collective (Lightning hangs exactly there). So the
handlers here only store a number. The training loop calls :meth:`StopFlag.agree` between
steps; one MAX all-reduce of a single integer tells every rank whether *any* rank was
signalled, so all of them stop after the same step.

When several ranks saw different signals, the most final one wins: SIGTERM (Slurm is ending the
job, perhaps a cancel) over SIGINT (a person at a terminal) over the requeue signal (a warning
ahead of the time limit).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

_PRIORITY = {signal.SIGTERM: 3, signal.SIGINT: 2}
_Handler = Callable[[int, FrameType | None], Any] | int | None


def encode(signum: int) -> int:
    """The value a rank contributes to the agreement: priority in the high bits, signal below."""
    return _PRIORITY.get(signal.Signals(signum), 1) << 8 | signum


def decode(code: int) -> int | None:
    """Inverse of :func:`encode`; 0 (no rank was signalled) is None."""
    return code & 0xFF or None


class StopFlag:
    """Records stop signals and lets all ranks agree on them.

    ``signals`` are the signals to catch (e.g. USR2 and TERM; INT for runs at a terminal).
    Use as a context manager or call :meth:`install` and :meth:`close` from the main thread.
    A second SIGINT raises :class:`KeyboardInterrupt`, as Python's own handler does, so a local
    run that is stuck can still be interrupted from the keyboard.
    """

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = tuple(dict.fromkeys(int(s) for s in signals))
        self._code = 0
        self._interrupts = 0
        self._agreed: int | None = None
        self._previous: dict[int, _Handler] = {}

    # --- handlers: record only ----------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self._code = max(self._code, encode(signum))
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                raise KeyboardInterrupt

    def install(self) -> StopFlag:
        """Install the handlers, remembering the ones they replace."""
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "stop signals are not caught: the session was not started on the main thread"
            )
            return self
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def close(self) -> None:
        """Put the previous handlers back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state ----------------------------------------------------------------------------

    @property
    def received(self) -> int | None:
        """The signal this process recorded (the most final one), or None."""
        return decode(self._code)

    @property
    def agreed(self) -> int | None:
        """The signal all ranks agreed on at the last :meth:`agree`, or None."""
        return self._agreed

    def request(self, signum: int) -> None:
        """Record ``signum`` as if it had arrived (a stop asked for from code)."""
        self._code = max(self._code, encode(signum))

    def agree(self, device: torch.device | str = "cpu", group: Any = None) -> int | None:
        """Collective, at a step boundary on every rank: the signal any rank saw, or None.

        Once a stop is agreed the answer is kept and no further collective is made, which every
        rank then knows as well.
        """
        if self._agreed is not None:
            return self._agreed
        code = self._code
        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([code], dtype=torch.int64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            code = int(t.item())
        self._agreed = decode(code)
        return self._agreed
