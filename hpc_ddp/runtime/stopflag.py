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

The all-reduce costs about a millisecond over gloo, which is a tenth of a small model's step.
:class:`AgreementCadence` therefore lets the step loop agree only every k steps, k chosen so
that the ranks still agree at least every :data:`AGREE_BUDGET_S` of training (a stop then
comes at most that much later, against a signal lead time of a minute or more). The ranks
choose k together, in the same all-reduce, so every rank agrees at the same steps.

On a GPU, reading an all-reduced flag right after launching it waits for every kernel queued
before it: the GPU then idles while the host queues the next step. The step loop therefore
reads each agreement one agreement later (:meth:`StopFlag.launch`, :meth:`StopFlag.collect`):
by then the all-reduce has long finished and the read waits for nothing. Every rank launches
and reads at the same steps, so all of them still stop after the same step, one agreement
interval later than a synchronous read would have.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from hpc_ddp.runtime.procgroup import collective_device

log = logging.getLogger(__name__)

_PRIORITY = {signal.SIGTERM: 3, signal.SIGINT: 2}
_Handler = Callable[[int, FrameType | None], Any] | int | None


AGREE_BUDGET_S = 0.1
"""The longest stretch of training between two agreements of the step loop."""
MAX_AGREE_EVERY = 1000


class AgreementCadence:
    """Which step boundaries the step loop agrees at: every step while steps are slow, every k
    steps when an all-reduce per step would be a noticeable share of the step time.

    Each rank proposes ``k = AGREE_BUDGET_S / its measured step time`` at every agreement; the
    all-reduce returns the smallest proposal to all ranks (:meth:`StopFlag.agree`), so they all
    agree next at the same step. ``fixed`` pins k (1: every step, as a test needs to stop at an
    exact step).
    """

    def __init__(self, fixed: int | None = None, budget_s: float = AGREE_BUDGET_S) -> None:
        self.fixed, self.budget_s = fixed, budget_s
        self.next_step = 0
        self._last: tuple[int, float] | None = None  # (step, monotonic time) of the last one

    def due(self, step: int) -> bool:
        """True when the ranks agree after ``step``."""
        return step >= self.next_step

    def propose(self, step: int, now: float | None = None) -> int:
        """This rank's k, from the time per step since the last agreement."""
        if self.fixed is not None:
            return self.fixed
        if self._last is None or step <= self._last[0]:
            return 1
        per_step = ((time.monotonic() if now is None else now) - self._last[1]) / (
            step - self._last[0]
        )
        if per_step <= 0:
            return MAX_AGREE_EVERY
        return max(1, min(MAX_AGREE_EVERY, int(self.budget_s / per_step)))

    def agreed(self, step: int, every: int, now: float | None = None) -> None:
        """Record an agreement after ``step`` on the ranks' common ``every``."""
        self.next_step = step + max(1, every)
        self._last = (step, time.monotonic() if now is None else now)


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
        self._pending: _InFlight | None = None
        self.every = 1
        """The ranks' common agreement interval from the last :meth:`agree`."""

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

    def agree(
        self, device: torch.device | str | None = None, group: Any = None, *, every: int = 1
    ) -> int | None:
        """Collective, at a step boundary on every rank: the signal any rank saw, or None.

        ``device``: where the all-reduce's tensor lives; None: where the group's backend wants
        it (this rank's GPU under NCCL, which takes no CPU tensor; the CPU under gloo).

        ``every`` is this rank's proposed interval to the next agreement; afterwards
        :attr:`every` holds the smallest proposal of all ranks. Once a stop is agreed the
        answer is kept and no further collective is made, which every rank then knows as well.
        """
        if self._agreed is not None:
            return self._agreed
        if self._pending is not None and self.collect() is not None:
            return self._agreed  # the agreement in flight already says stop
        self._pending = _InFlight.start(self._code, every, device, group)
        return self.collect()

    def agree_alone(self) -> int | None:
        """:meth:`agree` for a rank without peers: what it recorded, without a collective (a
        one-rank group's all-reduce would still copy to and from the GPU)."""
        if self._agreed is None:
            self._agreed = decode(self._code)
        return self._agreed

    # --- lagged agreement: launched at one step boundary, read at a later one ----------------

    @property
    def in_flight(self) -> bool:
        """An agreement was launched (:meth:`launch`) and not yet read (:meth:`collect`)."""
        return self._pending is not None

    def launch(
        self, device: torch.device | str | None = None, group: Any = None, *, every: int = 1
    ) -> None:
        """Collective: start an agreement on what this rank has recorded so far, without
        waiting for it; :meth:`collect` reads it at a later step boundary (every rank launches
        and collects at the same boundaries). Nothing is launched once a stop is agreed, or
        while one is still in flight."""
        if self._agreed is not None or self._pending is not None:
            return
        self._pending = _InFlight.start(self._code, every, device, group)

    def collect(self) -> int | None:
        """The signal agreed by the agreement in flight (None: no rank was signalled, or none
        was in flight); :attr:`every` becomes the ranks' smallest proposal. On a GPU this waits
        only for the all-reduce and its copy to the host, not for work queued after them."""
        pending, self._pending = self._pending, None
        if pending is None:
            return self._agreed
        code, self.every = pending.read()
        if self._agreed is None:
            self._agreed = decode(code)
        return self._agreed

    def between_steps(
        self, device: torch.device | str | None, cadence: AgreementCadence, step: int
    ) -> bool:
        """Collective, at a step boundary ``cadence`` picked: whether a stop is agreed. The
        agreement launched at the last boundary is read (:meth:`collect`) and the next one
        launched (:meth:`launch`): reading an all-reduce the moment it is launched would make a
        GPU rank wait for every kernel queued before it."""
        stop = self.collect() is not None  # None when nothing is in flight yet
        if not stop:
            self.launch(device, every=cadence.propose(step))
        cadence.agreed(step, self.every)
        return stop

    def settle(self) -> None:
        """Wait for an agreement in flight and forget its answer (the loop ended before it was
        due: a stop then changes nothing), so no collective is left running at close."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.read()


class _InFlight:
    """One launched agreement: ``[code, -every]`` all-reduced with MAX, on its way to the host.

    Under NCCL the values go up from a pinned host buffer and come back into another with
    non-blocking copies, and an event marks when the answer is on the host; under gloo the
    all-reduce runs on gloo's own thread (``async_op``) on a CPU tensor.
    """

    def __init__(self, host: torch.Tensor, wait: Callable[[], Any]) -> None:
        self.host, self._wait = host, wait

    @classmethod
    def start(cls, code: int, every: int, device: Any, group: Any) -> _InFlight:
        values = torch.tensor([code, -every], dtype=torch.int64)
        if not (dist.is_available() and dist.is_initialized()):
            return cls(values, lambda: None)
        if device is None:
            device = collective_device(dist.get_backend(group))
        device = torch.device(device)
        if device.type != "cuda":
            values = values.to(device)
            work = dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group, async_op=True)
            return cls(values, work.wait)
        up = values.pin_memory()
        on_gpu = up.to(device, non_blocking=True)
        dist.all_reduce(on_gpu, op=dist.ReduceOp.MAX, group=group)
        down = torch.empty(up.shape, dtype=up.dtype, pin_memory=True)
        down.copy_(on_gpu, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()

        def wait() -> torch.Tensor:
            done.synchronize()
            return up  # ``up`` must outlive the copy from it: kept until the read

        return cls(down, wait)

    def read(self) -> tuple[int, int]:
        """(the MAX of the codes, the smallest proposal), once the values are on the host."""
        self._wait()
        code, neg_every = (int(v) for v in self.host.tolist())
        return code, -neg_every
