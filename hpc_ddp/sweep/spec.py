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
file gives the same points on every machine. Two points written out with the same values (a
grid axis or the command line listing a value twice, a list point repeating a grid point) are
refused (:func:`refuse_duplicates`); random draws may repeat one by chance.

A sweep has at most :data:`MAX_SWEEP_POINTS` points, counted before any is made (the grid's
size is the product of its axes' lengths), so a typo such as ``samples: 100000000`` fails at
once instead of filling the login node's memory.

The file's shape is :mod:`hpc_ddp.config.sweepfile`, converted by the same schema as job files;
this module checks the swept keys against the job schema and makes the points.

Pure apart from reading the sweep file and its base; login-node side (stdlib and PyYAML only).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from hpc_ddp.config.load import (
    job_config_from_dict,
    job_configs_from_dicts,
    load_job_data,
    split_key,
    with_value,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.sweepfile import (
    MAX_SWEEP_POINTS,
    SWEEP_SCHEMA,
    Assignment,
    Distribution,
    RandomSpec,
    SweepFile,
    SweepSection,
    freeze,
    point_counts,
    show,
)
from hpc_ddp.config.yaml_dialect import read_yaml
from hpc_ddp.errors import ConfigError

__all__ = [
    "MAX_SWEEP_POINTS",
    "SweepPoint",
    "SweepSpec",
    "chunk_array",
    "load_sweep",
    "split_sweep_overrides",
]

Axis = tuple[str, tuple[Any, ...]]
"""A grid axis from the command line: a dotted key and its values, in order."""


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: its index, the values it sets, and its whole validated config."""

    index: int
    overrides: Assignment
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

    @property
    def name(self) -> str:
        """The base job's name (points are named ``<base name>-<index>``)."""
        return self.points[0].config.name.rsplit("-", 1)[0]


_Sampler = Callable[[random.Random], Any]


def load_sweep(
    path: Path,
    overrides: Sequence[str] = (),
    site_profile: Path | None = None,
    *,
    axes: Sequence[Axis] = (),
) -> SweepSpec:
    """Read a sweep file and expand and validate every point.

    ``overrides`` (``KEY=VALUE`` from the command line) apply to the base before the sweep's
    values, so a swept key wins over an override of the same key. ``axes`` (the command
    line's ``KEY=A,B``, :func:`split_sweep_overrides`) are a grid crossed with every point of
    the file, their values applied last; with axes, ``path`` may be a plain job file (no
    ``sweep:``), which is then the base of the grid alone.
    """
    src = str(path)
    raw = read_yaml(path, "sweep file")
    if _is_job_file(raw):
        if not axes:
            raise ConfigError(
                f"{src}: a job file, not a sweep file (it has no sweep: section). HINT: sweep "
                f"it from the command line, `hpc-ddp sweep {src} train.lr=0.1,0.01`, or write "
                "a sweep file with base: and sweep: (see jobs/sweep-lr.yaml)"
            )
        return _grid_over_job(path, overrides, site_profile, axes)
    # The whole file's shape and its point count are checked before the base is read.
    doc: SweepFile = SWEEP_SCHEMA.convert(raw, src)
    sweep = doc.sweep
    _check_total(point_counts_total(sweep) * _grid_size(axes), src)
    paths = _swept_paths(sweep, src)
    paths.update(_axis_paths(axes, paths))
    if isinstance(doc.base, str):
        base_path = path.parent / doc.base
        if not base_path.is_file():
            raise ConfigError(
                f"{src}: base: no such job file {str(base_path)!r}. HINT: the path is relative "
                "to the sweep file"
            )
        base_source = str(base_path)
        data = load_job_data(base_path, overrides, site_profile)
    else:
        base_source = f"{src} (inline base)"
        data = load_job_data(doc.base, overrides, site_profile, source=base_source)
    # The points may define the params the base's command names; each point is checked whole.
    base_cfg = job_config_from_dict(data, base_source, placeholders=False)
    grid = [[(key, value) for value in values] for key, values in sweep.grid or ()]
    chosen: list[Assignment] = [
        *(itertools.product(*grid) if grid else ()),  # no axes: no points, not one empty one
        *(sweep.list or ()),
    ]
    drawn = _draw(sweep.random) if sweep.random else []
    assignments = _crossed([*chosen, *drawn], axes)
    # Random draws may repeat a point by chance (a choice of two, eight samples): only the
    # points written out (grid, list, command line) must each be new.
    refuse_duplicates(assignments[: len(chosen) * _grid_size(axes)], src)
    return SweepSpec(
        base_source=base_source,
        points=_expand(data, base_cfg.name, assignments, paths, src),
        metric=sweep.metric.name,
        mode=sweep.metric.mode,
        max_parallel=sweep.max_parallel,
    )


# --- a grid from the command line ---------------------------------------------------------------


def split_sweep_overrides(args: Sequence[str]) -> tuple[list[str], list[Axis]]:
    """(plain overrides, grid axes) of the command line's ``KEY=VALUE`` arguments, as Hydra's
    ``--multirun`` reads them (pure).

    A value with a comma outside brackets, braces and quotes lists the axis's values:
    ``train.lr=0.1,0.01`` is the axis ``train.lr: [0.1, 0.01]``, each value read as YAML like
    any override's. A value without such a comma is a plain override, as before
    (``train.lr=0.1``, ``train.milestones=[10,20]``). A literal comma stays in one value when
    quoted (``train.tag='a,b'``: the shell needs ``"train.tag='a,b'"``) or escaped with a
    backslash (``train.tag=a\\,b``: the shell needs ``'train.tag=a\\,b'``); a backslash before a
    comma is dropped from a plain value too. An axis with an empty value (``k=a,``) or a key
    given twice is a :class:`ConfigError`.
    """
    plain: list[str] = []
    axes: list[Axis] = []
    seen: set[str] = set()
    for arg in args:
        key, sep, value = arg.partition("=")
        items = _split_items(value) if sep else [value]
        if len(items) == 1:
            plain.append(f"{key}={items[0]}" if sep else arg)
            continue
        if key in seen:
            raise ConfigError(
                f"{arg}: {key} is swept twice on the command line. HINT: give all its values "
                f"in one argument, {key}=A,B,C"
            )
        seen.add(key)
        if any(not item.strip() for item in items):
            raise ConfigError(
                f"{arg}: an empty value in the list. HINT: {key}=A,B lists the values A and B; "
                f"a value with a comma of its own is quoted ({key}='a,b') or escaped (a\\,b)"
            )
        axes.append((key, tuple(_axis_value(arg, item) for item in items)))
    return plain, axes


_CLOSERS = {"[": "]", "{": "}"}


def _split_items(value: str) -> list[str]:
    """``value`` split at its top-level commas; ``\\,`` is a comma kept in its item."""
    items: list[str] = []
    current: list[str] = []
    depth: list[str] = []
    quote = ""
    i = 0
    while i < len(value):
        c = value[i]
        if c == "\\" and value[i + 1 : i + 2] == "," and not quote:
            current.append(",")
            i += 2
            continue
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _CLOSERS:
            depth.append(_CLOSERS[c])
        elif depth and c == depth[-1]:
            depth.pop()
        elif c == "," and not depth:
            items.append("".join(current))
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    items.append("".join(current))
    return items


def _axis_value(arg: str, item: str) -> Any:
    from hpc_ddp.config.yaml_dialect import load_yaml_value

    try:
        return freeze(load_yaml_value(item.strip()))
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{arg}: {item!r} is not a value ({exc}). HINT: each of the comma-separated values "
            "is read as YAML, as an override's value is"
        ) from None


def _grid_size(axes: Sequence[Axis]) -> int:
    return math.prod(len(values) for _, values in axes) if axes else 1


def point_counts_total(sweep: SweepSection) -> int:
    """The points a sweep file gives, counted without making one."""
    return sum(point_counts(sweep).values())


def _check_total(total: int, src: str) -> None:
    if total > MAX_SWEEP_POINTS:
        raise ConfigError(
            f"{src}: {total:,} points with the command line's grid, over hpc-ddp's limit of "
            f"{MAX_SWEEP_POINTS:,} points per sweep. HINT: sweep fewer values"
        )


def _crossed(assignments: list[Assignment], axes: Sequence[Axis]) -> list[Assignment]:
    """Every assignment with every combination of the axes' values (the last axis varying
    fastest), the axes' values applied after the file's."""
    if not axes:
        return assignments
    grid = list(itertools.product(*[[(key, v) for v in values] for key, values in axes]))
    return [(*a, *combo) for a in assignments for combo in grid]


def _axis_paths(axes: Sequence[Axis], known: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    paths: dict[str, tuple[str, ...]] = {}
    for key, _ in axes:
        if key == "name":
            raise ConfigError(
                f"name={','.join(map(str, dict(axes)['name']))}: cannot be swept; each point is "
                "named <base name>-<index>. HINT: set name in the job file"
            )
        if key not in known:
            paths[key] = split_key(key, "the command line")
    return paths


def refuse_duplicates(assignments: Sequence[Assignment], src: str) -> None:
    """Refuse two points that set the same values (pure): the second would train the first's
    config again under another name, and ``results`` would show it twice.

    Points are the same when every key has the same value of the same type, the last one given
    for a key counting (a list point may repeat a grid point; ``1`` and ``1.0`` stay apart).
    """
    seen: dict[Any, int] = {}
    for index, assignment in enumerate(assignments):
        values = dict(assignment)
        key = tuple(sorted((k, type(v).__name__, _hashable(v)) for k, v in values.items()))
        first = seen.setdefault(key, index)
        if first != index:
            shown = ", ".join(f"{k}={show(v)}" for k, v in values.items()) or "no values"
            raise ConfigError(
                f"{src}: points {first} and {index} are the same ({shown}): each would train "
                "the same config. HINT: list each value once (a grid axis, the command line's "
                "KEY=A,B, a list point that repeats a grid point)"
            )


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _is_job_file(raw: Any) -> bool:
    """A mapping with neither ``sweep`` nor ``base``: a job file, not a sweep file."""
    return isinstance(raw, Mapping) and "sweep" not in raw and "base" not in raw


def _grid_over_job(
    path: Path, overrides: Sequence[str], site_profile: Path | None, axes: Sequence[Axis]
) -> SweepSpec:
    """The command line's grid over a plain job file (``hpc-ddp sweep job.yaml k=a,b``)."""
    src = str(path)
    _check_total(_grid_size(axes), src)
    paths = _axis_paths(axes, {})
    data = load_job_data(path, overrides, site_profile)
    base_cfg = job_config_from_dict(data, src, placeholders=False)
    metric = SweepSection().metric
    assignments = _crossed([()], axes)
    refuse_duplicates(assignments, src)
    return SweepSpec(
        base_source=src,
        points=_expand(data, base_cfg.name, assignments, paths, src),
        metric=metric.name,
        mode=metric.mode,
        max_parallel=None,
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


def _expand(
    data: Mapping[str, Any],
    base_name: str,
    assignments: list[Assignment],
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
        shown = ", ".join(f"{k}={show(v)}" for k, v in assignment)
        items.append((point_data, f"{src}: point {index} ({shown})"))
    configs = job_configs_from_dicts(items)
    return tuple(
        SweepPoint(index=i, overrides=a, config=c)
        for i, (a, c) in enumerate(zip(assignments, configs, strict=True))
    )


def _swept_paths(sweep: SweepSection, src: str) -> dict[str, tuple[str, ...]]:
    """Each swept key (grid, list, random) checked against the job schema -> its path."""
    paths: dict[str, tuple[str, ...]] = {}
    keyed = [("sweep.grid", [k for k, _ in sweep.grid or ()])]
    keyed += [
        (f"sweep.list[{i}]", [k for k, _ in point]) for i, point in enumerate(sweep.list or ())
    ]
    if sweep.random is not None:
        keyed.append(("sweep.random.params", [k for k, _ in sweep.random.params]))
    for where, keys in keyed:
        for key in keys:
            if key == "name":
                raise ConfigError(
                    f"{src}: {where}.name: cannot be swept; each point is named "
                    "<base name>-<index>. HINT: set name in the base"
                )
            if key not in paths:  # did-you-mean on a typo, the job's own message
                paths[key] = split_key(key, f"{src}: {where}")
    return paths


def _draw(spec: RandomSpec) -> list[Assignment]:
    rng = random.Random(spec.seed)
    samplers = [(key, _sampler(dist)) for key, dist in spec.params]
    return [tuple((key, draw(rng)) for key, draw in samplers) for _ in range(spec.samples)]


def _sampler(dist: Distribution) -> _Sampler:
    """Draws from a checked distribution."""
    if dist.kind == "choice":
        options = dist.args
        return lambda rng: rng.choice(options)
    low, high = dist.args
    if dist.kind == "randint":
        return lambda rng: rng.randint(low, high)
    if dist.kind == "uniform":
        return lambda rng: rng.uniform(low, high)
    log_low, log_high = math.log(low), math.log(high)
    return lambda rng: math.exp(rng.uniform(log_low, log_high))
