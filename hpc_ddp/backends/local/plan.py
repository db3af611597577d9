"""A local run's plan: what a local submission starts on this machine.

``slurm.nodes x slurm.tasks_per_node`` processes (one controller task, the supervisor, with
``fault.enabled``), refused when this machine cannot sensibly run them; the GPUs each rank sees,
as Slurm would give them; the environment they start from, as the Slurm script exports it; and
the loopback port the ranks of a launch meet on. ``--dry-run`` describes it; nothing here starts
a process (:mod:`hpc_ddp.backends.local.controller` does).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from pathlib import Path

from hpc_ddp.backends.ports import PORT_BASE, PORT_SLOTS
from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUN_DIR_ENV, RunPaths


def local_gpu_plan(slurm: SlurmConfig, parent_visible: str | None) -> list[str]:
    """Each local rank's ``CUDA_VISIBLE_DEVICES``, as Slurm would give it (pure).

    ``gpus_per_task: g``: rank r sees its own g GPUs, items ``r*g`` to ``r*g+g-1`` of this
    machine's (as srun binds them; each rank computes on ``cuda:0``). ``gpus_per_node: g``:
    every rank sees the same ``g x nodes`` (each computes on its share). No GPUs asked: ``""``,
    none. ``parent_visible`` is this process's ``CUDA_VISIBLE_DEVICES``: its items (indices,
    UUIDs or MIG ids) are handed on verbatim; unset means the machine's GPUs 0, 1, ... (a rank
    then given one the machine lacks says so when it starts).
    """
    ntasks, per_task = slurm.ntasks, slurm.gpus_per_task
    needed = per_task * ntasks if per_task else (slurm.gpus_per_node or 0) * slurm.nodes
    if not needed:
        return [""] * ntasks
    if parent_visible is None:
        pool = [str(i) for i in range(needed)]
    else:
        pool = [item.strip() for item in parent_visible.split(",") if item.strip()]
    if len(pool) < needed:
        key = "slurm.gpus_per_task" if per_task else "slurm.gpus_per_node"
        raise ConfigError(
            f"{key} asks for {needed} GPU(s) in all for {ntasks} local rank(s), but "
            f"CUDA_VISIBLE_DEVICES={parent_visible!r} lists {len(pool)}. HINT: list more GPUs "
            "in CUDA_VISIBLE_DEVICES, or ask for fewer (--backend local runs every rank on this "
            "machine)."
        )
    if per_task:
        return [",".join(pool[r * per_task : (r + 1) * per_task]) for r in range(ntasks)]
    return [",".join(pool[:needed])] * ntasks


LOCAL_CPU_FACTOR = 4
"""A local job may start this many processes per CPU this process may run on, at most ..."""
LOCAL_MAX_PROCESSES = 256
"""... and never more than this: each is a whole Python process with torch loaded."""


def check_local_size(ntasks: int, cpus: int) -> None:
    """Refuse a local job with more processes than this machine can sensibly run (``cpus``:
    the CPUs this process may run on)."""
    limit = min(LOCAL_MAX_PROCESSES, max(1, cpus) * LOCAL_CPU_FACTOR)
    if ntasks <= limit:
        return
    why = (
        f"the hard cap of {LOCAL_MAX_PROCESSES}"
        if limit == LOCAL_MAX_PROCESSES
        else f"{LOCAL_CPU_FACTOR} per CPU this process may use: {cpus} CPUs"
    )
    raise ConfigError(
        f"slurm.nodes x slurm.tasks_per_node = {ntasks} local processes, more than {limit} "
        f"({why}); nothing was created. HINT: lower slurm.nodes or slurm.tasks_per_node "
        "(e.g. slurm.nodes=1 slurm.tasks_per_node=2), or submit it to Slurm (--backend slurm)."
    )


def check_local_job(cfg: JobConfig) -> None:
    """:func:`check_local_size` for ``cfg`` on this machine (its CPU affinity, which a
    container or ``taskset`` may keep below the machine's count)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; a dry run may be elsewhere
    cpus = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    check_local_size(cfg.slurm.ntasks, cpus)
    _local_gpus(cfg)  # the GPUs asked for are listed here, before anything is written


def _local_gpus(cfg: JobConfig) -> list[str]:
    return local_gpu_plan(cfg.slurm, os.environ.get("CUDA_VISIBLE_DEVICES"))


def describe_local_plan(cfg: JobConfig, run_dir: Path) -> str:
    """What a local start would do, for ``--dry-run`` (no sbatch runs, so none is shown)."""
    n = cfg.slurm.ntasks
    minutes = max(1, cfg.slurm.time_s // 60)
    how = "with submitit's local executor"
    if cfg.fault.enabled:
        how = "under a supervisor (the local executor's one task) that restarts them on a fault"
    return (
        f"# backend: local; would start {n} process(es) on this machine (ranks 0-{n - 1}, "
        f"MASTER_ADDR=127.0.0.1) {how} in {run_dir}/submitit, each "
        f"running the job as `hpc-ddp run {run_dir}` does on a Slurm task; time limit "
        f"{minutes} min, USR2 {cfg.requeue.lead_s} s before it"
    ) + _gpu_words(_local_gpus(cfg))


def _gpu_words(gpus: list[str]) -> str:
    if not any(gpus):
        return ""
    return "; CUDA_VISIBLE_DEVICES by rank: " + " | ".join(gpus)


def job_environment(cfg: JobConfig, paths: RunPaths, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a local job's controller, and so every task and rank, starts from (pure).

    ``base`` (the submitter's) with ``env.vars`` exported over it, each value verbatim, then
    the variables the Slurm script exports after them (``slurm_templates/default.sbatch.j2``):
    the run directory and unbuffered output. Each task sets its own distributed variables and
    GPUs on top, as srun does on a Slurm task.
    """
    return {
        **base,
        **dict(cfg.env.vars),
        RUN_DIR_ENV: str(paths.root),
        "PYTHONUNBUFFERED": "1",
    }


FREE_PORT_TRIES = 64


def free_port(pick: random.Random | None = None) -> int:
    """A TCP port that is free right now, where a launch's ranks meet (``MASTER_ADDR``
    127.0.0.1): one of the derived ports' range (:data:`~hpc_ddp.backends.ports.PORT_BASE`),
    below the kernel's ephemeral range. A port the kernel picks (``bind`` to port 0) lies in
    that range, where any process's next outgoing connection (gloo makes many) may take it
    before rank 0 listens on it: a loaded test suite saw rank 0 fail with EADDRINUSE."""
    pick = pick or random.SystemRandom()
    for _ in range(FREE_PORT_TRIES):
        port = PORT_BASE + pick.randrange(PORT_SLOTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
