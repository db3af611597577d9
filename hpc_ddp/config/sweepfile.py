"""The shape of a sweep file as frozen dataclasses, converted by the same schema as job files.

:data:`SWEEP_SCHEMA` is a :class:`~hpc_ddp.config.schema.Schema` of its own: a sweep key is
never a job key nor the other way round. ``grid``, ``list`` and ``random.params`` map dotted
*job* keys to values; their shape is checked here, and :mod:`hpc_ddp.sweep.spec` checks each
key against the job schema. The attribute docstrings feed the generated config reference.

Pure: no I/O, no environment.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal

from hpc_ddp.config.schema import Schema, build_schema
from hpc_ddp.config.values import Invalid, as_int, bounded, check_chars, describe
from hpc_ddp.frozen import dataclass

MAX_SWEEP_POINTS = 10_000
"""Points in one sweep: Slurm's default ``MaxJobCount`` is 10,000 jobs, array tasks included,
for the whole cluster, so a larger sweep could not even be queued on most clusters."""

Assignment = tuple[tuple[str, Any], ...]
"""(dotted job key, value) pairs, in file order; lists become tuples."""


@dataclass(frozen=True)
class Distribution:
    """One random parameter's distribution, checked: ``kind`` and its ``args``."""

    kind: Literal["uniform", "loguniform", "randint", "choice"]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class RandomSpec:
    """Random samples: each sample draws every parameter from its distribution."""

    samples: int
    """How many points to draw."""
    params: tuple[tuple[str, Distribution], ...]
    """Dotted job key -> its distribution: ``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}``
    (0 < lo), ``{randint: [lo, hi]}`` (both ends included) or ``{choice: [a, b, ...]}``."""
    seed: int = 0
    """Seed of ``random.Random``, the only source of the samples: the same file gives the
    same points on every machine."""


@dataclass(frozen=True)
class MetricSpec:
    """The metric that ranks the points (``hpc-ddp results``)."""

    name: str = "val_loss"
    """A key of the runs' ``metrics.jsonl`` records."""
    mode: Literal["min", "max"] = "min"
    """``min``: lower is better (a loss); ``max``: higher is better (an accuracy)."""


@dataclass(frozen=True)
class SweepSection:
    """The points: the grid's, then the list's, then the random samples, numbered from 0."""

    grid: tuple[tuple[str, tuple[Any, ...]], ...] | None = None
    """Dotted job key -> a non-empty list of values; the points are their cartesian product
    (keys in file order, the last varying fastest)."""
    list: tuple[Assignment, ...] | None = None
    """Points given one by one, each a mapping of dotted job keys to values."""
    random: RandomSpec | None = None
    """Random samples; ``None``: none."""
    metric: MetricSpec = field(default_factory=MetricSpec)
    """The metric that ranks the points."""
    max_parallel: int | None = None
    """At most this many array tasks at once (``--array=...%N``); ``None``: no limit."""


@dataclass(frozen=True)
class SweepFile:
    """A sweep file: a base job and the points that vary it."""

    base: str | Mapping[str, Any]
    """The base job: a job file (relative to the sweep file) or an inline job mapping. Each
    point applies its values on top of it (site profile < base < command-line overrides <
    point values) and is named ``<base name>-<index>``."""
    sweep: SweepSection
    """What to vary and how to rank the points."""


_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlist = _SHOW.maxtuple = _SHOW.maxdict = 8


def show(value: Any) -> str:
    """``repr(value)`` cut short, without walking all of a large value."""
    return _SHOW.repr(value)


def freeze(value: Any) -> Any:
    """Lists become tuples so points are hashable; the loader takes tuples wherever lists go."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def point_counts(sweep: SweepSection) -> dict[str, int]:
    """How many points each kind gives, counted without making one (a grid: its axes'
    lengths multiplied)."""
    return {
        "sweep.grid": math.prod(len(values) for _, values in sweep.grid) if sweep.grid else 0,
        "sweep.list": len(sweep.list or ()),
        "sweep.random.samples": sweep.random.samples if sweep.random else 0,
    }


def check_count(counts: Mapping[str, int]) -> None:
    """Refuse a sweep of no points, or of more than :data:`MAX_SWEEP_POINTS`."""
    total = sum(counts.values())
    if total == 0:
        raise Invalid("sweep", "no points. HINT: give sweep.grid, sweep.list or sweep.random")
    if total > MAX_SWEEP_POINTS:
        parts = ", ".join(f"{key} {n:,}" for key, n in counts.items() if n)
        raise Invalid(
            "sweep",
            f"{total:,} points ({parts}), over hpc-ddp's limit of {MAX_SWEEP_POINTS:,} points "
            "per sweep. HINT: sweep fewer values (a grid has the product of its axes' lengths), "
            "or split the sweep into several sweep files",
        )


def _base(value: Any, key: str) -> str | Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value:
        return check_chars(value, key)
    raise Invalid(
        key,
        f"expected a job file path or a mapping, got {show(value)}. HINT: base: path/to/job.yaml",
    )


def _assignment(value: Any, key: str, example: str) -> Mapping[str, Any]:
    """A mapping whose keys are strings (dotted job keys, checked by the caller)."""
    if not isinstance(value, Mapping):
        raise Invalid(key, f"expected a mapping, got {show(value)}. HINT: indent its keys under it")
    for name in value:
        if not isinstance(name, str):
            raise Invalid(key, f"key {show(name)} is not a string. HINT: e.g. {example}")
    return value


def _grid(value: Any, key: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    axes = []
    for name, values in _assignment(value, key, "train.lr").items():
        if not isinstance(values, list) or not values:
            fix = "give at least one value" if values == [] else f"write {name}: [{show(values)}]"
            raise Invalid(
                f"{key}.{name}",
                f"expected a non-empty list of values, got {show(values)}. HINT: {fix}",
            )
        axes.append((name, freeze(values)))
    return tuple(axes)


def _listed(value: Any, key: str) -> tuple[Assignment, ...]:
    if not isinstance(value, list):
        raise Invalid(
            key,
            f"expected a list of mappings, got {show(value)}. "
            "HINT: write list: [{train.lr: 0.1}, {train.lr: 0.01}]",
        )
    if len(value) > MAX_SWEEP_POINTS:  # refused before a single point is looked at
        check_count({key: len(value)})
    return tuple(
        tuple((name, freeze(v)) for name, v in _assignment(item, f"{key}[{i}]", "train.lr").items())
        for i, item in enumerate(value)
    )


_HINT = (
    "HINT: give one of {uniform: [lo, hi]}, {loguniform: [lo, hi]}, {randint: [lo, hi]}, "
    "{choice: [a, b, ...]}"
)
_NEED = {
    "uniform": "two numbers [lo, hi] with lo <= hi",
    "loguniform": "two numbers [lo, hi] with 0 < lo <= hi",
    "randint": "two integers [lo, hi] with lo <= hi (both included)",
}


def _distribution(dist: Any, key: str) -> Distribution:
    if not isinstance(dist, Mapping) or len(dist) != 1:
        raise Invalid(key, f"expected one distribution, got {show(dist)}. {_HINT}")
    ((kind, args),) = dist.items()
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise Invalid(f"{key}.choice", f"expected a non-empty list. {_HINT}")
        return Distribution("choice", freeze(args))
    if kind not in _NEED:
        raise Invalid(key, f"unknown distribution {show(kind)}. {_HINT}")
    number = int if kind == "randint" else (int, float)
    if (
        not isinstance(args, list)
        or len(args) != 2
        or any(isinstance(a, bool) or not isinstance(a, number) for a in args)
        or args[0] > args[1]
        or (kind == "loguniform" and args[0] <= 0)
    ):
        raise Invalid(f"{key}.{kind}", f"expected {_NEED[kind]}, got {show(args)}. {_HINT}")
    return Distribution(kind, tuple(args))


def _random_params(value: Any, key: str) -> tuple[tuple[str, Distribution], ...]:
    params = _assignment(value, key, "train.lr")
    if not params:
        raise Invalid(
            key, "no parameters. HINT: e.g. params: {train.lr: {loguniform: [1.0e-4, 1.0e-1]}}"
        )
    return tuple((name, _distribution(dist, f"{key}.{name}")) for name, dist in params.items())


def _metric_name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid(
            key,
            f"expected a metric name, got {describe(value)}. HINT: a key of metrics.jsonl, "
            "e.g. val_loss",
        )
    return check_chars(value, key)


def _mode(value: Any, key: str) -> Literal["min", "max"]:
    if value == "min":
        return "min"
    if value == "max":
        return "max"
    raise Invalid(
        key,
        f"{show(value)} is not min or max. HINT: write mode: min (lower is better, e.g. a loss) "
        "or mode: max (e.g. an accuracy)",
    )


SWEEP_SCHEMA: Schema = build_schema(
    SweepFile,
    {
        "base": _base,
        "sweep.grid": _grid,
        "sweep.list": _listed,
        "sweep.random.samples": bounded(as_int, 1, hint="e.g. samples: 16"),
        "sweep.random.params": _random_params,
        "sweep.metric.name": _metric_name,
        "sweep.metric.mode": _mode,
        "sweep.max_parallel": bounded(as_int, 1, hint="leave it out for no limit"),
    },
    {"sweep.grid": "mapping", "sweep.random.params": "mapping"},
    {
        "base": "base: path/to/job.yaml",
        "sweep": "add sweep: {grid: ...}",
        "sweep.random.samples": "e.g. samples: 16",
        "sweep.random.params": "e.g. params: {train.lr: {loguniform: [1.0e-4, 1.0e-1]}}",
    },
    "a mapping of keys (base:, sweep:), got {}. HINT: start the file with 'base: path/to/job.yaml'",
    check=lambda sweep_file: check_count(point_counts(sweep_file.sweep)),
)
"""Every key of a sweep file (:class:`SweepFile`)."""
