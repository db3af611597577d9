"""Writing a sweep directory: ``sweep.yaml``, ``logs/``, ``task_configs.jsonl``, ``tasks/``,
offset links (``arrays.json``: :func:`hpc_ddp.backends.arrays.write_arrays`).

The layout is described in :mod:`hpc_ddp.sweep.records`; :mod:`hpc_ddp.sweep.results` reads it
back. A thousand task configs are written in a few milliseconds: their YAML comes from
:mod:`hpc_ddp.sweep.configtext`, and they go into one file, each task writing its own
``tasks/<i>/config.yaml`` from it when it starts (see :func:`write_sweep_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpc_ddp.backends.arrays import ArrayPlan
from hpc_ddp.config.yaml_dialect import dump_yaml
from hpc_ddp.durable import fsync_dir, write_text_atomic
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.taskconfig import pack_task_configs
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
    """Write ``sweep.yaml``, the sweep's ``logs/``, ``tasks/`` and ``task_configs.jsonl``.

    Every point's ``config.yaml`` text goes into the one file ``task_configs.jsonl``, written
    atomically with one fsync; nothing is written per point. Each task makes its own
    ``tasks/<i>/`` when it starts: the batch script its ``logs/`` (for the rank logs) before
    ``srun``, and ``hpc-ddp run`` (or the supervisor) its ``config.yaml`` from that file
    (:func:`~hpc_ddp.rundir.taskconfig.materialise_task_config`). A directory and a file per
    point were two thousand file-system operations for 1,000 points, most of the submit time.
    ``checkpoints/`` and ``rendezvous/`` are made by the runtime on first use. Slurm opens the
    batch logs before the script runs, so they go to the sweep's ``logs/``.

    A point with its own ``slurm.template`` still gets ``tasks/<i>/logs/`` and its
    ``config.yaml`` here, as before: a template copied before the default one made the logs
    directory would not make it, and its script may read the config before ``hpc-ddp run``
    does. Those few files are not fsynced one by one (nothing reads them before the array is
    submitted, after this returns; visibility on the compute nodes comes from close() on
    shared filesystems, not from fsync): ``tasks/`` is fsynced once.
    """
    texts = config_texts([p.config for p in spec.points])
    paths = RunPaths(sweep_dir)
    paths.tasks.mkdir(parents=True)
    paths.logs.mkdir()
    templated = [
        (point.index, text)
        for point, text in zip(spec.points, texts, strict=True)
        if point.config.slurm.template is not None
    ]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for index, text in templated:
        task = paths.task(index)
        task.logs.mkdir(parents=True)
        fd = os.open(task.config, flags, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    if templated:
        fsync_dir(paths.tasks)
    packed = pack_task_configs((p.index, text) for p, text in zip(spec.points, texts, strict=True))
    write_text_atomic(paths.task_configs, packed)
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
