"""Planning a sweep's job arrays and rendering their scripts (pure: a dry run shows these).

Task ids must stay below the cluster's ``MaxArraySize``: :func:`plan_arrays` splits the points
into as few arrays as that allows, one per script variant (:func:`script_groups`), and
:func:`prepare_arrays` renders each array's ``sbatch`` script. The lemon nodes each point's
array leaves out (``--exclude``) are decided before, as a submit decides them
(:func:`hpc_ddp.backends.slurm.sweeps.lemon_exclusions`), and passed in.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.arrays import ArrayPlan, PreparedArray
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.render import RenderContext, load_template, render_sbatch
from hpc_ddp.config.model import JobConfig
from hpc_ddp.version import __version__

if TYPE_CHECKING:
    from hpc_ddp.lemons.record import Exclusion

SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default ``MaxArraySize``, assumed by a dry run that cannot ask the cluster."""


def script_name(number: int) -> str:
    """The script of the sweep's ``number``-th array: ``job.sbatch``, then ``job-1.sbatch``..."""
    return "job.sbatch" if number == 0 else f"job-{number}.sbatch"


def plan_arrays(
    points: Sequence[int], groups: Sequence[int], max_array_size: int
) -> list[ArrayPlan]:
    """Split ``points`` (with the script ``groups[i]`` of ``points[i]``) into as few arrays as
    ``MaxArraySize`` allows.

    Task ids must stay below ``max_array_size``. Points below it keep their own index as task
    id (offset 0: ``tasks/$SLURM_ARRAY_TASK_ID``); the rest are covered greedily by windows of
    ``max_array_size`` starting at the first point not yet covered, which for a whole sweep
    ``0..n-1`` gives exactly :func:`hpc_ddp.sweep.spec.chunk_array`'s ranges.
    """
    if max_array_size < 1:
        raise ValueError(f"MaxArraySize must be at least 1, got {max_array_size}")
    by_group: dict[int, list[int]] = {}
    for point, group in sorted(zip(points, groups, strict=True)):
        by_group.setdefault(group, []).append(point)
    plans = []
    for group, members in by_group.items():
        i = 0
        while i < len(members):
            offset = 0 if members[i] < max_array_size else members[i]
            j = i
            while j < len(members) and members[j] < offset + max_array_size:
                j += 1
            plans.append(ArrayPlan(tuple(members[i:j]), offset, group))
            i = j
    return sorted(plans, key=lambda p: (p.points[0], p.group))


def script_groups(
    configs: Sequence[JobConfig], lemons: Sequence[Exclusion | None] | None = None
) -> list[int]:
    """Group index per config: one script serves every point whose rendered sections match,
    and whose lemon exclusion (``lemons``, one per config) is the same."""
    marks = lemons if lemons is not None else [None] * len(configs)
    seen: dict[tuple[object, ...], int] = {}
    return [
        seen.setdefault((c.slurm, c.env, c.requeue, mark), len(seen))
        for c, mark in zip(configs, marks, strict=True)
    ]


def prepare_arrays(
    configs: Mapping[int, JobConfig],
    *,
    name: str,
    sweep_dir: Path,
    max_parallel: int | None,
    max_array_size: int,
    template_dir: Path,
    python: str,
    config_source: str,
    invocation: Sequence[str],
    client: SlurmClient,
    first_number: int = 0,
    now: datetime | None = None,
    lemons: Mapping[int, Exclusion] | None = None,
) -> list[PreparedArray]:
    """Plan the arrays for the points in ``configs`` and render each one's script (pure).
    ``lemons``: what each point's array does with the lemon record (its ``--exclude``); a
    point not in it excludes nothing."""
    now = now or datetime.now(timezone.utc)
    points = sorted(configs)
    marks = [(lemons or {}).get(p) for p in points]
    groups = script_groups([configs[p] for p in points], marks)
    representative = {g: (configs[p], m) for p, g, m in zip(points, groups, marks, strict=True)}
    out = []
    for number, plan in enumerate(plan_arrays(points, groups, max_array_size), first_number):
        chosen, exclusion = representative[plan.group]
        cfg = dataclasses.replace(chosen, name=name)
        spec = plan.spec(max_parallel)
        path = sweep_dir / script_name(number)
        argv = tuple(client.submit_command(path))
        ctx = RenderContext(
            run_dir=str(sweep_dir),
            python=python,
            config_source=config_source,
            submit_command=f"{shlex.join(invocation)}  ->  {shlex.join(argv)}",
            generated_at=now.isoformat(timespec="seconds"),
            version=__version__,
            exclude=exclusion.nodes if exclusion is not None else (),
            array=spec,
            array_offset=plan.offset,
        )
        script = render_sbatch(cfg, ctx, load_template(cfg, template_dir))
        out.append(PreparedArray(plan, spec, script_name(number), script, argv, exclusion))
    return out
