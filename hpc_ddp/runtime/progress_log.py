"""Rank 0's progress lines for the rows a training loop logs, and the live progress file.

``s.log(step=..., loss=...)`` rows become the progress line the built-in trainer prints
(:func:`~hpc_ddp.runtime.metrics.format_progress`: step/total, epoch, loss, samples/s, ETA)
every ``train.log_every`` steps and at the last step, whoever wrote the loop. The same numbers
go to ``RUN_DIR/progress.json`` (replaced atomically), which ``hpc-ddp status`` reads to show
where a running run is and when it will end.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc_ddp.runtime.metrics import Throughput, format_progress

__all__ = ["ProgressLog"]

log = logging.getLogger("hpc_ddp")


class ProgressLog:
    """Turns logged rows into progress lines (rank 0 only; no collectives): one at each
    multiple of ``every`` a row reaches, and at ``total``."""

    def __init__(self, every: int, path: Path | None = None) -> None:
        self.every = max(1, every)
        self.path = path
        """Where the live progress goes (None: nowhere)."""
        self.total: int | None = None
        """The step the loop runs to (``Session.steps(total)``); None: not known yet."""
        self.step_samples: int | None = None
        """Samples one optimizer step consumes over all ranks (None: no ``s.loader``)."""
        self._meter = Throughput()
        self._counted: int | None = None  # the step the meter has counted up to
        self._shown: int | None = None  # the step of the last line
        self._written = 0.0  # when the live file was last written

    def begin(self, step: int, total: int) -> None:
        """The loop runs from ``step`` (done) to ``total``: lines are due every ``every`` steps
        from here, and the rate counts from now."""
        self.total = total
        self._counted = self._shown = step
        self._meter.reset()

    def row(self, row: Mapping[str, Any], *, epoch: int) -> str | None:
        """The progress line for ``row`` if one is due at its ``step``, else None."""
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return None
        if self._counted is None or step <= self._counted:  # the first row, or a replay
            self._counted = self._shown = step
            self._meter.reset()
            return None
        done = step - self._counted
        self._meter.add(done, done * (self.step_samples or 0))
        self._counted = step
        assert self._shown is not None
        # At each multiple of `every` (as the trainer reports), or the first row past one: the
        # same lines whether a loop logs every step or every tenth, and after a resume too.
        due = step // self.every > self._shown // self.every or step == self.total
        if not due:
            return None
        rate, step_s = self._meter.rate()
        self._meter.reset()
        self._shown = step
        given = row.get("samples_per_s")
        if isinstance(given, int | float) and not isinstance(given, bool):
            rate = float(given)
        elif not self.step_samples:
            rate = None
        total = self.total if self.total is not None else step
        eta = None if step_s is None or self.total is None else step_s * max(0, total - step)
        loss = row.get("loss")
        self._write(step, total, rate, eta)
        return format_progress(
            step=step,
            total=total,
            epoch=epoch,
            loss=float(loss) if isinstance(loss, int | float) else None,
            samples_per_s=rate,
            eta_s=eta,
        )

    def _write(self, step: int, total: int, rate: float | None, eta: float | None) -> None:
        now = time.time()
        if self.path is None or (now - self._written < WRITE_EVERY_S and step != self.total):
            return
        self._written = now
        live = {"time": now, "step": step, "total": total, "samples_per_s": rate, "eta_s": eta}
        # A hint for `status`, rewritten often: atomic (a reader sees one whole version), but
        # not fsync'd, which would cost the training thread a disk flush every few seconds.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(live) + "\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write %s (%s): status will not show the live progress",
                        self.path, exc)  # fmt: skip
            self.path = None


WRITE_EVERY_S = 2.0
"""The live progress file is rewritten at most this often (and at the last step)."""
