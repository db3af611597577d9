"""The local backend: the same runtime in ``nodes x tasks_per_node`` processes on this machine.

submitit's LocalExecutor already starts N real task processes, watches them and forwards
signals, so it does that job here. Each task maps submitit's ids onto the torchrun-style
variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and then runs exactly what ``hpc-ddp run``
runs on a Slurm task: the run directory is the same, logs and checkpoints included.

Imports submitit (and, in the task, torch) only when used: never on the dry-run path.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.config import JobConfig
from hpc_ddp.rundir import RunPaths
from hpc_ddp.units import parse_slurm_time


@dataclass(frozen=True)
class LocalJob:
    """A running local job: submitit's handle and the controller pid used as its job id."""

    job_id: str
    handle: Any


def free_port() -> int:
    """A TCP port that is free on loopback right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_task(run_dir: str, master_port: int) -> int:
    """Body of one local task: set the dist variables from submitit's, then run the job."""
    import submitit

    from hpc_ddp.runtime import run_job

    env = submitit.JobEnvironment()
    # Started from inside a Slurm allocation, the tasks would inherit its job id and ask Slurm
    # to requeue a job that is not theirs: a local run is not a Slurm job.
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SLURMD_"))]:
        del os.environ[key]
    os.environ.update(
        {
            "RANK": str(env.global_rank),
            "LOCAL_RANK": str(env.local_rank),
            "WORLD_SIZE": str(env.num_tasks),
            "LOCAL_WORLD_SIZE": str(env.num_tasks),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "HPC_DDP_LOCAL_JOB_ID": str(env.job_id),
            "HPC_DDP_PER_RANK_LOGS": "1",
        }
    )
    from hpc_ddp.rundir import RunPaths
    from hpc_ddp.runtime import redirect_to_rank_logs, task_run_dir

    redirect_to_rank_logs(RunPaths(task_run_dir(Path(run_dir), os.environ)), env.global_rank)
    return run_job(Path(run_dir), os.environ)


def submit_local(cfg: JobConfig, paths: RunPaths) -> LocalJob:
    """Start the job's tasks as local processes; returns at once."""
    import submitit

    executor = submitit.LocalExecutor(folder=str(paths.root / "submitit"))
    executor.update_parameters(
        tasks_per_node=cfg.slurm.ntasks,
        nodes=1,
        timeout_min=max(1, parse_slurm_time(cfg.slurm.time) // 60),
        # Mirror the rendered --signal: submitit sends USR2 this long before the timeout.
        signal_delay_s=cfg.requeue.lead_time,
    )
    job = executor.submit(run_task, str(paths.root), free_port())
    return LocalJob(job_id=str(job.job_id), handle=job)


def wait_local(job: LocalJob, follow: Path | None = None, poll_s: float = 0.5) -> str:
    """Wait until a local job ends, copying ``follow`` (a log file) to stderr meanwhile.

    Returns submitit's final state string.
    """
    offset = 0

    def copy_new() -> None:
        nonlocal offset
        if follow is None or not follow.exists():
            return
        with follow.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()

    while not job.handle.done():
        copy_new()
        time.sleep(poll_s)
    copy_new()
    return str(job.handle.state)
