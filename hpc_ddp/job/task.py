"""What every task runs: ``hpc-ddp run RUN_DIR`` (under srun, or as a local process).

It finds this task's run directory (a sweep task's own under ``tasks/<index>``), reads the
resolved config, and hands over to the job: the built-in trainer, a Python entry point, or a
user command. All three go through the same session for signals, checkpoints and requeue; for a
command, this process stays its parent: it forwards stop signals, and a child that crashes
(killed by a signal, or a non-zero exit that is not one of hpc-ddp's own) takes the session's
crash path from here, ``requeue.on_crash`` included.
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import PYTHON_NAMES, resolve_command
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.layout import RUN_DIR_ENV, RUN_ID_ENV, RunPaths
from hpc_ddp.run_id import read_run_id

if TYPE_CHECKING:
    from hpc_ddp.runtime.requeue import Coordinator
    from hpc_ddp.slurm.client import SlurmClient

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


def command_argv(cfg: JobConfig, interpreter: str) -> list[str]:
    """The argv a task runs for ``cfg.command``, ``{params.NAME}`` substituted in each item.

    A first item of exactly ``python`` or ``python3`` becomes ``interpreter``: the one running
    ``hpc_ddp run`` here (the submitting interpreter, or ``env.container.python`` in a
    container). Whatever ``python`` comes first on the nodes' PATH may be the system's, without
    torch: a venv called by its full path is never activated. ``python3.11`` or a path is run
    as written.
    """
    assert cfg.command is not None
    argv = list(resolve_command(cfg.command, cfg.params))  # checked when the config was loaded
    if argv[0] in PYTHON_NAMES and interpreter:
        argv[0] = interpreter
    return argv


def task_interpreter(cfg: JobConfig) -> str:
    """The interpreter running this process: ``sys.executable``, else ``env.container.python``
    (``sys.executable`` is empty when Python cannot tell its own path)."""
    container = cfg.env.container
    return sys.executable or (container.python if container is not None else "")


def child_failure(code: int, program: str) -> str | None:
    """What a ``command`` child's exit status says went wrong; None for no crash.

    Killed by a signal (``Popen``'s negative code: a segfault, the OOM killer, an abort) or a
    non-zero exit is a crash, except hpc-ddp's own outcomes: 0 (finished, or stopped and
    requeued), :data:`~hpc_ddp.runtime.requeue.BUDGET_EXIT_CODE` and
    :data:`~hpc_ddp.runtime.requeue.REQUEUE_FAILED_EXIT_CODE`, which the child's session has
    already recorded.
    """
    from hpc_ddp.runtime.requeue import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE

    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"command `{program}` was killed by {name}"
    if code in (0, BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE):
        return None
    return f"command `{program}` exited with status {code}"


def exit_status(code: int) -> int:
    """``Popen``'s return code as a process exit status: a death by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def run_command(
    cfg: JobConfig, paths: RunPaths, env: Mapping[str, str], *, slurm: SlurmClient | None = None
) -> int:
    """Run the user's ``command`` on this task with the distributed variables set.

    The child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    HPC_DDP_RUN_DIR and HPC_DDP_RUN_ID; stop signals are forwarded to it, and it may use
    ``hpc_ddp.session()`` for checkpoints and requeue. ``{params.NAME}`` placeholders are
    substituted from this task's own config (a sweep point's values), each within its argv
    item: there is no shell to split or interpret them. A child that crashes (see
    :func:`child_failure`) when no stop signal came is recorded here, and with
    ``requeue.on_crash`` the job is requeued: :func:`record_child_crash`. ``slurm``: the client
    that asks for the requeue (None: the real one).
    """
    from hpc_ddp.runtime.distenv import derive_dist_env
    from hpc_ddp.runtime.procgroup import resolve_master_port
    from hpc_ddp.runtime.requeue import Coordinator  # now: a crash is handled without delay

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
    argv = command_argv(cfg, task_interpreter(cfg))
    began = time.time()
    proc = subprocess.Popen(argv, env=child_env)
    stops: list[int] = []

    def forward(signum: int, frame: object) -> None:
        del frame
        stops.append(signum)
        proc.send_signal(signum)

    for sig in {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}:
        signal.signal(sig, forward)
    code = proc.wait()
    failure = child_failure(code, shlex.join(argv[:2]))
    # A child that dies after a stop signal (cancel, time limit, preemption, srun ending the
    # step after another rank failed) was stopped, not crashed: Slurm decides what comes next.
    if failure is not None and not stops:
        record_child_crash(Coordinator(dist, paths.ledger, cfg.requeue, slurm), failure, began)
    return exit_status(code)


def record_child_crash(coordinator: Coordinator, failure: str, began: float) -> None:
    """A ``command`` child crashed: record it, and with ``requeue.on_crash`` requeue the job.

    The same path as a crash inside the session (:meth:`Coordinator.crash`), for what the
    session cannot see: a child killed by a signal, or a program without a session. The claim
    comes first, so the rank that crashed first wins it over its peers, which die of the lost
    connection a moment later. A crash the child's own session already handled is not handled
    twice: that session exits 1 (the exception leaves the ``with`` block) after claiming this
    attempt's requeue or writing the attempt's end, and either is seen here. A program that
    never opened a session has no ``attempt_start``: it is written first, so the ledger shows
    the attempt. ``began``: when this task started its child (outside Slurm, where there is
    no job id and nothing to claim, an entry of this attempt is one that started since).
    """
    from hpc_ddp.runtime.ledger import read_ledger
    from hpc_ddp.runtime.requeue import claim_crash_requeue

    dist = coordinator.dist
    # Outside Slurm nothing is requeued, and a claim named "local" would outlive the run.
    claims = coordinator.ledger.parent / "rendezvous"
    if dist.job_id is not None and not claim_crash_requeue(claims, dist.job_id, dist.restart_count):
        log.error("%s; another rank's crash is being handled already", failure)
        return
    mine = [
        a
        for a in read_ledger(coordinator.ledger)
        if (a.attempt, a.job_id) == (coordinator.attempt, dist.job_id)
        and (dist.job_id is not None or a.started >= began)
    ]
    if mine and not mine[-1].is_open:
        log.error("%s; the attempt's end is recorded already", failure)
        return
    if not mine:
        coordinator.write_start(resumed_from_step=None, checkpoint=None)
    coordinator.crash(step=None, checkpoint=None, error=failure, claimed=True)


def run_job(run_dir: Path, env: Mapping[str, str], *, slurm: SlurmClient | None = None) -> int:
    """Run the job in ``run_dir`` on this task; returns the process exit code.

    ``slurm``: the client a ``command`` job's crash requeue goes through (None: the real one).
    """
    from hpc_ddp.config.load import load_resolved_config

    paths = RunPaths(task_run_dir(run_dir, env))
    cfg = load_resolved_config(paths.config)
    # Before torch is imported: one intra-op thread per CPU Slurm gave this task, not one per
    # core of the node (which oversubscribes a shared node and slows every rank).
    os.environ.setdefault("OMP_NUM_THREADS", env.get("SLURM_CPUS_PER_TASK", "1"))
    if cfg.command:
        return run_command(cfg, paths, env, slurm=slurm)
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
