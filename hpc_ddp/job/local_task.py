"""The local backend's tasks: what submitit's controller runs on this machine
(:mod:`hpc_ddp.backends.local.controller`), as srun runs ``hpc-ddp run`` on a Slurm job's
tasks (:mod:`hpc_ddp.job.task`) and the batch script ``hpc-ddp supervise``.

* :func:`run_task`: one task, a global rank. It maps submitit's ids onto the torchrun-style
  variables (RANK, WORLD_SIZE, MASTER_ADDR, ...), takes its own GPUs, and then runs exactly
  what ``hpc-ddp run`` runs (:func:`~hpc_ddp.job.task.run_job`).
* :func:`run_supervisor`: with ``fault.enabled``, the controller's one task, the supervisor
  (:mod:`hpc_ddp.fault.supervisor`), whose launcher starts each launch's ranks as processes of
  this machine (the local backend's launcher, from
  :func:`~hpc_ddp.backends.node_registry.local_launcher`).

No task outlives its controller: each asks the kernel for a SIGTERM when the controller dies
(the stop a cancel gives: the ranks agree on a step, rank 0 saves), and a rank records its
identity in ``RUN_DIR/local-ranks/`` so that ``status``, ``cancel`` and ``resume`` still see it
if that failed (:func:`~hpc_ddp.backends.node_registry.record_local_rank`).

submitit pickles these entries by name in the login process, which imports this module: it
imports submitit, the supervisor and the job only when they run, in the task.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from hpc_ddp.backends.node_registry import record_local_rank
from hpc_ddp.rundir.layout import (
    LOCAL_GPUS_ENV,
    LOCAL_GPUS_PER_TASK_ENV,
    LOCAL_JOB_ENV,
    NO_PDEATHSIG_ENV,
    PER_RANK_LOGS_ENV,
    RunPaths,
)

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_supervisor(run_dir: str, gpus: list[str] | None = None, per_task: int | None = None) -> int:
    """The body of a supervised local run's one controller task: supervise its launches."""
    import submitit

    from hpc_ddp.backends.node_registry import local_launcher
    from hpc_ddp.config.load import load_resolved_config
    from hpc_ddp.exitcodes import NOT_CURRENT_EXIT_CODE
    from hpc_ddp.fault.launch_ledger import Identity
    from hpc_ddp.fault.supervisor import Supervisor
    from hpc_ddp.job.task import not_current_refusal

    job = submitit.JobEnvironment().job_id
    if os.environ.get(NO_PDEATHSIG_ENV) != "1":
        die_with_controller(int(job) if job.isdigit() else os.getppid())
    root = Path(run_dir)
    paths = RunPaths(root)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    refusal = not_current_refusal(root, root, os.environ, job)
    if refusal is not None:
        print(f"hpc-ddp supervise: refused: {refusal}", file=sys.stderr, flush=True)
        return NOT_CURRENT_EXIT_CODE
    cfg = load_resolved_config(paths.config)
    launcher, cancelled = local_launcher(root, cfg.slurm.ntasks, job, gpus=gpus, per_task=per_task)
    me = Identity(None, None, 0, tag=f"local-{job}")
    supervisor = Supervisor(paths, cfg, launcher, me, env=os.environ, cancelled=cancelled)
    supervisor.install_signals()
    return supervisor.run()


class _StoppedEarly(BaseException):
    """SIGTERM while no session catches it (before training started): nothing to save."""


def _stop_early(signum: int, frame: FrameType | None) -> None:
    del frame
    raise _StoppedEarly(signum)


def die_with_controller(controller: int) -> None:
    """Ask the kernel to SIGTERM this task when its controller dies (``PR_SET_PDEATHSIG``).

    A controller killed outright (SIGKILL, the OOM killer) forwards nothing: without this its
    ranks would train on, orphaned, and a resume would start a second job in the run dir.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    args = [ctypes.c_ulong(int(signal.SIGTERM))] + [ctypes.c_ulong(0)] * 3  # prctl is variadic
    if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *args) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        return
    # A controller that died before the prctl sends nothing: this task was reparented already.
    if os.getppid() != controller:
        raise _StoppedEarly(signal.SIGTERM)


def _give_gpus(gpus: list[str], rank: int, per_task: int | None) -> None:
    # submitit gives every task the same CUDA_VISIBLE_DEVICES ("" unless told its own numbers,
    # and never a UUID): replaced here, before anything in this process can start CUDA.
    mine = gpus[rank]
    os.environ["CUDA_VISIBLE_DEVICES"] = mine
    os.environ[LOCAL_GPUS_ENV] = str(len([d for d in mine.split(",") if d]))
    if per_task:
        os.environ[LOCAL_GPUS_PER_TASK_ENV] = str(per_task)


def run_task(
    run_dir: str, master_port: int, gpus: list[str] | None = None, per_task: int | None = None
) -> int:
    """Body of one local task: set the dist variables from submitit's, then run the job.

    ``gpus``: each rank's ``CUDA_VISIBLE_DEVICES``
    (:func:`~hpc_ddp.backends.local.plan.local_gpu_plan`), ``per_task`` the job's
    ``slurm.gpus_per_task``; None leaves the environment's as it is.
    """
    import submitit

    from hpc_ddp.job.task import run_job

    env = submitit.JobEnvironment()
    if gpus is not None:
        _give_gpus(gpus, env.global_rank, per_task)
    # Until the session catches stop signals, a SIGTERM (a cancel, the controller's death)
    # ends the task at once: submitit's own handler would only log it and train on.
    signal.signal(signal.SIGTERM, _stop_early)
    try:
        if os.environ.get(NO_PDEATHSIG_ENV) != "1":
            die_with_controller(int(env.job_id) if env.job_id.isdigit() else os.getppid())
        record_local_rank(Path(run_dir), env.global_rank, os.getpid())
        _set_dist_env(env.global_rank, env.local_rank, env.num_tasks, master_port, env.job_id)
        from hpc_ddp.job.task import redirect_to_rank_logs, task_run_dir

        redirect_to_rank_logs(RunPaths(task_run_dir(Path(run_dir), os.environ)), env.global_rank)
        # The controller's pid is the job id the run's manifest records.
        return run_job(Path(run_dir), os.environ, job_id=env.job_id)
    except _StoppedEarly as stop:
        name = signal.Signals(stop.args[0]).name
        raise RuntimeError(
            f"{name} before training started (the run was cancelled or its controller "
            "exited): stopped, nothing to save"
        ) from None
    finally:
        # The task is over: a late SIGTERM must not turn its result into a failure.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _set_dist_env(rank: int, local_rank: int, world: int, master_port: int, job: str) -> None:
    # Started from inside a Slurm allocation, the tasks would inherit its job id and ask Slurm
    # to requeue a job that is not theirs: a local run is not a Slurm job.
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SLURMD_"))]:
        del os.environ[key]
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            PER_RANK_LOGS_ENV: "1",
            LOCAL_JOB_ENV: job,  # the launcher is this backend (not torchrun), and its job
        }
    )
