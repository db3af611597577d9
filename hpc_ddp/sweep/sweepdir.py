"""Writing a sweep directory: ``sweep.yaml``, ``logs/``, every ``tasks/<i>/``, offset links,
``arrays.json``.

The layout is described in :mod:`hpc_ddp.sweep.results`, which reads it back. A thousand task
configs are written in well under a second: their YAML comes from :mod:`hpc_ddp.sweep.configtext`
and they are not fsynced one by one (see :func:`write_sweep_dir`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

from hpc_ddp.config.yaml_dialect import dump_yaml
from hpc_ddp.durable import fsync_dir, write_text_atomic
from hpc_ddp.layout import RunPaths
from hpc_ddp.slurm.arrayjobs import ARRAYS_RECORD, ArrayRecord
from hpc_ddp.sweep.arrays import ArrayPlan
from hpc_ddp.sweep.configtext import config_texts
from hpc_ddp.sweep.records import SWEEP_RECORD
from hpc_ddp.sweep.spec import SweepSpec


def sweep_record_text(spec: SweepSpec, name: str, sweep_file: Path) -> str:
    """``sweep.yaml``: a YAML head, then one JSON object per point (JSON is YAML too, and a
    thousand points are written and read back in milliseconds)."""
    keys = list(dict.fromkeys(k for p in spec.points for k, _ in p.overrides))
    head = {
        "name": name,
        "sweep_file": str(sweep_file),
        "base": spec.base_source,
        "metric": {"name": spec.metric, "mode": spec.mode},
        "max_parallel": spec.max_parallel,
        "keys": keys,
    }
    lines = [
        "# Written by hpc-ddp sweep: the expanded points; `hpc-ddp results` reads this file.\n",
        dump_yaml(head),
        "points:\n",
    ]
    for p in spec.points:
        point = {"index": p.index, "name": p.config.name, "overrides": dict(p.overrides)}
        lines.append(f"- {json.dumps(point)}\n")
    return "".join(lines)


def write_sweep_dir(sweep_dir: Path, spec: SweepSpec, record: str) -> None:
    """Write ``sweep.yaml``, the sweep's ``logs/`` and every ``tasks/<i>/config.yaml``.

    Each config is written straight to its final name in a directory this call created, and
    not fsynced one by one: nothing reads it before the array is submitted (after this returns),
    a crash before then leaves a sweep directory with no manifest that nothing will run, and
    visibility on the compute nodes comes from close() on shared filesystems, not from fsync.
    One fsync per file cost 1.8 s for 1,000 points here; the directories are fsynced once.
    ``checkpoints/`` and ``rendezvous/`` are made by the runtime on first use, and a task's
    ``logs/`` by the batch script before ``srun`` (a third of the file-system operations
    here, and of the submit time, went to them); Slurm opens the batch logs before the script
    runs, so they go to the sweep's ``logs/``. A point with its own ``slurm.template`` still
    gets its ``logs/`` here: a template copied before the script made it would not.
    """
    texts = config_texts([p.config for p in spec.points])
    tasks = RunPaths(sweep_dir).tasks
    tasks.mkdir(parents=True)
    RunPaths(sweep_dir).logs.mkdir()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for point, text in zip(spec.points, texts, strict=True):
        root = os.path.join(tasks, str(point.index))
        os.mkdir(root)
        if point.config.slurm.template is not None:
            os.mkdir(os.path.join(root, "logs"))
        fd = os.open(os.path.join(root, "config.yaml"), flags, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    for directory in (tasks, sweep_dir):
        fsync_dir(directory)
    write_text_atomic(sweep_dir / SWEEP_RECORD, record)


def link_offset_tasks(sweep_dir: Path, plan: ArrayPlan) -> None:
    """``arrays/<offset>/<t>`` -> ``../../tasks/<t + offset>``: where an offset array's logs go
    (Slurm's ``%a`` in a log path cannot add the offset; see ``RenderContext.array_offset``)."""
    if not plan.offset:
        return
    links = sweep_dir / "arrays" / str(plan.offset)
    links.mkdir(parents=True, exist_ok=True)
    for point in plan.points:
        link = links / str(point - plan.offset)
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "tasks", str(point)))


def write_arrays(sweep_dir: Path, records: Sequence[ArrayRecord]) -> None:
    """Write ``arrays.json`` atomically."""
    data = [dataclasses.asdict(r) for r in records]
    write_text_atomic(sweep_dir / ARRAYS_RECORD, json.dumps(data, indent=1) + "\n")
