"""Sweeps: expand a sweep file into fully validated job configs, and split them into job arrays.

A sweep file::

    base: ../jobs/resnet18-cifar10.yaml   # a job file (relative to this file) or a mapping
    sweep:
      grid: {train.lr: [0.1, 0.01], train.batch_size: [64, 128]}
      list: [{train.lr: 0.3, train.seed: 1}]
      random:
        samples: 8
        seed: 0                            # default 0
        params:
          train.lr: {loguniform: [1.0e-4, 1.0e-1]}
          train.weight_decay: {uniform: [0.0, 0.001]}
          train.seed: {randint: [0, 1000]}  # both ends included
          train.optimizer: {choice: [sgd, adamw]}
      metric: {name: val_loss, mode: min}  # the default
      max_parallel: 4                      # default: no limit

The points are the grid's cartesian product (keys in file order, the last key varying
fastest), then the list's points, then the random samples: the three kinds are concatenated,
never crossed, and numbered from 0 in that order. Each point applies its values on top of the
base (site profile < base < command-line overrides < point values) and is named
``<base name>-<index>``. Random samples come from ``random.Random(seed)`` alone, so the same
file gives the same points on every machine.

A sweep has at most :data:`MAX_SWEEP_POINTS` points, counted before any is made (the grid's
size is the product of its axes' lengths), so a typo such as ``samples: 100000000`` fails at
once instead of filling the login node's memory.

Pure apart from reading the sweep file and its base; login-node side (stdlib and PyYAML only).
Over 300 lines because grid, list and random share one key check and one point count.
"""

from __future__ import annotations

import difflib
import itertools
import math
import random
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpc_ddp.config.load import (
    job_config_from_dict,
    job_configs_from_dicts,
    load_job_data,
    read_yaml,
    split_key,
    with_value,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import ConfigError

MAX_SWEEP_POINTS = 10_000
"""Points in one sweep: Slurm's default ``MaxJobCount`` is 10,000 jobs, array tasks included,
for the whole cluster, so a larger sweep could not even be queued on most clusters."""


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: its index, the values it sets, and its whole validated config."""

    index: int
    overrides: tuple[tuple[str, Any], ...]
    """(dotted key, value) pairs applied on top of the base, in order; lists become tuples."""
    config: JobConfig


@dataclass(frozen=True)
class SweepSpec:
    """An expanded sweep."""

    base_source: str
    """The base job file, or ``<sweep file> (inline base)``."""
    points: tuple[SweepPoint, ...]
    metric: str
    mode: Literal["min", "max"]
    max_parallel: int | None
    """At most this many array tasks at once (``--array=...%N``); ``None``: no limit."""


_Assignment = tuple[tuple[str, Any], ...]
_Sampler = Callable[[random.Random], Any]


def load_sweep(
    path: Path, overrides: Sequence[str] = (), site_profile: Path | None = None
) -> SweepSpec:
    """Read a sweep file and expand and validate every point.

    ``overrides`` (``KEY=VALUE`` from the command line) apply to the base before the sweep's
    values, so a swept key wins over an override of the same key.
    """
    src = str(path)
    doc = _mapping(read_yaml(path, "sweep file"), src, "(top level)")
    _check_keys(doc, ("base", "sweep"), src, "")
    if "base" not in doc:
        raise ConfigError(f"{src}: base: required key missing. HINT: base: path/to/job.yaml")
    base = doc["base"]
    if isinstance(base, str) and base:
        base_path = path.parent / base
        if not base_path.is_file():
            raise ConfigError(
                f"{src}: base: no such job file {str(base_path)!r}. HINT: the path is relative "
                "to the sweep file"
            )
        base_source = str(base_path)
        data = load_job_data(base_path, overrides, site_profile)
    elif isinstance(base, Mapping):
        base_source = f"{src} (inline base)"
        data = load_job_data(base, overrides, site_profile, source=base_source)
    else:
        raise ConfigError(
            f"{src}: base: expected a job file path or a mapping, got {_show(base)}. "
            "HINT: base: path/to/job.yaml"
        )
    # The points may define the params the base's command names; each point is checked whole.
    base_cfg = job_config_from_dict(data, base_source, placeholders=False)

    if doc.get("sweep") is None:
        raise ConfigError(f"{src}: sweep: required key missing. HINT: add sweep: {{grid: ...}}")
    sweep = _mapping(doc["sweep"], src, "sweep")
    _check_keys(sweep, ("grid", "list", "random", "metric", "max_parallel"), src, "sweep.")
    paths: dict[str, tuple[str, ...]] = {}  # swept key -> its path, checked once
    axes = _grid(sweep.get("grid"), src, paths)
    listed = _listed(sweep.get("list"), src, paths)
    random_spec = _random(sweep.get("random"), src, paths)
    counts = {
        "sweep.grid": math.prod(len(axis) for axis in axes) if axes else 0,
        "sweep.list": len(listed),
        "sweep.random.samples": random_spec[0] if random_spec else 0,
    }
    _check_count(counts, src)
    assignments: list[_Assignment] = [
        *(itertools.product(*axes) if axes else []),
        *listed,
        *(_draw(*random_spec) if random_spec else []),
    ]
    metric, mode = _metric(sweep.get("metric"), src)
    max_parallel = sweep.get("max_parallel")
    if max_parallel is not None and (
        isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1
    ):
        raise ConfigError(
            f"{src}: sweep.max_parallel: expected a whole number of at least 1, got "
            f"{_show(max_parallel)}. HINT: leave it out for no limit"
        )
    return SweepSpec(
        base_source=base_source,
        points=_expand(data, base_cfg.name, assignments, paths, src),
        metric=metric,
        mode=mode,
        max_parallel=max_parallel,
    )


def chunk_array(n: int, max_array_size: int) -> list[tuple[int, int]]:
    """Split points ``0..n-1`` into as few contiguous ``(start, stop)`` ranges as possible.

    Slurm's ``MaxArraySize`` bounds the array *index*, not the count: with the default 1001
    the largest index is 1000. So each range becomes its own job array with task ids
    ``0..stop-start-1`` (all below ``max_array_size``), and task id ``t`` of that array runs
    point ``start + t``. A ``max_parallel`` limit (``%N``) applies to each array separately.
    """
    if n < 0:
        raise ValueError(f"cannot split a negative number of points ({n})")
    if max_array_size < 1:
        raise ValueError(f"MaxArraySize must be at least 1, got {max_array_size}")
    return [(start, min(start + max_array_size, n)) for start in range(0, n, max_array_size)]


def _check_count(counts: Mapping[str, int], src: str) -> None:
    total = sum(counts.values())
    if total == 0:
        raise ConfigError(
            f"{src}: sweep: no points. HINT: give sweep.grid, sweep.list or sweep.random"
        )
    if total > MAX_SWEEP_POINTS:
        parts = ", ".join(f"{key} {n:,}" for key, n in counts.items() if n)
        raise ConfigError(
            f"{src}: sweep: {total:,} points ({parts}), over hpc-ddp's limit of "
            f"{MAX_SWEEP_POINTS:,} points per sweep. HINT: sweep fewer values (a grid has the "
            "product of its axes' lengths), or split the sweep into several sweep files"
        )


_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlist = _SHOW.maxtuple = _SHOW.maxdict = 8


def _show(value: Any) -> str:
    """``repr(value)`` cut short, without walking all of a large value."""
    return _SHOW.repr(value)


def _expand(
    data: Mapping[str, Any],
    base_name: str,
    assignments: list[_Assignment],
    paths: Mapping[str, tuple[str, ...]],
    src: str,
) -> tuple[SweepPoint, ...]:
    items = []
    for index, assignment in enumerate(assignments):
        point_data = data
        for key, value in assignment:
            # Only the mappings on the key's path are copied: untouched sections stay shared,
            # and job_configs_from_dicts converts each shared section once.
            point_data = with_value(point_data, paths[key], value)
        point_data = with_value(point_data, ("name",), f"{base_name}-{index}")
        shown = ", ".join(f"{k}={_show(v)}" for k, v in assignment)
        items.append((point_data, f"{src}: point {index} ({shown})"))
    configs = job_configs_from_dicts(items)
    return tuple(
        SweepPoint(index=i, overrides=a, config=c)
        for i, (a, c) in enumerate(zip(assignments, configs, strict=True))
    )


def _swept_key(key: Any, src: str, where: str, paths: dict[str, tuple[str, ...]]) -> str:
    """Check a swept key against the job schema (did-you-mean on a typo) and record its path."""
    if not isinstance(key, str):
        raise ConfigError(f"{src}: {where}: key {_show(key)} is not a string. HINT: e.g. train.lr")
    if key == "name":
        raise ConfigError(
            f"{src}: {where}.name: cannot be swept; each point is named <base name>-<index>. "
            "HINT: set name in the base"
        )
    if key not in paths:
        paths[key] = split_key(key, f"{src}: {where}")
    return key


def _freeze(value: Any) -> Any:
    """Lists become tuples so points are hashable; the loader takes tuples wherever lists go."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _grid(grid: Any, src: str, paths: dict[str, tuple[str, ...]]) -> list[list[tuple[str, Any]]]:
    """The grid's axes, one list of (key, value) per key; the caller counts their product
    before it makes a single point."""
    if grid is None:
        return []
    grid = _mapping(grid, src, "sweep.grid")
    axes = []
    for key, values in grid.items():
        _swept_key(key, src, "sweep.grid", paths)
        if not isinstance(values, list) or not values:
            fix = "give at least one value" if values == [] else f"write {key}: [{_show(values)}]"
            raise ConfigError(
                f"{src}: sweep.grid.{key}: expected a non-empty list of values, got "
                f"{_show(values)}. HINT: {fix}"
            )
        axes.append([(key, _freeze(v)) for v in values])
    return axes


def _listed(points: Any, src: str, paths: dict[str, tuple[str, ...]]) -> list[_Assignment]:
    if points is None:
        return []
    if not isinstance(points, list):
        raise ConfigError(
            f"{src}: sweep.list: expected a list of mappings, got {_show(points)}. "
            "HINT: write list: [{train.lr: 0.1}, {train.lr: 0.01}]"
        )
    if len(points) > MAX_SWEEP_POINTS:
        _check_count({"sweep.list": len(points)}, src)
    out = []
    for i, item in enumerate(points):
        point = _mapping(item, src, f"sweep.list[{i}]")
        for key in point:
            _swept_key(key, src, f"sweep.list[{i}]", paths)
        out.append(tuple((key, _freeze(value)) for key, value in point.items()))
    return out


_RandomSpec = tuple[int, int, list[tuple[str, _Sampler]]]  # samples, seed, samplers


def _random(spec: Any, src: str, paths: dict[str, tuple[str, ...]]) -> _RandomSpec | None:
    """The checked ``random`` section; :func:`_draw` makes its points once they are counted."""
    if spec is None:
        return None
    spec = _mapping(spec, src, "sweep.random")
    _check_keys(spec, ("samples", "seed", "params"), src, "sweep.random.")
    samples = spec.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ConfigError(
            f"{src}: sweep.random.samples: expected a whole number of at least 1, got "
            f"{_show(samples)}. HINT: e.g. samples: 16"
        )
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(
            f"{src}: sweep.random.seed: expected an integer, got {_show(seed)}. HINT: e.g. seed: 0"
        )
    params = _mapping(spec.get("params"), src, "sweep.random.params")
    if not params:
        raise ConfigError(
            f"{src}: sweep.random.params: no parameters. HINT: e.g. params: "
            "{train.lr: {loguniform: [1.0e-4, 1.0e-1]}}"
        )
    samplers = []
    for key, dist in params.items():
        _swept_key(key, src, "sweep.random.params", paths)
        samplers.append((key, _sampler(dist, f"sweep.random.params.{key}", src)))
    return samples, seed, samplers


def _draw(samples: int, seed: int, samplers: list[tuple[str, _Sampler]]) -> list[_Assignment]:
    rng = random.Random(seed)
    return [tuple((key, draw(rng)) for key, draw in samplers) for _ in range(samples)]


_DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


def _sampler(dist: Any, where: str, src: str) -> _Sampler:
    hint = "HINT: give one of {uniform: [lo, hi]}, {loguniform: [lo, hi]}, {randint: [lo, hi]}, "
    hint += "{choice: [a, b, ...]}"
    if not isinstance(dist, Mapping) or len(dist) != 1:
        raise ConfigError(f"{src}: {where}: expected one distribution, got {_show(dist)}. {hint}")
    ((kind, args),) = dist.items()
    if kind not in _DISTRIBUTIONS:
        raise ConfigError(f"{src}: {where}: unknown distribution {_show(kind)}. {hint}")
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{src}: {where}.choice: expected a non-empty list. {hint}")
        options = [_freeze(a) for a in args]
        return lambda rng: rng.choice(options)
    number = int if kind == "randint" else (int, float)
    if (
        not isinstance(args, list)
        or len(args) != 2
        or any(isinstance(a, bool) or not isinstance(a, number) for a in args)
        or args[0] > args[1]
        or (kind == "loguniform" and args[0] <= 0)
    ):
        need = {
            "uniform": "two numbers [lo, hi] with lo <= hi",
            "loguniform": "two numbers [lo, hi] with 0 < lo <= hi",
            "randint": "two integers [lo, hi] with lo <= hi (both included)",
        }[kind]
        raise ConfigError(f"{src}: {where}.{kind}: expected {need}, got {_show(args)}. {hint}")
    low, high = args
    if kind == "randint":
        return lambda rng: rng.randint(low, high)
    if kind == "uniform":
        return lambda rng: rng.uniform(low, high)
    log_low, log_high = math.log(low), math.log(high)
    return lambda rng: math.exp(rng.uniform(log_low, log_high))


def _metric(spec: Any, src: str) -> tuple[str, Literal["min", "max"]]:
    if spec is None:
        return "val_loss", "min"
    spec = _mapping(spec, src, "sweep.metric")
    _check_keys(spec, ("name", "mode"), src, "sweep.metric.")
    name = spec.get("name", "val_loss")
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{src}: sweep.metric.name: expected a metric name, got {_show(name)}. "
            "HINT: a key of metrics.jsonl, e.g. val_loss"
        )
    mode = spec.get("mode", "min")
    if mode == "min":
        return name, "min"
    if mode == "max":
        return name, "max"
    raise ConfigError(
        f"{src}: sweep.metric.mode: {_show(mode)} is not min or max. HINT: write mode: min (lower "
        "is better, e.g. a loss) or mode: max (e.g. an accuracy)"
    )


def _mapping(value: Any, src: str, where: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{src}: {where}: expected a mapping, got {_show(value)}. HINT: indent its keys "
            "under it"
        )
    return value


def _check_keys(data: Mapping[Any, Any], allowed: tuple[str, ...], src: str, prefix: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"use {', '.join(allowed)}"
            shown = key if isinstance(key, str) and len(key) <= _SHOW.maxstring else _show(key)
            raise ConfigError(f"{src}: {prefix}{shown}: unknown key. HINT: {hint}")
