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
    show,
)
from hpc_ddp.config.yaml_dialect import read_yaml
from hpc_ddp.errors import ConfigError

__all__ = ["MAX_SWEEP_POINTS", "SweepPoint", "SweepSpec", "chunk_array", "load_sweep"]


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


_Sampler = Callable[[random.Random], Any]


def load_sweep(
    path: Path, overrides: Sequence[str] = (), site_profile: Path | None = None
) -> SweepSpec:
    """Read a sweep file and expand and validate every point.

    ``overrides`` (``KEY=VALUE`` from the command line) apply to the base before the sweep's
    values, so a swept key wins over an override of the same key.
    """
    src = str(path)
    # The whole file's shape and its point count are checked before the base is read.
    doc: SweepFile = SWEEP_SCHEMA.convert(read_yaml(path, "sweep file"), src)
    sweep = doc.sweep
    paths = _swept_paths(sweep, src)
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
    axes = [[(key, value) for value in values] for key, values in sweep.grid or ()]
    assignments: list[Assignment] = [
        *(itertools.product(*axes) if axes else ()),  # no axes: no points, not one empty one
        *(sweep.list or ()),
        *(_draw(sweep.random) if sweep.random else ()),
    ]
    return SweepSpec(
        base_source=base_source,
        points=_expand(data, base_cfg.name, assignments, paths, src),
        metric=sweep.metric.name,
        mode=sweep.metric.mode,
        max_parallel=sweep.max_parallel,
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
