"""The user's save-time history on disk: ``$XDG_STATE_HOME/hpc-ddp/savetimes.json`` (default
``~/.local/state/hpc-ddp``), what ``requeue.lead_time: auto`` is sized from. Its text and the
rule are :mod:`hpc_ddp.config.leadtime`'s (pure); here only the file: rank 0 adds each durable
save of its run (:class:`SaveTimes`), ``submit`` reads them (:func:`read_save_times`).

Written whole by rename (:func:`~hpc_ddp.durable.write_text_atomic`), never locked. A state
directory that cannot be read or written costs only the history: a warning, never a failed
run or submit. Where home is not shared with the nodes, the history stays on the nodes and
``submit`` sees none: ``auto`` then gives the prior.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpc_ddp.config.leadtime import (
    HISTORY_FILE,
    RECENT,
    SaveEntry,
    history_saves,
    parse_save_history,
    render_save_history,
)
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.lemons import STATE_DIR_ENV

__all__ = ["SaveTimes", "history_path", "read_save_times"]

log = logging.getLogger("hpc_ddp")


def history_path(env: Mapping[str, str], home: Path) -> Path:
    """``$XDG_STATE_HOME/hpc-ddp/savetimes.json`` (an absolute one; XDG says to ignore a
    relative value), else ``~/.local/state/hpc-ddp/savetimes.json``."""
    base = env.get(STATE_DIR_ENV, "")
    root = Path(base) if base and Path(base).is_absolute() else home / ".local" / "state"
    return root / "hpc-ddp" / HISTORY_FILE


def _read(path: Path) -> tuple[dict[str, SaveEntry], str | None]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"unreadable ({exc.strerror or exc})"
    return parse_save_history(text)


def read_save_times(
    env: Mapping[str, str], home: Path, *, name: str, now: float
) -> tuple[list[float], str | None]:
    """The measured W of this user's saves (``name``'s runs first: see
    :func:`~hpc_ddp.config.leadtime.history_saves`), and a warning about the file, if any."""
    path = history_path(env, home)
    runs, warning = _read(path)
    return history_saves(runs, name=name, now=now), (f"{path}: {warning}" if warning else None)


class SaveTimes:
    """Rank 0's record of its run's save times: :meth:`saved` after each durable save
    (from the checkpoint writer's thread)."""

    def __init__(
        self, path: Path, *, run_id: str, name: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self._run_id = run_id
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._mine: list[float] | None = None  # read at the first save
        self._broken = False

    def saved(self, durable_s: float) -> None:
        """A save of this run was durable ``durable_s`` after it was asked for."""
        with self._lock:
            if self._broken:
                return
            runs, warning = _read(self.path)
            if warning:
                log.warning("requeue.lead_time history %s: %s", self.path, warning)
            if self._mine is None:  # the run's earlier attempts' saves go on counting
                earlier = runs.get(self._run_id)
                self._mine = list(earlier.durable_s) if earlier is not None else []
            self._mine = [*self._mine, float(durable_s)][-RECENT:]
            entry = SaveEntry(self._name, tuple(self._mine), self._clock())
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(self.path, render_save_history(runs, self._run_id, entry))
            except OSError as exc:
                log.warning("requeue.lead_time history %s not written (%s)", self.path, exc)
                self._broken = True
