"""What every task runs: ``hpc-ddp run RUN_DIR`` (under srun, or as a local process).

It finds this task's run directory (a sweep task's own under ``tasks/<index>``), reads the
resolved config, and hands over to the job: the built-in trainer, a Python entry point, or a
user command. All three go through the same session for signals, checkpoints and requeue.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import resolve_command
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.rundir import RUN_DIR_ENV, RUN_ID_ENV, RunPaths, read_run_id

log = logging.getLogger(__name__)


def task_run_dir(run_dir: Path, env: Mapping[str, str]) -> Path:
    """This task's run directory: ``run_dir`` itself, or ``run_dir/tasks/<i>`` in an array."""
    from hpc_ddp.runtime.distenv import array_task_index

    index = array_task_index(env)  # a DistEnvError names a variable that is not a number
    if index is not None and (run_dir / "tasks").is_dir():
        task = RunPaths(run_dir).task(index).root
        if not (task / "config.yaml").is_file():
            raise RunDirError(
                f"{task}: array task {env['SLURM_ARRAY_TASK_ID']} has no config.yaml. "
                "HINT: the sweep directory is incomplete; resubmit with `hpc-ddp sweep`."
            )
        return task
    if not (run_dir / "config.yaml").is_file():
        raise RunDirError(
            f"{run_dir}: no config.yaml. HINT: pass a run directory made by `hpc-ddp submit`."
        )
    return run_dir


def resolve_entrypoint(spec: str) -> object:
    """Import ``pkg.mod:fn`` and return ``fn``; a bad spec is a ConfigError with a hint."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"entrypoint {spec!r} cannot be loaded: {exc}. "
            "HINT: the module must be importable on the compute node (check PYTHONPATH or "
            "env.setup)."
        ) from None


def run_command(cfg: JobConfig, paths: RunPaths, env: Mapping[str, str]) -> int:
    """Run the user's ``command`` on this task with the distributed variables set.

    The child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    and HPC_DDP_RUN_DIR; stop signals are forwarded to it, and it is expected to use
    ``hpc_ddp.session()`` for checkpoints and requeue. ``{params.NAME}`` placeholders are
    substituted from this task's own config (a sweep point's values), each within its argv
    item: there is no shell to split or interpret them.
    """
    from hpc_ddp.runtime.distenv import derive_dist_env
    from hpc_ddp.runtime.ports import resolve_master_port

    assert cfg.command is not None
    dist = derive_dist_env(env, port=cfg.dist.port)
    port = resolve_master_port(dist, paths.rendezvous, timeout_s=cfg.dist.timeout_s)
    child_env = {
        **env,
        **dist.as_environ(),
        "MASTER_PORT": str(port),
        RUN_DIR_ENV: str(paths.root),
        RUN_ID_ENV: read_run_id(paths),
    }
    # With MASTER_PORT set, the child's session takes the port as given (launcher-set).
    argv = resolve_command(cfg.command, cfg.params)  # checked when the config was loaded
    proc = subprocess.Popen(list(argv), env=child_env)

    def forward(signum: int, frame: object) -> None:
        del frame
        proc.send_signal(signum)

    for sig in {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}:
        signal.signal(sig, forward)
    return proc.wait()


def run_job(run_dir: Path, env: Mapping[str, str]) -> int:
    """Run the job in ``run_dir`` on this task; returns the process exit code."""
    from hpc_ddp.config.load import load_resolved_config

    paths = RunPaths(task_run_dir(run_dir, env))
    cfg = load_resolved_config(paths.config)
    # Before torch is imported: one intra-op thread per CPU Slurm gave this task, not one per
    # core of the node (which oversubscribes a shared node and slows every rank).
    os.environ.setdefault("OMP_NUM_THREADS", env.get("SLURM_CPUS_PER_TASK", "1"))
    if cfg.command:
        return run_command(cfg, paths, env)
    from hpc_ddp.runtime.session import RequeueExit

    try:
        if cfg.entrypoint:
            return run_entrypoint(cfg.entrypoint, paths)
        return run_builtin_trainer(cfg, paths, env)
    except RequeueExit as stop:
        code = int(stop.code or 0)
        if code:
            # Every rank leaves with this code; srun (--kill-on-bad-exit) SIGTERMs the ranks
            # still shutting down, and Python restores default handlers at exit: a late rank
            # would die of it and turn the job's exit code (3, 4) into 143.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return code


def run_entrypoint(spec: str, paths: RunPaths) -> int:
    """Call the job's ``pkg.mod:fn`` with the run directory and id in the environment."""
    fn = resolve_entrypoint(spec)
    os.environ[RUN_DIR_ENV] = str(paths.root)
    os.environ[RUN_ID_ENV] = read_run_id(paths)
    result = fn()  # type: ignore[operator]
    return int(result) if isinstance(result, int) else 0


def run_builtin_trainer(cfg: JobConfig, paths: RunPaths, env: Mapping[str, str]) -> int:
    """Train ``cfg.train`` in a session on ``paths.root``."""
    from hpc_ddp.runtime.session import Session
    from hpc_ddp.train.trainer import run_training

    with Session(paths.root, cfg, {**env, RUN_DIR_ENV: str(paths.root)}) as session:
        run_training(cfg, session)
    return 0


def redirect_to_rank_logs(paths: RunPaths, rank: int) -> None:
    """Point this process's stdout/stderr at ``logs/rank-N.{out,err}`` (local backend).

    Under Slurm srun does this itself; locally the same files make ``hpc-ddp logs`` work.
    """
    paths.logs.mkdir(parents=True, exist_ok=True)
    for stream, fd in (("out", 1), ("err", 2)):
        target = os.open(paths.rank_log(rank, stream), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(target, fd)
        os.close(target)
