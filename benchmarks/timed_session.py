"""A :class:`~hpc_ddp.runtime.session.Session` that times its steps, for ``bench_trainer``.

Its own module, imported only by the rank processes: it imports torch (through the session),
which the benchmark's parent process need not pay for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from hpc_ddp.runtime.lifecycle import Phase
from hpc_ddp.runtime.session import Session
from hpc_ddp.runtime.stopflag import decode

AGREE_MODES = ("sync", "async", "off")
"""How :meth:`TimedSession.should_stop` agrees: the session's own way, overlapped with the next
step (a proposed fix, measured), or never (the cost of agreeing at all)."""


class TimedSession(Session):
    """Records ``perf_counter()`` before step 1 and after each step's boundary work.

    ``agree`` picks one of :data:`AGREE_MODES`; ``exact`` overrides ``wrap(exact=...)``.
    """

    marks: list[float]
    agree_marks: list[float]
    agree = "sync"
    exact: bool | None = None
    agree_s = 0.0
    _pending: Any = None
    _code: Any = None

    def steps(self, total: int, *, checkpoint_every: int = 0) -> Iterator[int]:
        """The session's steps, with a time mark (and the agreement time so far) after each."""
        self.marks, self.agree_marks = [], []
        for step in super().steps(total, checkpoint_every=checkpoint_every):
            self._mark()
            yield step
        self._mark()

    def _mark(self) -> None:
        self.marks.append(time.perf_counter())
        self.agree_marks.append(self.agree_s)

    def should_stop(self) -> bool:
        """The session's stop agreement in the chosen mode, timed into ``agree_s``."""
        start = time.perf_counter()
        try:
            if self.agree == "sync":
                return super().should_stop()
            if self.agree == "async":
                return self._should_stop_async()
            return False
        finally:
            self.agree_s += time.perf_counter() - start

    def _should_stop_async(self) -> bool:
        """What StopFlag.agree could do: wait for the all-reduce started one step ago (finished
        meanwhile), start this step's; a stop takes effect one step later."""
        flag = self.stop_flag
        if flag.agreed is not None:
            return True
        if self._pending is not None:
            self._pending.wait()
            code = int(self._code[0])
            if code:
                flag._agreed = decode(code)
                return True
        self._code = torch.tensor([flag._code], dtype=torch.int64)
        self._pending = dist.all_reduce(self._code, op=dist.ReduceOp.MAX, async_op=True)
        return False

    def close(self, *, keep_signal_handlers: bool = False) -> None:
        """Wait for an agreement still in flight, then close as the session does."""
        if self._pending is not None and self.phase is not Phase.CLOSED:
            self._pending.wait()
            self._pending = None
        super().close(keep_signal_handlers=keep_signal_handlers)

    def wrap(self, model: Any, *, exact: bool | None = None, **kw: Any) -> Any:
        """The session's wrap, with ``exact`` from this benchmark variant unless given."""
        return super().wrap(model, exact=self.exact if exact is None else exact, **kw)
