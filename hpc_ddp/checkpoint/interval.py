"""The checkpoint interval of ``train.checkpoint_every: auto``: a stated cost model of an
asynchronous save under random interruptions, and the interval that minimises its expected
lost time. Pure: it takes numbers and returns numbers (no torch, no environment, no files).

The model
---------
A save is asked for every ``T`` seconds of training. Three measured costs:

* ``C``, the *stall*: how long training waits at a save (snapshot, gather, and the previous
  write if it is still running).
* ``W``, the time until the save is *durable*, from the moment it is asked for (``W >= C``):
  the write runs in the background for ``W - C`` after training goes on.
* ``R``, the restart: from a fault to training again (start-up, restore).

A save first waits for the previous write, so with ``T < W - C`` it blocks for
``c(T) = C + (W - C - T)``: the cost grows towards ``W`` as ``T`` shrinks
(:func:`blocking_s`). The interval is therefore never chosen below ``W``, where
``c(T) = C``.

Interruptions that lose the state on every rank (:mod:`hpc_ddp.fault.interruptions`) arrive
as a Poisson process of mean time between them ``M``. A fault rolls training back to the
newest *durable* save: on average half a segment (``(T + c)/2``), plus the ``W`` during which
the save just asked for is not yet on disk, plus the restart ``R``. Daly's exact form for
exponential faults (J. T. Daly, FGCS 22(3), 2006) then gives the expected wall time of one
segment of ``T`` seconds of work, with the restart ``R + W`` (the non-durable tail is redone
after every restart)::

    E(T) = M * exp((R + W) / M) * (exp((T + c(T)) / M) - 1)

To first order in 1/M this is ``(T + c) * (1 + ((T + c)/2 + R + W) / M)``: a fault costs
``T/2 + W`` of work plus the restart, as stated. The *efficiency* ``T / E(T)`` is the share of
wall time that trains (ETTR when the costs above are the only losses); :func:`choose_interval`
maximises it numerically over ``[max(W, lower), upper]``. Young's ``sqrt(2 C M)`` is that
optimum only while ``C / M`` is small; :func:`daly_interval` is Daly's higher-order
closed form, kept as the starting guess and for comparison.

Where M comes from
------------------
:func:`estimate_mtbf`: the interruptions and training time of this run's ledger and of the
user's other runs (their history), pooled. With at least one interruption seen, ``M`` is the
training time divided by the interruptions (the maximum-likelihood rate). With none, ``M`` is
the larger of :data:`PRIOR_MTBF_S` and the training time seen without one: a long quiet run
earns longer intervals, never shorter ones than the prior.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hpc_ddp.frozen import dataclass

__all__ = [
    "DEFAULT_MAX_S",
    "PRIOR_MTBF_S",
    "Exposure",
    "IntervalChoice",
    "Mtbf",
    "SaveCost",
    "blocking_s",
    "choose_interval",
    "daly_interval",
    "efficiency",
    "estimate_mtbf",
    "interval_steps",
    "segment_wall_s",
    "young_interval",
]

PRIOR_MTBF_S = 8 * 3600.0
"""M before any run of the user was seen: one interruption per 8 hours of training, about the
rate of a busy shared partition with preemption. Used only until the first interruption, or a
longer quiet stretch, is measured."""
DEFAULT_MAX_S = 3600.0
"""``train.checkpoint_max_s``'s default: a long quiet run still saves every hour."""
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class SaveCost:
    """The measured costs of the model (seconds; see the module docstring)."""

    stall_s: float
    """C: how long training waits at a save."""
    durable_s: float
    """W: from asking for a save until it is durable (at least C)."""
    restart_s: float = 0.0
    """R: from a fault to training again."""


@dataclass(frozen=True)
class Exposure:
    """Training time seen and the interruptions in it that lost the state on every rank."""

    seconds: float = 0.0
    interruptions: int = 0

    def plus(self, other: Exposure) -> Exposure:
        """Both pooled."""
        return Exposure(self.seconds + other.seconds, self.interruptions + other.interruptions)


@dataclass(frozen=True)
class Mtbf:
    """The mean time between interruptions used, and what it rests on."""

    seconds: float
    source: str
    """``prior``, ``run``, ``history`` or ``run+history``: whose training time and
    interruptions it was estimated from."""
    run: Exposure = Exposure()
    history: Exposure = Exposure()

    def describe(self) -> str:
        """``M 2.1 h from run+history (3 interruptions in 6.3 h)``."""
        seen = self.run.plus(self.history)
        if self.source == "prior":
            return f"M {_human(self.seconds)} (prior: no training seen yet)"
        what = f"{seen.interruptions} interruption(s) in {_human(seen.seconds)}"
        if seen.interruptions == 0:
            what += f"; prior {_human(PRIOR_MTBF_S)}"
        return f"M {_human(self.seconds)} from {self.source} ({what})"


@dataclass(frozen=True)
class IntervalChoice:
    """The interval chosen, the inputs it came from and the efficiency the model expects."""

    seconds: float
    cost: SaveCost
    mtbf: Mtbf
    efficiency: float
    bound: str | None = None
    """What capped the model's optimum: ``W`` (never below the write), ``min``, ``max``
    (the user's bounds); None: the optimum itself."""


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def blocking_s(interval_s: float, cost: SaveCost) -> float:
    """How long a save blocks training at interval ``interval_s``: the stall, plus what is
    left of the previous write (a save waits for it)."""
    background = max(0.0, cost.durable_s - cost.stall_s)
    return cost.stall_s + max(0.0, background - interval_s)


def segment_wall_s(interval_s: float, cost: SaveCost, mtbf_s: float) -> float:
    """Expected wall time to get one interval of work saved (Daly's exact form for
    exponential faults, with the restart ``R + W``)."""
    segment = interval_s + blocking_s(interval_s, cost)
    restart = cost.restart_s + cost.durable_s
    # expm1 keeps precision when the segment is tiny against M; a huge ratio is simply
    # infinite cost (the run never gets a segment through).
    try:
        return mtbf_s * math.exp(restart / mtbf_s) * math.expm1(segment / mtbf_s)
    except OverflowError:
        return math.inf


def efficiency(interval_s: float, cost: SaveCost, mtbf_s: float) -> float:
    """The share of wall time that trains, at ``interval_s`` (0 to 1)."""
    wall = segment_wall_s(interval_s, cost, mtbf_s)
    return 0.0 if not math.isfinite(wall) or wall <= 0 else interval_s / wall


def young_interval(stall_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum, ``sqrt(2 C M)`` (for comparison only)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order closed-form optimum (FGCS 2006, eq. 37), for a blocking cost
    ``stall_s``; ``mtbf_s`` once the cost reaches twice M."""
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = stall_s / (2.0 * mtbf_s)
    root = math.sqrt(2.0 * stall_s * mtbf_s)
    return max(root * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - stall_s, 1e-9)


def choose_interval(
    cost: SaveCost, mtbf: Mtbf, *, lower_s: float = 0.0, upper_s: float = DEFAULT_MAX_S
) -> IntervalChoice:
    """The interval in ``[max(W, lower_s), upper_s]`` that maximises :func:`efficiency`.

    The model's W bound wins over ``upper_s`` (saving faster than a write takes only stalls
    training). The objective, wall time per unit of work, is unimodal in the interval above W
    (a convex segment cost over a linear gain), so a golden-section search on its logarithm
    finds the optimum; it starts around Daly's closed form."""
    floor = max(cost.durable_s, lower_s, 1e-6)
    ceiling = max(upper_s, floor)
    m = max(mtbf.seconds, 1e-6)
    best = _golden(lambda t: -efficiency(t, cost, m), floor, ceiling)
    if best <= floor * (1 + 1e-6):
        bound = "W" if cost.durable_s >= lower_s else "min"
        best = floor
    elif best >= ceiling * (1 - 1e-6):
        bound, best = "max", ceiling
    else:
        bound = None
    return IntervalChoice(best, cost, mtbf, efficiency(best, cost, m), bound)


def _golden(f: Callable[[float], float], low: float, high: float) -> float:
    """The minimiser of ``f`` (unimodal) on ``[low, high]``, searched in log space."""
    if high <= low:
        return low
    a, b = math.log(low), math.log(high)
    c = b - _GOLDEN * (b - a)
    d = a + _GOLDEN * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(80):  # shrinks the bracket by 0.618^80: far below a step's length
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(math.exp(d))
    mid = math.exp((a + b) / 2)
    # The ends are candidates too: the optimum may sit on a bound.
    return min((low, mid, high), key=f)


def estimate_mtbf(run: Exposure, history: Exposure, *, prior_s: float = PRIOR_MTBF_S) -> Mtbf:
    """M from this run's and the user's history's training time and interruptions (see the
    module docstring)."""
    seen = run.plus(history)
    if run.seconds <= 0 and history.seconds <= 0 and seen.interruptions == 0:
        return Mtbf(prior_s, "prior", run, history)
    parts = [name for name, e in (("run", run), ("history", history)) if e.seconds > 0]
    source = "+".join(parts) or "run"
    if seen.interruptions == 0:
        return Mtbf(max(prior_s, seen.seconds), source, run, history)
    return Mtbf(max(seen.seconds, 1e-3) / seen.interruptions, source, run, history)


def interval_steps(interval_s: float, step_s: float) -> int:
    """The interval in optimizer steps at ``step_s`` seconds a step (at least 1)."""
    if step_s <= 0 or not math.isfinite(step_s):
        return 1
    return max(1, round(interval_s / step_s))
