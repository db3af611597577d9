"""The interruptions a periodic checkpoint must cover, counted from a run's ledger, and the
user's history of them across runs (``$XDG_STATE_HOME/hpc-ddp/interruptions.json``). Pure:
the history's text is parsed and rendered here; the session reads and writes the file.

Which ends count: those that lose the training state on every rank, so that only the last
durable periodic save stands.

* An attempt that died without writing its end and was followed by another: the whole
  allocation was lost (killed, node power, the job cancelled by the system).
* A crash, hang, lost node or crash loop without a survivor's save (``rescue``): a one-rank
  run's crash, a sharded run's lost shard, every rank gone at once. With one, the survivors
  saved the last step (:mod:`hpc_ddp.fault.rescue`) and the periodic interval did not matter.
* A time limit, preemption or requeue whose save at the warning did not hold the step reached
  (no grace time, a save that missed it).

The history keeps one entry per run (its training time and interruptions, keyed by the
partition), rewritten whole by rename: two runs that write at once each keep their own entry
on their next write, since each rewrites only its own (the last writer's copy of the others
is at most one save old). No lock is taken: ``flock`` is unreliable on NFS homes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpc_ddp.checkpoint.interval import Exposure
from hpc_ddp.frozen import dataclass
from hpc_ddp.history import parse_runs, render_runs
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import parse_checkpoint_name, parse_sharded_checkpoint_name

__all__ = [
    "HISTORY_FILE",
    "HISTORY_WINDOW_S",
    "HistoryEntry",
    "exposure",
    "history_exposure",
    "lost_state",
    "parse_history",
    "render_history",
]

HISTORY_FILE = "interruptions.json"
"""The history's file name in the user's state directory (its own file: other records there
are other tools' and other features')."""
HISTORY_WINDOW_S = 30 * 86400.0
"""Runs older than this are left out of M: clusters change (new nodes, new preemption rules)."""
HISTORY_KEEP = 500
"""Runs kept in the file, newest first: it stays small when read at every start."""
_VERSION = 1
_FAULTS = (EndCause.CRASH, EndCause.HANG, EndCause.NODE_FAIL, EndCause.NO_PROGRESS)
_WARNED = (EndCause.TIME_LIMIT, EndCause.PREEMPTED, EndCause.MANUAL_REQUEUE)


@dataclass(frozen=True)
class HistoryEntry:
    """One run's line of the history."""

    key: str
    """Where it ran (the Slurm partition; ``local`` without one)."""
    seconds: float
    interruptions: int
    updated: float


def _saved_step(name: str | None) -> int | None:
    if name is None:
        return None
    step = parse_checkpoint_name(name)
    return step if step is not None else parse_sharded_checkpoint_name(name)


def lost_state(attempt: Attempt, *, followed: bool) -> bool:
    """Did ``attempt``'s end lose the state on every rank? (``followed``: a later attempt of
    the run exists, so an attempt without an end was not merely still running.)"""
    cause = attempt.cause
    if cause is None:
        return followed and attempt.trained
    if cause in _FAULTS:
        rescue = attempt.rescue
        return rescue is None or rescue.checkpoint is None
    if cause in _WARNED:
        saved = _saved_step(attempt.checkpoint)
        return attempt.steps_done is not None and (saved is None or saved < attempt.steps_done)
    return False


def _begun(attempt: Attempt) -> float:
    # From its launch where the supervisor recorded one: M is wall time between faults, and
    # they strike start-ups too.
    launched = attempt.launched_at
    return attempt.started if launched is None else min(launched, attempt.started)


def _span(attempt: Attempt) -> float:
    end = attempt.ended
    if end is None:  # died unrecorded: the last thing known of it
        end = max([attempt.started, *(s.time for s in attempt.saves)])
    return max(0.0, end - _begun(attempt))


def exposure(
    attempts: Sequence[Attempt], *, now: float | None = None, more: bool = False
) -> Exposure:
    """Training time of ``attempts`` (a run's ledger, in order) and its interruptions. The
    last attempt, still open, counts up to ``now`` when given; ``more``: another attempt
    follows the last (the one reading them), so an open last one died."""
    seconds, count = 0.0, 0
    for i, attempt in enumerate(attempts):
        last = i == len(attempts) - 1 and not more
        if last and attempt.ended is None and now is not None:
            seconds += max(0.0, now - _begun(attempt))
        elif attempt.trained:
            seconds += _span(attempt)
        count += lost_state(attempt, followed=not last)
    return Exposure(seconds, count)


def parse_history(text: str) -> tuple[dict[str, HistoryEntry], str | None]:
    """The history's entries by run id, and a warning when the text is damaged (its usable
    entries are kept; a damaged file never stops a run)."""
    return parse_runs(text, _entry, version=_VERSION, rewritten="from this run on")


def _entry(raw: Any) -> HistoryEntry | None:
    if not isinstance(raw, dict):
        return None
    try:
        seconds = float(raw["seconds"])
        count = int(raw["interruptions"])
        updated = float(raw["updated"])
        key = str(raw["key"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (0 <= seconds < 1e10 and 0 <= count < 10**6 and updated >= 0):
        return None
    return HistoryEntry(key, seconds, count, updated)


def history_exposure(
    runs: Mapping[str, HistoryEntry],
    *,
    key: str,
    exclude: str | None,
    now: float,
    window_s: float = HISTORY_WINDOW_S,
) -> Exposure:
    """The pooled exposure of the user's other runs on ``key`` within the window."""
    total = Exposure()
    for run_id, entry in runs.items():
        if run_id == exclude or entry.key != key or now - entry.updated > window_s:
            continue
        total = total.plus(Exposure(entry.seconds, entry.interruptions))
    return total


def render_history(
    runs: Mapping[str, HistoryEntry], run_id: str, entry: HistoryEntry, *, keep: int = HISTORY_KEEP
) -> str:
    """The history's text with ``run_id``'s entry replaced by ``entry``; the oldest runs
    beyond ``keep`` dropped."""
    return render_runs(runs, run_id, entry, _history_dict, version=_VERSION, keep=keep)


def _history_dict(e: HistoryEntry) -> dict[str, Any]:
    return {
        "key": e.key,
        "seconds": round(e.seconds, 3),
        "interruptions": e.interruptions,
        "updated": round(e.updated, 3),
    }
