"""``requeue.lead_time: auto``: how long before the kill the stop signal must come, sized from
this user's measured save times, and the history those times are kept in. Pure: it takes
numbers and text and returns numbers and text (no environment, no files, no torch).

The rule
--------
A stop at the warning finishes the step in flight, agrees on it across the ranks, saves it and
waits until the save is durable; only then is the step safe. Its measured part is ``W``, the
time from asking for a save until it is durable (the ledger's ``checkpoint`` lines carry it as
``durable_s``; the stop's own save is one of them). The rest, the step in flight, the agreement
and asking Slurm for the requeue, is allowed :data:`STOP_ALLOWANCE_S`. The lead time is::

    lead = ceil(MARGIN * (max(W of the RECENT newest saves) + STOP_ALLOWANCE_S))

clamped to ``[MIN_LEAD_S, MAX_LEAD_S]`` and to at most half of ``slurm.time`` (a warning
that came before half the job's time would cost more than it saves). The maximum, not a
mean: a save that missed the kill loses every step since the save before it, so the slow
saves decide. Without any measured save, :data:`PRIOR_LEAD_S`.

The grace check
---------------
Preemption does not wait for the lead time: Slurm sends SIGTERM and kills the job after the
partition's (or, under ``preempt/qos``, the QOS's) ``GraceTime`` plus ``KillWait``. ``submit``
warns (:func:`grace_warning`) when that is shorter than the measured stop, the slowest recent
save plus :data:`STOP_ALLOWANCE_S` (no margin: a warning, not a choice).

The history
-----------
``$XDG_STATE_HOME/hpc-ddp/savetimes.json`` (default ``~/.local/state/hpc-ddp``): one entry per
run, its job name and its newest ``W``s, rewritten whole by rename (as the interruptions'
history, :mod:`hpc_ddp.fault.interruptions`: no lock, ``flock`` is unreliable on NFS homes;
two runs writing at once each keep their own entry on their next write). Rank 0 updates its
run's entry after each durable save; ``submit`` reads it. A job name's own runs are used when
the history has any (the same model, the same file system), else every run's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hpc_ddp.frozen import dataclass

__all__ = [
    "HISTORY_FILE",
    "MARGIN",
    "MAX_LEAD_S",
    "MIN_LEAD_S",
    "PRIOR_LEAD_S",
    "RECENT",
    "STOP_ALLOWANCE_S",
    "LeadTime",
    "SaveEntry",
    "choose_lead_time",
    "grace_warning",
    "history_saves",
    "parse_save_history",
    "render_save_history",
    "stop_needs_s",
]

PRIOR_LEAD_S = 120
"""The lead time before any save of this user was measured (and ``lead_time``'s default)."""
MARGIN = 2.0
"""The measured stop is doubled: a busy file system, a larger model, a slower node."""
STOP_ALLOWANCE_S = 15.0
"""What a stop costs besides the save: the step in flight, the agreement, asking Slurm."""
MIN_LEAD_S = 30
MAX_LEAD_S = 3600
RECENT = 20
"""The newest saves the rule looks at (and each run's entry keeps)."""
HISTORY_FILE = "savetimes.json"
HISTORY_WINDOW_S = 30 * 86400.0
"""Runs older than this are left out: the file system and the models change."""
HISTORY_KEEP = 200
_VERSION = 1


@dataclass(frozen=True)
class LeadTime:
    """The lead time ``auto`` chose, and what from."""

    seconds: int
    source: str
    """``prior`` (no save measured) or ``history``."""
    saves: int = 0
    """The measured saves it rests on."""
    slowest_s: float | None = None
    """The slowest of them (W, seconds)."""
    bound: str | None = None
    """What capped the rule: ``min``, ``max`` or ``slurm.time``; None: the rule itself."""

    def describe(self) -> str:
        """``requeue.lead_time auto: 70 s (2 x (slowest save 20.0 s + 15 s stop), from 12
        saves in the history)``."""
        if self.source == "prior":
            what = "the prior: no save measured yet"
        else:
            what = (
                f"{MARGIN:g} x (slowest save {self.slowest_s:.1f} s + {STOP_ALLOWANCE_S:g} s "
                f"stop), from {self.saves} save(s) in the history"
            )
        capped = f"; capped by {self.bound}" if self.bound else ""
        return f"requeue.lead_time auto: {self.seconds} s ({what}{capped})"


def choose_lead_time(durable_s: Sequence[float], *, time_limit_s: float | None) -> LeadTime:
    """The lead time for the measured save times ``durable_s`` (newest last) under a job
    time limit of ``time_limit_s`` (None: unknown). See the module docstring."""
    recent = [w for w in durable_s if math.isfinite(w) and w >= 0][-RECENT:]
    cap = MAX_LEAD_S
    cap_name = "max"
    if time_limit_s is not None and time_limit_s / 2 < cap:
        cap, cap_name = max(1, int(time_limit_s // 2)), "slurm.time"
    if not recent:
        if cap < PRIOR_LEAD_S:
            return LeadTime(int(cap), "prior", bound=cap_name)
        return LeadTime(PRIOR_LEAD_S, "prior")
    slowest = max(recent)
    need = math.ceil(MARGIN * (slowest + STOP_ALLOWANCE_S))
    bound = None
    if need < MIN_LEAD_S:
        need, bound = MIN_LEAD_S, "min"
    if need > cap:
        need, bound = int(cap), cap_name
    return LeadTime(int(need), "history", len(recent), slowest, bound)


def stop_needs_s(durable_s: Sequence[float]) -> float | None:
    """What a stop at the warning takes, measured: the slowest of the newest saves plus the
    stop itself (no margin); None without a measured save."""
    recent = [w for w in durable_s if math.isfinite(w) and w >= 0][-RECENT:]
    return max(recent) + STOP_ALLOWANCE_S if recent else None


def grace_warning(grace_s: int, kill_wait_s: int, source: str, needs_s: float) -> str | None:
    """The submit's warning when a preemption's grace (``grace_s`` of ``source``, then
    ``kill_wait_s``) is shorter than a stop takes (``needs_s``, :func:`stop_needs_s`); None
    when it is long enough."""
    total = grace_s + kill_wait_s
    if total >= needs_s:
        return None
    return (
        f"a preemption gives {total} s from SIGTERM to SIGKILL (GraceTime {grace_s} s of "
        f"{source} + KillWait {kill_wait_s} s), less than a stop takes here ({needs_s:.0f} s: "
        f"your slowest recent save + {STOP_ALLOWANCE_S:g} s): a preempted run loses the steps "
        "since its last periodic save. HINT: save more often (train.checkpoint_every), or "
        "submit to a partition or QOS with a longer GraceTime"
    )


@dataclass(frozen=True)
class SaveEntry:
    """One run's line of the save-time history."""

    name: str
    """The run's job name (``name:`` of its config)."""
    durable_s: tuple[float, ...]
    """Its newest saves' W, oldest first (at most :data:`RECENT`)."""
    updated: float


def parse_save_history(text: str) -> tuple[dict[str, SaveEntry], str | None]:
    """The history's entries by run id, and a warning when the text is damaged (its usable
    entries are kept: a damaged file never fails a submit or a run)."""
    from hpc_ddp.history import parse_runs  # not at the top: few config loads read it

    return parse_runs(text, _entry, version=_VERSION, rewritten="at the next save")


def _entry(raw: Any) -> SaveEntry | None:
    if not isinstance(raw, dict):
        return None
    try:
        name = str(raw["name"])
        saves = tuple(float(w) for w in raw["durable_s"])
        updated = float(raw["updated"])
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(w) and 0 <= w < 1e7 for w in saves) or not updated >= 0:
        return None
    return SaveEntry(name, saves[-RECENT:], updated)


def history_saves(
    runs: Mapping[str, SaveEntry],
    *,
    name: str,
    now: float,
    window_s: float = HISTORY_WINDOW_S,
) -> list[float]:
    """The measured W of the history within the window, oldest run first: the runs named
    ``name`` when there are any, else every run's."""
    recent = [e for e in runs.values() if now - e.updated <= window_s]
    mine = [e for e in recent if e.name == name] or recent
    return [w for e in sorted(mine, key=lambda e: e.updated) for w in e.durable_s]


def render_save_history(
    runs: Mapping[str, SaveEntry], run_id: str, entry: SaveEntry, *, keep: int = HISTORY_KEEP
) -> str:
    """The history's text with ``run_id``'s entry replaced by ``entry``; the oldest runs
    beyond ``keep`` dropped."""
    from hpc_ddp.history import render_runs  # not at the top: few config loads write it

    return render_runs(runs, run_id, entry, _save_dict, version=_VERSION, keep=keep)


def _save_dict(e: SaveEntry) -> dict[str, Any]:
    return {
        "name": e.name,
        "durable_s": [round(w, 3) for w in e.durable_s[-RECENT:]],
        "updated": round(e.updated, 3),
    }
