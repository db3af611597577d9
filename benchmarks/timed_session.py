"""A :class:`~hpc_ddp.sessions.session.Session` that times its steps, for ``bench_trainer``.

Its own module, imported only by the rank processes: it imports torch (through the session),
which the benchmark's parent process need not pay for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

from hpc_ddp.sessions.session import Session

AGREE_MODES = ("sync", "off")
"""How :meth:`TimedSession._stop_between_steps` agrees: the session's own way (at the steps
its cadence picks), or never (what agreeing costs)."""


class TimedSession(Session):
    """Records ``perf_counter()`` before step 1 and after each step's boundary work.

    ``agree`` picks one of :data:`AGREE_MODES`; ``exact`` overrides ``wrap(exact=...)``.
    """

    marks: list[float]
    agree_marks: list[float]
    agree = "sync"
    exact: bool | None = None
    agree_s = 0.0
    first_wall = float("nan")
    """Wall-clock time step 1 was done (set by a benchmark that syncs the GPU there)."""

    def steps(self, total: int, *, checkpoint_every: int | Literal["auto"] = 0) -> Iterator[int]:
        """The session's steps, with a time mark (and the agreement time so far) after each."""
        self.marks, self.agree_marks = [], []
        for step in super().steps(total, checkpoint_every=checkpoint_every):
            self._mark()
            yield step
        self._mark()

    def _mark(self) -> None:
        self.marks.append(time.perf_counter())
        self.agree_marks.append(self.agree_s)

    def _stop_between_steps(self) -> bool:
        """The step loop's stop agreement in the chosen mode, timed into ``agree_s``."""
        start = time.perf_counter()
        try:
            if self.agree == "sync":
                return super()._stop_between_steps()
            return False
        finally:
            self.agree_s += time.perf_counter() - start

    def wrap(self, model: Any, *, exact: bool | None = None, **kw: Any) -> Any:
        """The session's wrap, with ``exact`` from this benchmark variant unless given."""
        return super().wrap(model, exact=self.exact if exact is None else exact, **kw)
