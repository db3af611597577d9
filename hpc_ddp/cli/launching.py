"""Starting a prepared run and telling the user where it went: shared by ``submit`` and
``resume`` so both print, wait and exit the same way."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.units import parse_slurm_time
from hpc_ddp.errors import ConfigError
from hpc_ddp.manifest import write_manifest
from hpc_ddp.slurm.submission import Prepared, materialize, record

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


def describe_local_plan(cfg: JobConfig, run_dir: Path) -> str:
    """What a local submit would do, for ``--dry-run`` (no sbatch runs, so none is shown)."""
    n = cfg.slurm.ntasks
    minutes = max(1, parse_slurm_time(cfg.slurm.time) // 60)
    return (
        f"# backend: local; would start {n} process(es) on this machine (ranks 0-{n - 1}, "
        f"MASTER_ADDR=127.0.0.1) with submitit's local executor in {run_dir}/submitit, each "
        f"running the job as `hpc-ddp run {run_dir}` does on a Slurm task; time limit "
        f"{minutes} min, USR2 {cfg.requeue.lead_time} s before it"
    )


def submit_local(
    prepared: Prepared, *, wait: bool, as_json: bool, previous_jobs: Sequence[str] = ()
) -> int:
    """Start ``prepared`` as local processes (writing its run dir unless it exists already);
    with ``wait``, follow rank 0's progress and exit 1 unless every rank finished.
    ``previous_jobs``: the run's earlier job ids, kept in its manifest (a resumed run)."""
    from hpc_ddp.local.backend import submit_local as start_local
    from hpc_ddp.local.backend import wait_local
    from hpc_ddp.local.process import unmark_cancelled, was_cancelled

    check_local_job(prepared.cfg)  # before anything is created
    if not prepared.created:
        prepared = materialize(prepared)
    unmark_cancelled(prepared.paths.root)  # a resumed run's earlier cancel is not this one's
    log = prepared.paths.rank_log(0, "err")
    # Rank 0's progress goes to its stderr (logging), as on Slurm; a resumed run appends to it.
    follow_from = log.stat().st_size if log.exists() else 0
    job = start_local(prepared.cfg, prepared.paths)
    manifest = record(
        prepared, backend="local", job_id=job.job_id, command=["submitit-local", job.job_id]
    )
    if previous_jobs:
        manifest = dataclasses.replace(manifest, previous_jobs=list(previous_jobs))
        write_manifest(prepared.paths, manifest)
    report(prepared, "local", job.job_id, as_json)
    if not wait:
        return 0
    result = wait_local(job, follow=log, follow_from=follow_from)
    cancelled = was_cancelled(prepared.paths.root)
    print(result.describe(cancelled), file=sys.stderr)
    if result.state(cancelled) == "FAILED":
        print(f"  logs: {prepared.paths.logs}/rank-N.err (tracebacks)", file=sys.stderr)
    return 0 if result.state(cancelled) == "COMPLETED" else 1


def report(prepared: Prepared, backend: str, job_id: str | None, as_json: bool) -> None:
    """Print the job id, the run directory and where its logs go (or one JSON object)."""
    logs = prepared.paths.logs
    if as_json:
        print(
            json.dumps(
                {
                    "backend": backend,
                    "job_id": job_id,
                    "run_dir": str(prepared.paths.root),
                    "logs": str(logs),
                }
            )
        )
        return
    print(f"submitted {prepared.cfg.name} as {backend} job {job_id}")
    print(f"  run dir: {prepared.paths.root}")
    print(f"  logs:    {logs}/ (rank-N.out, rank-N.err)")
    print(f"  watch:   hpc-ddp status {prepared.paths.root}")
