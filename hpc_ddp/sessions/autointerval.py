"""``checkpoint_every="auto"`` in a session's loop: when to save, re-chosen after every save.

Rank 0 decides and every rank follows: saves are collective, so the decision (the step of the
next save) is broadcast at each decision point, and the decision points themselves fall at
steps every rank knows (after the warm-up steps, after each save). Rank 0's inputs:

* C, the stall: timed by the loop around each save; W, until durable: told by the writer
  thread (:class:`~hpc_ddp.checkpoint.checkpointer.SavedNote`). Before this attempt's first
  save, the newest the run's ledger holds (a resume); without any, the first save comes at
  the first decision, and rank 0 waits for it to be durable there, once, to measure W.
* The step time, measured over the steps since the last decision, saves excluded.
* M (:func:`~hpc_ddp.checkpoint.interval.estimate_mtbf`): the interruptions of this run's
  ledger (:mod:`hpc_ddp.fault.interruptions`) and of the user's other runs on the same
  partition, from ``$XDG_STATE_HOME/hpc-ddp/interruptions.json`` (default
  ``~/.local/state/hpc-ddp``), which rank 0 updates with this run's entry at each decision.
  A state directory that cannot be read or written costs only the history (a warning once).
* R, the restart: this attempt's own start-up, from the session's start to its first step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from hpc_ddp.checkpoint.checkpointer import SavedNote
from hpc_ddp.checkpoint.interval import (
    Exposure,
    IntervalChoice,
    SaveCost,
    choose_interval,
    estimate_mtbf,
    interval_steps,
)
from hpc_ddp.config.model import TrainConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import ConfigError
from hpc_ddp.fault.interruptions import (
    HISTORY_FILE,
    HistoryEntry,
    exposure,
    history_exposure,
    parse_history,
    render_history,
)
from hpc_ddp.rundir.attempt import Attempt, AutoInterval
from hpc_ddp.rundir.ledger import read_ledger

log = logging.getLogger("hpc_ddp")

WARMUP_STEPS = 3
"""Steps timed before the first decision (the first step, with its start-up, is not)."""


class Save(Protocol):
    """A loop's save (:meth:`~hpc_ddp.sessions.attempt.SessionAttempt.save`)."""

    def __call__(self, *, wait: bool, auto: AutoInterval | None = None) -> object: ...


def loop_interval(checkpoint_every: object) -> int | None:
    """A loop's ``checkpoint_every`` checked: a fixed interval in steps (0: only on stop and at
    the end), or None for ``"auto"``; ConfigError for anything else."""
    if checkpoint_every == "auto":
        return None
    if not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ConfigError(
            f"checkpoint_every={checkpoint_every!r} is neither a step count nor 'auto'. "
            "HINT: pass a number of steps (0: only on stop and at the end) or 'auto'"
        )
    return checkpoint_every


def state_dir(env: Mapping[str, str]) -> Path:
    """The user's hpc-ddp state directory: ``$XDG_STATE_HOME/hpc-ddp``, by default
    ``~/.local/state/hpc-ddp``."""
    base = env.get("XDG_STATE_HOME") or ""
    if not base:
        home = env.get("HOME") or str(Path.home())
        base = str(Path(home) / ".local" / "state")
    return Path(base) / "hpc-ddp"


def history_key(env: Mapping[str, str]) -> str:
    """Where the run trains, for the history: its scheduler's pool of nodes (Slurm's
    partition), else ``local``."""
    from hpc_ddp.backends.node_registry import allocation_for

    return allocation_for(env).pool() or "local"


def _last_cost(attempts: list[Attempt]) -> tuple[float, float] | None:
    for attempt in reversed(attempts):
        for save in reversed(attempt.saves):
            if save.durable_s is not None:
                return save.stall_s, max(save.durable_s, save.stall_s)
    return None


class AutoCheckpoints:
    """The auto interval of one rank's loop (see the module docstring).

    ``broadcast``: rank 0's value on every rank (collective). ``settle``: rank 0 waits until
    its save in flight is durable and told. Only rank 0 reads the ledger and the history.
    """

    def __init__(
        self,
        train: TrainConfig,
        *,
        is_main: bool,
        broadcast: Callable[[object], object],
        settle: Callable[[], None],
        ledger: Path | None = None,
        env: Mapping[str, str] | None = None,
        run_id: str | None = None,
        began: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lower_s = train.checkpoint_min_s
        self.upper_s = train.checkpoint_max_s
        self.is_main = is_main
        self._broadcast = broadcast
        self._settle = settle
        self._clock = clock
        self._env = dict(env or {})
        self._run_id = run_id
        self._began = clock() if began is None else began
        self._lock = threading.Lock()  # the writer thread tells W
        self._cost: tuple[float, float] | None = None  # (C, W) of the newest durable save
        self._stall: float | None = None  # C of the newest save, timed by the loop
        self._run = Exposure()  # the run's attempts before this one
        self._history: dict[str, HistoryEntry] = {}
        self._history_path: Path | None = None
        self._started_at: float | None = None  # the first step done: training began
        self._mark: tuple[int, float] | None = None  # (step, time) the step time counts from
        self._stalled = 0.0  # save stalls since the mark
        self.next_save: int | None = None
        self.plan: AutoInterval | None = None
        """The interval in force (rank 0; what each save's ledger line carries)."""
        self.choice: IntervalChoice | None = None
        if is_main and ledger is not None:
            self._load(ledger)

    # --- rank 0's inputs --------------------------------------------------------------------

    def _load(self, ledger: Path) -> None:
        try:
            attempts = read_ledger(ledger)
        except Exception:  # the interval falls back on the prior: never a failed run
            log.warning("checkpoint_every auto: the ledger could not be read", exc_info=True)
            attempts = []
        if attempts and attempts[-1].ended is None:
            attempts = attempts[:-1]  # this attempt's own start
        self._run = exposure(attempts, more=True)
        self._cost = _last_cost(attempts)
        path = state_dir(self._env) / HISTORY_FILE
        self._history_path = path
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            log.warning("checkpoint_every auto: %s unreadable (%s); M without history", path, exc)
            self._history_path = None
            return
        self._history, warning = parse_history(text)
        if warning:
            log.warning("checkpoint_every auto: %s: %s", path, warning)

    def durable(self, note: SavedNote) -> None:
        """Rank 0's writer thread: a save is durable (W measured)."""
        with self._lock:
            stall = note.stall_s if self._stall is None else self._stall
            self._cost = (stall, max(note.durable_s, stall))

    # --- the loop ---------------------------------------------------------------------------

    def after_step(self, step: int, first_step: int, save: Save) -> None:
        """After each step of the loop: save when due (``save``, timed: C), then decide again
        (every rank at the same steps; rank 0's choice broadcast)."""
        self.step_done(step)
        if self.due(step):
            began = time.monotonic()
            save(wait=False, auto=self.plan)
            self.saved(step, time.monotonic() - began)
        if self.deciding(step, first_step):
            self.decide(step)

    def due(self, step: int) -> bool:
        """Is a save due at ``step`` (every rank gets the same answer)?"""
        return self.next_save is not None and step >= self.next_save

    def step_done(self, step: int) -> None:
        """Every step's end, before :meth:`due` (rank 0 times the steps from here)."""
        if self._mark is None:
            now = self._clock()
            self._mark, self._started_at = (step, now), now

    def saved(self, step: int, stall_s: float) -> None:
        """After the loop's save at ``step`` (timed by the loop: C)."""
        self._stalled += stall_s
        self._stall = stall_s

    def deciding(self, step: int, first_step: int) -> bool:
        """Is ``step`` a decision point (after the warm-up, or a save was just made)?"""
        if self.next_save is None:
            return step - first_step >= WARMUP_STEPS
        return step >= self.next_save

    def decide(self, step: int) -> int:
        """Collective: the step of the next save, rank 0's choice on every rank."""
        target = self._choose(step) if self.is_main else None
        chosen = self._broadcast(target)
        assert isinstance(chosen, int)
        self.next_save = chosen
        return chosen

    def _choose(self, step: int) -> int:
        now = self._clock()
        mark_step, mark_time = self._mark or (step, now)
        steps = step - mark_step
        step_s = max(now - mark_time - self._stalled, 0.0) / steps if steps > 0 else 0.0
        self._mark, self._stalled = (step, now), 0.0
        with self._lock:
            cost = self._cost
        if cost is None and self._stall is not None:
            self._settle()  # the first save: W measured once, waiting for it here
            with self._lock:
                cost = self._cost
        if cost is None:
            return step + 1  # nothing measured yet: a save next, to measure it
        restart = max(0.0, (self._started_at or self._began) - self._began)
        # Wall time since the session began: M counts faults in start-ups too.
        trained = Exposure(max(0.0, now - self._began), 0)
        mtbf = estimate_mtbf(self._run.plus(trained), self._history_total(now, trained))
        choice = choose_interval(
            SaveCost(cost[0], cost[1], restart), mtbf, lower_s=self.lower_s, upper_s=self.upper_s
        )
        every = interval_steps(choice.seconds, step_s)
        self.choice = choice
        self.plan = AutoInterval(choice.seconds, every, step_s, mtbf.seconds, mtbf.source, restart)
        log.info(
            "checkpoint_every auto: every %d steps (%.1f s at %.3g s/step; C %.3g s, W %.3g s, "
            "%s)", every, choice.seconds, step_s, cost[0], cost[1], mtbf.describe(),
        )  # fmt: skip
        return step + every

    def _history_total(self, now: float, trained: Exposure) -> Exposure:
        path = self._history_path
        if path is None:
            return Exposure()
        key = history_key(self._env)
        others = history_exposure(self._history, key=key, exclude=self._run_id, now=now)
        if self._run_id is not None:
            mine = self._run.plus(trained)
            entry = HistoryEntry(key, mine.seconds, mine.interruptions, now)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(path, render_history(self._history, self._run_id, entry))
            except OSError as exc:
                log.warning("checkpoint_every auto: %s not written (%s)", path, exc)
                self._history_path = None
        return others
