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
import threading
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
    if not cfg.entrypoint:
        # The built-in trainer's session joins the group on paths.root: rank 0 can hold the
        # master port from now on, so no peer is ever refused (see procgroup.listen_early).
        _listen_early(cfg, paths.root, env)
    from hpc_ddp.runtime.session import RequeueExit, Session

    prefetch_dynamo()

    env = {**env, RUN_DIR_ENV: str(paths.root)}
    try:
        if cfg.entrypoint:
            fn = resolve_entrypoint(cfg.entrypoint)
            os.environ[RUN_DIR_ENV] = str(paths.root)
            os.environ[RUN_ID_ENV] = read_run_id(paths)
            result = fn()  # type: ignore[operator]
            return int(result) if isinstance(result, int) else 0
        from hpc_ddp.train.trainer import run_training

        with Session(paths.root, cfg, env) as session:
            run_training(cfg, session)
    except RequeueExit as stop:
        code = int(stop.code or 0)
        if code:
            # Every rank leaves with this code; srun (--kill-on-bad-exit) SIGTERMs the ranks
            # still shutting down, and Python restores default handlers at exit: a late rank
            # would die of it and turn the job's exit code (3, 4) into 143.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return code
    return 0


def _listen_early(cfg: JobConfig, run_dir: Path, env: Mapping[str, str]) -> None:
    from hpc_ddp.runtime.distenv import derive_dist_env
    from hpc_ddp.runtime.procgroup import listen_early

    listen_early(derive_dist_env(env, port=cfg.dist.port), cfg.dist, run_dir.resolve())


def prefetch_dynamo() -> threading.Thread:
    """Import ``torch._dynamo`` on a daemon thread; call it once torch itself is imported.

    DistributedDataParallel's constructor and every optimizer need it, and it takes 1.5-2 s
    of the restart. Imports hold the GIL, so this overlaps only with the waits before the model
    is wrapped: the rendezvous, the ranks' broadcasts, the ledger's fsync. A thread that is
    still importing when DDP needs the module makes the main thread wait for the same import,
    no longer. The main thread has finished its own module-level imports by now, which keeps
    the two threads from importing the same modules in opposite orders.
    """
    thread = threading.Thread(target=_import_dynamo, name="hpc-ddp-prefetch", daemon=True)
    thread.start()
    return thread


def _import_dynamo() -> None:
    try:
        importlib.import_module("torch._dynamo")
    except Exception:  # the main thread's own import reports it where it matters
        log.debug("prefetching torch._dynamo failed", exc_info=True)


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
