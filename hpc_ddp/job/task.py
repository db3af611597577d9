"""What every task runs: ``hpc-ddp run RUN_DIR`` (under srun, or as a local process).

It finds this task's run directory (a sweep task's own under ``tasks/<index>``, whose
``config.yaml`` it first writes from the sweep's packed configs: :mod:`hpc_ddp.rundir.taskconfig`),
reads the resolved config, and hands over to the job: the built-in trainer, a Python entry
point, or a user command. All three go through the same session for signals, checkpoints and
requeue; for a command, this process stays its parent (:mod:`hpc_ddp.job.command`): it
forwards stop signals, and a child that crashes (killed by a signal, or a non-zero exit that is
not one of hpc-ddp's own) takes the session's crash path from here, ``requeue.on_crash``
included. A command that opened no session is judged by its exit status, which this process
records in the ledger for it.

With ``fault.enabled`` the rank's watchdog (:mod:`hpc_ddp.fault.watchdog`) starts here, just
after torch is imported (its C libraries load holding the GIL, which would stop the beat of a
rank that is not hung) and before the rendezvous and the job's own code, so that a rank stuck
in those is seen too (one stuck in its imports never beats: the supervisor's
``fault.startup_timeout_s``); its last beat says how the task left. For a ``command:`` this
process beats for its child.

Before any of that, every task of every attempt checks that its job is the run's current job,
the one ``manifest.json`` (a sweep task: the sweep's ``arrays.json``) records
(:func:`not_current_refusal`). A second job in one run directory, whoever submitted it, starts
nothing and writes nothing: it exits :data:`NOT_CURRENT_EXIT_CODE`, its reason in each rank's log.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp import collector
from hpc_ddp.backends.arrays import ARRAYS_RECORD, current_refs, read_arrays
from hpc_ddp.backends.node_registry import allocation_for
from hpc_ddp.config.exactness import DETERMINISTIC_ENV
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.exitcodes import NOT_CURRENT_EXIT_CODE
from hpc_ddp.job.command import run_command
from hpc_ddp.rundir.layout import (
    LOCAL_JOB_ENV,
    MANIFEST_FILE,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    STANDBY_ENV,
    RunPaths,
)
from hpc_ddp.rundir.manifest import read_manifest, record_lock
from hpc_ddp.rundir.run_id import read_run_id

if TYPE_CHECKING:
    from hpc_ddp.backends.allocation import Allocation
    from hpc_ddp.fault.watchdog import Watchdog
    from hpc_ddp.runtime.distenv import DistEnv

log = logging.getLogger(__name__)


def task_run_dir(run_dir: Path, env: Mapping[str, str]) -> Path:
    """This task's run directory: ``run_dir`` itself, or ``run_dir/tasks/<i>`` in an array.

    Writes nothing: a sweep task's ``config.yaml`` is written by :func:`write_task_config`
    once the task knows that it may run (:func:`not_current_refusal`), so that a refused task
    leaves no trace but its reason in its log. A point with no config at all is refused here.
    """
    from hpc_ddp.rundir.taskconfig import task_config_text

    index = allocation_for(env).array_point()  # a DistEnvError names a garbled variable
    if index is not None and (run_dir / "tasks").is_dir():
        task = RunPaths(run_dir).task(index).root
        if task_config_text(run_dir, index) is None:
            raise RunDirError(
                f"{task}: array task {env['SLURM_ARRAY_TASK_ID']} has no config.yaml, and "
                f"{RunPaths(run_dir).task_configs.name} has no line for point {index}. "
                "HINT: the sweep directory is incomplete; resubmit with `hpc-ddp sweep`."
            )
        return task
    if not (run_dir / "config.yaml").is_file():
        raise RunDirError(
            f"{run_dir}: no config.yaml. HINT: pass a run directory made by `hpc-ddp submit`."
        )
    return run_dir


def write_task_config(run_dir: Path, task_dir: Path) -> None:
    """A sweep task's ``config.yaml``, written from the sweep's ``task_configs.jsonl`` the first
    time the task starts (:func:`~hpc_ddp.rundir.taskconfig.materialise_task_config`); nothing
    for a plain run. ``hpc-ddp run`` and ``hpc-ddp supervise`` call it after the task's
    :func:`not_current_refusal` and before they read the config."""
    if task_dir == run_dir:
        return
    from hpc_ddp.rundir.taskconfig import materialise_task_config

    if materialise_task_config(run_dir, int(task_dir.name)) is None:
        raise RunDirError(
            f"{task_dir}: no config.yaml, and {RunPaths(run_dir).task_configs.name} has no "
            "line for its point. HINT: the sweep directory is incomplete; resubmit with "
            "`hpc-ddp sweep`."
        )


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


def this_job(env: Mapping[str, str], job_id: str | None = None) -> str | None:
    """This task's job as a run's record names it; None outside any job (by hand, torchrun).

    ``job_id`` when given (the local backend: its controller's pid), else the job's reference
    as its scheduler names it (:attr:`~hpc_ddp.backends.allocation.JobIdentity.job_ref`: on
    Slurm ``ARRAYJOB_TASK`` for an array task, never its bare ``SLURM_JOB_ID``, which for the
    last task equals the array's own id that a run's manifest may name; else the job id, the
    same in every requeue).
    """
    if job_id:
        return job_id
    return allocation_for(env).identity().job_ref


def recorded_job(
    run_dir: Path, task_dir: Path, env: Mapping[str, str]
) -> tuple[str, str | None] | None:
    """(where the record is, the job it names as the current one of this task's run).

    A sweep task's is the latest array that runs its point (``ARRAYJOB_TASK``), from the sweep's
    ``arrays.json`` (None: the point is in no array); a run's is ``manifest.json``'s job id.
    None when there is no record at all: a run directory made by hand or by an older hpc-ddp.
    A damaged record is a :class:`RunDirError`.
    """
    if task_dir != run_dir:
        source = run_dir / ARRAYS_RECORD
        point = allocation_for(env).array_point()
        if point is None or not source.exists():
            return None
        ref = current_refs(read_arrays(run_dir)).get(point)
        return f"{source} (point {point})", None if ref is None else f"{ref[0]}_{ref[1]}"
    source = run_dir / MANIFEST_FILE
    if not source.exists():
        return None
    job = read_manifest(run_dir).job_id
    return None if job is None else (str(source), job)


def not_current_refusal(
    run_dir: Path, task_dir: Path, env: Mapping[str, str], job_id: str | None = None
) -> str | None:
    """Why this task must not run (its job is not the run's current job), or None.

    The record is read under the run (or sweep) directory's shared record lock: a job that
    starts before its submitter has recorded it waits for that record (a bounded wait) rather
    than read the one before and be refused. A requeued job keeps its id, a resumed run's
    manifest and a resubmitted sweep's ``arrays.json`` name their new job before it starts.
    """
    mine = this_job(env, job_id)
    if mine is None:
        return None
    try:
        with record_lock(run_dir, shared=True):
            record = recorded_job(run_dir, task_dir, env)
    except RunDirError as exc:
        return f"job {mine} cannot confirm that it is the current job of {task_dir}: {exc}"
    if record is None or record[1] == mine:
        return None
    source, recorded = record
    names = f"names job {recorded}" if recorded is not None else "names no job for it"
    return (
        f"job {mine} is not the current job of {task_dir}: {source} {names}. Two jobs must "
        f"never write one run directory, so this task starts nothing, writes nothing and exits "
        f"{NOT_CURRENT_EXIT_CODE}. HINT: submit a run again with `hpc-ddp resume RUN_DIR` (a "
        "sweep: `hpc-ddp sweep --resubmit-failed SWEEP_DIR`), never by running its script "
        f"with sbatch; `hpc-ddp status {run_dir}` shows the current job."
    )


def run_job(
    run_dir: Path,
    env: Mapping[str, str],
    *,
    allocation: Allocation | None = None,
    job_id: str | None = None,
) -> int:
    """Run the job in ``run_dir`` on this task; returns the process exit code.

    ``allocation``: the scheduler's node face a ``command`` job's crash requeue goes through
    (None: the one ``env`` belongs to).
    ``job_id``: this task's job where no ``SLURM_*`` variable says it (the local backend's
    controller pid). A job that is not the run's current job exits at once with
    :data:`NOT_CURRENT_EXIT_CODE` (:func:`not_current_refusal`).
    """
    from hpc_ddp.config.load import load_resolved_config
    from hpc_ddp.runtime.distenv import derive_dist_env

    # Absolute before a command's task moves to its submit directory (`_enter_code`); not
    # resolved: the path stays the one the run's records name.
    run_dir = Path(os.path.abspath(run_dir))
    task_dir = task_run_dir(run_dir, env)
    job_id = job_id or env.get(LOCAL_JOB_ENV) or None
    refusal = not_current_refusal(run_dir, task_dir, env, job_id)
    if refusal is not None:
        print(f"hpc-ddp run: refused: {refusal}", file=sys.stderr, flush=True)
        return NOT_CURRENT_EXIT_CODE
    write_task_config(run_dir, task_dir)
    paths = RunPaths(task_dir)
    cfg = load_resolved_config(paths.config)
    dist = derive_dist_env(env, port=cfg.dist.port)  # once: everything below is given it
    _set_torch_env(cfg, env)
    if not cfg.command:
        # torch's C libraries load holding the GIL (seconds from a shared file system, 4 s on
        # a busy machine): before the first beat, so the load counts against
        # fault.startup_timeout_s like a rank that never started, not as a stopped heartbeat.
        import hpc_ddp.sessions.session  # noqa: F401
    if env.get(STANDBY_ENV) and not _called_from_standby(cfg, Path(env[STANDBY_ENV])):
        return 0
    _enter_code(cfg, run_dir, paths, env, dist)
    watchdog = _start_watchdog(cfg, paths, env, dist)
    try:
        code = _run(cfg, paths, env, dist, allocation)
    except BaseException as exc:
        if watchdog is not None:
            if isinstance(exc, SystemExit):
                watchdog.exiting(exc.code if isinstance(exc.code, int) else 1)
            else:
                watchdog.exiting(1, f"{type(exc).__name__}: {exc}")
        raise
    if watchdog is not None:
        watchdog.exiting(code)
    return code


def _called_from_standby(cfg: JobConfig, call_file: Path) -> bool:
    """This task is a launch's standby (:mod:`hpc_ddp.fault.standby`): load what a rank's
    start-up spends its seconds on, then wait; True once called, False when dismissed."""
    import torch._dynamo  # noqa: F401  # DDP's constructor imports it to read one setting

    from hpc_ddp.fault.standby import wait_to_be_called

    if cfg.entrypoint is None:
        import hpc_ddp.train.trainer  # noqa: F401
    return wait_to_be_called(call_file)


def _enter_code(
    cfg: JobConfig, run_dir: Path, paths: RunPaths, env: Mapping[str, str], dist: DistEnv
) -> None:
    """Run a ``command:`` where it was submitted from, and record (rank 0) which code this
    attempt runs (:mod:`hpc_ddp.rundir.provenance`)."""
    from hpc_ddp.rundir.provenance import record_code, submit_dir_of

    where = submit_dir_of(cfg, run_dir)
    if where is not None:
        os.chdir(where)  # a relative script names the same file on a resume started elsewhere
    if dist.rank == 0:
        try:
            record_code(cfg, paths.ledger, job_id=dist.job_id or env.get(LOCAL_JOB_ENV))
        except OSError as exc:  # a note of `status`, never a reason not to train
            log.warning("cannot record which code this attempt runs: %s", exc)


def _set_torch_env(cfg: JobConfig, env: Mapping[str, str]) -> None:
    """What torch reads once, set before it is imported (here, or by a ``command:`` child that
    inherits it)."""
    # One intra-op thread per CPU the scheduler gave this task, not one per core of the node
    # (which oversubscribes a shared node and slows every rank).
    os.environ.setdefault("OMP_NUM_THREADS", str(allocation_for(env).cpus_per_task() or 1))
    if cfg.train.deterministic:  # cuBLAS reads its workspace setting once, at its first call
        for name, value in DETERMINISTIC_ENV:
            os.environ.setdefault(name, value)


def _start_watchdog(
    cfg: JobConfig, paths: RunPaths, env: Mapping[str, str], dist: DistEnv
) -> Watchdog | None:
    """The rank's watchdog, started before anything slow (see the module docstring)."""
    from hpc_ddp.fault.watchdog import start_watchdog

    watchdog, _ = start_watchdog(cfg.fault, paths.root, env, dist)
    return watchdog


def _run(
    cfg: JobConfig,
    paths: RunPaths,
    env: Mapping[str, str],
    dist: DistEnv,
    allocation: Allocation | None,
) -> int:
    """The job itself: a command, an entry point or the built-in trainer."""
    if cfg.command:
        collector.release()  # this process only waits on the command from here
        return run_command(cfg, paths, env, dist, allocation=allocation)
    from hpc_ddp.sessions.session import RequeueExit

    try:
        if cfg.entrypoint:
            collector.release()  # the job's own code runs with a collector, as it expects
            return run_entrypoint(cfg.entrypoint, paths, cfg)
        return run_builtin_trainer(cfg, paths, env, dist)
    except RequeueExit as stop:
        code = int(stop.code or 0)
        if code:
            # Every rank leaves with this code; srun (--kill-on-bad-exit) SIGTERMs the ranks
            # still shutting down, and Python restores default handlers at exit: a late rank
            # would die of it and turn the job's exit code (3, 4) into 143.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return code


def run_entrypoint(spec: str, paths: RunPaths, cfg: JobConfig) -> int:
    """Call the job's ``pkg.mod:fn`` with the run directory and id in the environment; a
    session it opens on the run takes ``cfg`` (this task loaded it) rather than load it again."""
    from hpc_ddp.sessions.startup import handed_config

    fn = resolve_entrypoint(spec)
    os.environ[RUN_DIR_ENV] = str(paths.root)
    os.environ[RUN_ID_ENV] = read_run_id(paths)
    with handed_config(paths.root, cfg):
        result = fn()  # type: ignore[operator]
    return int(result) if isinstance(result, int) else 0


def run_builtin_trainer(
    cfg: JobConfig, paths: RunPaths, env: Mapping[str, str], dist: DistEnv
) -> int:
    """Train ``cfg.train`` in a session on ``paths.root``, at this task's place ``dist``."""
    from hpc_ddp.sessions.session import Session
    from hpc_ddp.train.trainer import run_training

    with Session(paths.root, cfg, {**env, RUN_DIR_ENV: str(paths.root)}, dist=dist) as session:
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
