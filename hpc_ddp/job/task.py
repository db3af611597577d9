"""What every task runs: ``hpc-ddp run RUN_DIR`` (under srun, or as a local process).

It finds this task's run directory (a sweep task's own under ``tasks/<index>``, whose
``config.yaml`` it first writes from the sweep's packed configs: :mod:`hpc_ddp.rundir.taskconfig`),
reads the resolved config, and hands over to the job: the built-in trainer, a Python entry
point, or a user command. All three go through the same session for signals, checkpoints and
requeue; for a command, this process stays its parent: it forwards stop signals, and a child
that crashes (killed by a signal, or a non-zero exit that is not one of hpc-ddp's own) takes
the session's crash path from here, ``requeue.on_crash`` included. A command that opened no
session is judged by its exit status, which this process records in the ledger for it.

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

import contextlib
import importlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp import collector
from hpc_ddp.backends.arrays import ARRAYS_RECORD, current_refs, read_arrays
from hpc_ddp.backends.catalog import is_scheduler
from hpc_ddp.backends.node_registry import allocation_for
from hpc_ddp.config.exactness import DETERMINISTIC_ENV
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import PYTHON_NAMES, resolve_command
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.exitcodes import BUDGET_EXIT_CODE, NOT_CURRENT_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.rundir.layout import (
    LOCAL_JOB_ENV,
    MANIFEST_FILE,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    STANDBY_ENV,
    TASK_LAUNCHER_ENV,
    TASK_PLACE_ENV,
    WATCHDOG_OWNER_ENV,
    RunPaths,
)
from hpc_ddp.rundir.manifest import read_manifest, record_lock
from hpc_ddp.rundir.run_id import read_run_id

if TYPE_CHECKING:
    from hpc_ddp.backends.allocation import Allocation
    from hpc_ddp.fault.blame import FaultRecord
    from hpc_ddp.fault.coordinator import Coordinator
    from hpc_ddp.fault.watchdog import Watchdog
    from hpc_ddp.rundir.attempt import Attempt
    from hpc_ddp.runtime.distenv import DistEnv

log = logging.getLogger(__name__)

STOP_LAG_S = 2.0
"""How long a task whose child died of SIGTERM waits for its own stop signal (see
:func:`_await_own_stop`)."""
COMMAND_STOP_GRACE_S = 30.0
"""Seconds a ``command`` program without a session has, after the SIGTERM it gets for the
requeue signal, to end by itself (finish writing its snapshot) before SIGKILL; at most half of
``requeue.lead_time`` (:func:`command_grace_s`)."""


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


def child_failure(code: int, program: str, *, session: bool = True) -> str | None:
    """What a ``command`` child's exit status says went wrong; None for no crash.

    Killed by a signal (``Popen``'s negative code: a segfault, the OOM killer, an abort) or a
    non-zero exit is a crash. A child that opened a session (``session``) may also exit with
    hpc-ddp's own outcomes, which its session has already recorded: 0 (finished, or stopped
    and requeued), :data:`~hpc_ddp.exitcodes.BUDGET_EXIT_CODE` and
    :data:`~hpc_ddp.exitcodes.REQUEUE_FAILED_EXIT_CODE`; for a program without one, 3
    and 4 are its own failures like any other.
    """
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"command `{program}` was killed by {name}"
    if code == 0 or (session and code in (BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE)):
        return None
    return f"command `{program}` exited with status {code}"


def exit_status(code: int) -> int:
    """``Popen``'s return code as a process exit status: a death by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def run_command(
    cfg: JobConfig,
    paths: RunPaths,
    env: Mapping[str, str],
    dist: DistEnv,
    *,
    allocation: Allocation | None = None,
) -> int:
    """Run the user's ``command`` on this task with the distributed variables set.

    The child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    HPC_DDP_RUN_DIR and HPC_DDP_RUN_ID; stop signals are forwarded to it, and it may use
    ``hpc_ddp.session()`` for checkpoints and requeue. ``{params.NAME}`` placeholders are
    substituted from this task's own config (a sweep point's values), each within its argv
    item: there is no shell to split or interpret them. When no stop signal came, how the child
    ended is recorded here (:func:`record_child_end`): a crash (see :func:`child_failure`),
    with ``requeue.on_crash`` requeued (:func:`record_child_crash`), and for a program without
    a session its exit 0 as well. A program without a session gets SIGTERM for the requeue
    signal, and is requeued from here (:class:`_Forwarder`, :func:`record_plain_stop`).
    ``dist``: this task's place, derived from ``env`` (:func:`run_job`); ``allocation``: the
    scheduler's node face that asks for the requeue (None: the one ``env`` belongs to).
    """
    from hpc_ddp.fault.coordinator import Coordinator  # now: no delay at a stop
    from hpc_ddp.fault.requeue import signal_number
    from hpc_ddp.fault.watchdog import current
    from hpc_ddp.job.torchrun import torchrun_argv, with_local_rank
    from hpc_ddp.runtime.childsignals import start_ignoring
    from hpc_ddp.runtime.procgroup import resolve_master_port

    port = resolve_master_port(dist, paths.rendezvous, timeout_s=cfg.dist.timeout_s)
    child_env = {
        **env,
        **dist.as_environ(),
        "MASTER_PORT": str(port),
        RUN_DIR_ENV: str(paths.root),
        RUN_ID_ENV: read_run_id(paths),
    }
    if is_scheduler(dist.launcher):
        # Its RANK is this task's, as the scheduler's launcher placed it, not a torchrun's.
        child_env[TASK_LAUNCHER_ENV] = dist.launcher
    watchdog = current()
    if watchdog is not None:
        child_env[WATCHDOG_OWNER_ENV] = "1"  # this process beats for the child
        child_env[TASK_PLACE_ENV] = f"{dist.rank}/{dist.world_size}"
    # With MASTER_PORT set, the child's session takes the port as given (launcher-set).
    interpreter = task_interpreter(cfg)
    command = with_local_rank(cfg, command_argv(cfg, interpreter), dist.local_rank)
    program = shlex.join(command[:2])  # the ledger names the user's program, not torchrun
    argv = command
    if cfg.dist.launcher == "torchrun":
        # This process beats for torchrun and its workers (WATCHDOG_OWNER_ENV above): a node's
        # tree is seen alive or stopped as one; a worker that dies ends torchrun (no restarts).
        argv = torchrun_argv(
            cfg,
            command,
            interpreter,
            node_rank=dist.rank,  # one task per node (checked at load), on any backend
            master_addr=dist.master_addr,
            master_port=port,
        )
    # An ignored SIGINT stays ignored, in the child too (it inherits that): whoever started
    # this task handles Ctrl-C itself (the local backend's `submit --wait`, nohup).
    forwarded = {signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        forwarded.add(signal.SIGINT)
    requeue_signum = signal_number(cfg.requeue.signal)
    grace = command_grace_s(cfg)
    began = time.time()
    # What this process records for the program names the ranks it runs (torchrun's workers),
    # not this task's place among the Slurm tasks; a session in the child records its own.
    ranks = replace(dist, world_size=program_ranks(cfg, argv, dist))
    face = allocation if allocation is not None else allocation_for(env)
    coordinator = Coordinator(ranks, paths.ledger, cfg.requeue, face, since=began)
    if dist.is_main:
        _record_command_start(coordinator, began)
    # Slurm's warning reaches every process of the step: the child starts with it ignored
    # (and so do torchrun's workers), and hears of it from here as SIGTERM (_Forwarder).
    proc = start_ignoring(requeue_signum, argv, env=child_env)
    if watchdog is not None:
        # No deadline of its own (its steps are not seen from here): it is watched for being
        # stopped, and ended with this process when the launch ends for a fault.
        watchdog.enter("command")
        watchdog.child = proc.pid
        watchdog.rescue = partial(_let_child_rescue, proc, watchdog, cfg, dist)
        watchdog.before_exit.append(proc.kill)
    forward = _Forwarder(proc, coordinator, began, requeue_signum, grace)
    for sig in forwarded:
        signal.signal(sig, forward)
    code = _wait_child(proc, watchdog)
    _await_own_stop(forward, code)
    forward.cancel()
    _claim_torchrun_failure(cfg, watchdog, code, program, stopped=bool(forward.stops))
    if dist.is_main:
        _record_workdir_files(paths.root, began)
    if not forward.stops:
        record_child_end(coordinator, code, program, began)
        return exit_status(code)
    return _record_stopped(forward, code, program)


def _await_own_stop(forward: _Forwarder, code: int, lag_s: float | None = None) -> None:
    """The child died of SIGTERM and no stop signal came here: wait up to ``lag_s``
    (:data:`STOP_LAG_S`) for this process's own copy before the end is taken for a crash.

    A cancel or a requeue signals every process of the step, but not at once: under load the
    child's SIGTERM ended it, and this process reaped it, before this process's own arrived,
    and a cancel was recorded as the program's crash (seen once in a suite run)."""
    if forward.stops or code != -signal.SIGTERM:
        return
    deadline = time.monotonic() + (STOP_LAG_S if lag_s is None else lag_s)
    while not forward.stops and time.monotonic() < deadline:
        time.sleep(0.02)  # the handler runs on this (the main) thread between sleeps


def _claim_torchrun_failure(
    cfg: JobConfig, watchdog: Watchdog | None, code: int, program: str, *, stopped: bool
) -> None:
    """Under ``dist.launcher: torchrun``, torchrun ended with ``code``, no stop signal given
    (``stopped``): a failure is this task's crash, claimed as the launch's fault before the
    task ends.

    torchrun exits 1 whichever of its workers failed, and ends the others: from the srun
    task's status alone, a node whose worker died and a node that lost its peer look alike. A
    survivor's torchrun ends only after the fault is declared (its workers wait for it, to
    save), so the claim made here names the node the failure came from."""
    if cfg.dist.launcher != "torchrun" or stopped or watchdog is None:
        return
    failure = child_failure(code, program)
    if failure is not None:
        watchdog.crashed(failure)


def _wait_child(proc: subprocess.Popen[bytes], watchdog: Watchdog | None) -> int:
    """The child's exit status, once it ends on its own account: after a fault it may end
    first (its survivor's save done), and then this process's end is the watchdog's, not a
    child's end to record."""
    code = proc.wait()
    if watchdog is not None and watchdog.leaving:
        threading.Event().wait()  # the watchdog ends this process
    return code


def _let_child_rescue(
    proc: subprocess.Popen[bytes], watchdog: Watchdog, cfg: JobConfig, dist: DistEnv,
    record: FaultRecord,
) -> None:  # fmt: skip
    """The launch's fault is known: when the child's session is the survivor that writes the
    last step every rank completed (it wrote its rescue note, and this rank is the lowest not
    blamed), let it finish that save (it then ends itself) before this process ends it, up to
    ``fault.checkpoint_timeout_s``."""
    from hpc_ddp.fault.rescue import writer_rank

    if writer_rank(dist.world_size, record.ranks) != dist.rank:
        return
    if not watchdog.launch.rescue_note(dist.rank).exists():
        return  # no session in the child, or not one that can save
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=cfg.fault.checkpoint_timeout_s)


def _record_stopped(forward: _Forwarder, code: int, program: str) -> int:
    """The child ended after a stop signal (cancel, time limit, preemption, srun ending the
    step after another rank failed): it was stopped, not crashed, and Slurm decides what comes
    next. A program without a session is recorded here as its session would record itself."""
    coordinator, began = forward.coordinator, forward.began
    if forward.plain and forward.requeue_signum in forward.stops:
        return record_plain_stop(coordinator, forward.stops[0], program, began)
    if forward.plain and coordinator.dist.is_main:
        return record_plain_cancel(coordinator, forward.stops[0], program, began, code)
    return exit_status(code)


def program_ranks(cfg: JobConfig, argv: list[str], dist: DistEnv) -> int:
    """How many ranks the program this task starts runs in all: torchrun's workers on every
    node (``dist.launcher: torchrun``, or torchrun in the command with ``--nproc-per-node N``
    and ``--nnodes M``, 1 node by default, as torchrun has it), else one per Slurm task."""
    from hpc_ddp.job.torchrun import procs_per_node
    from hpc_ddp.rundir.provenance import torchrun_split

    if cfg.dist.launcher == "torchrun":
        return dist.world_size * procs_per_node(cfg)
    split = torchrun_split(argv)
    if split is None:
        return dist.world_size
    options = split[0]
    per_node = options.get("nproc-per-node", "1")
    nodes = options.get("nnodes", "1")
    if not (per_node.isdigit() and nodes.isdigit()) or int(per_node) < 1 or int(nodes) < 1:
        return dist.world_size  # "gpu", "auto", an elastic "1:4": not known here
    return int(nodes) * int(per_node)


def _record_command_start(coordinator: Coordinator, began: float) -> None:
    """Rank 0: the program starts; ``status`` shows its attempt running until a start of its
    own (its session's, or the one written with its end) supersedes this
    (:func:`~hpc_ddp.rundir.ledger_events.command_start_event`). Never fails the task."""
    from hpc_ddp.durable import append_line
    from hpc_ddp.rundir.ledger_events import command_start_event

    dist = coordinator.dist
    line = command_start_event(
        launch_id=coordinator.launch_id,
        nodelist=",".join(dist.nodelist),
        world_size=dist.world_size,
        now=began,
    )
    try:
        coordinator.ledger.parent.mkdir(parents=True, exist_ok=True)
        append_line(coordinator.ledger, line)
    except OSError as exc:
        log.warning("could not record that the command started: %s", exc)


def _record_workdir_files(run_dir: Path, began: float) -> None:
    """What the command wrote where it ran: the next run submitted from there is warned of
    it (:mod:`hpc_ddp.rundir.workdir_files`). Never fails the task."""
    from hpc_ddp.rundir.workdir_files import files_written, record_written

    try:
        workdir = Path.cwd()
        record_written(run_dir, workdir, files_written(workdir, began))
    except OSError as exc:
        log.warning("could not record the files the command wrote: %s", exc)


class _Forwarder:
    """The signal handler that passes this task's stop signals on to its ``command`` child.

    A child with a session gets each signal as it came: its session agrees on the stop and
    requeues. A program without one (decided at the first signal: no entry of this attempt in
    the ledger) would die of the requeue signal's default action (USR1/USR2 terminate): it
    gets SIGTERM instead, the signal a torchrun-ready script expects, once, and ``grace``
    seconds to end by itself before SIGKILL; :func:`record_plain_stop` then requeues.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        coordinator: Coordinator,
        began: float,
        requeue_signum: int,
        grace: float,
    ) -> None:
        self.proc = proc
        self.coordinator = coordinator
        self.began = began
        self.requeue_signum = requeue_signum
        self.grace = grace
        self.stops: list[int] = []
        self.plain: bool | None = None
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int, frame: object) -> None:
        del frame
        self.stops.append(signum)
        if self.plain is None:
            self.plain = not _attempt_entries(self.coordinator, self.began)
        if not (self.plain and signum == self.requeue_signum):
            self.proc.send_signal(signum)
        elif self._timer is None:
            self.proc.send_signal(signal.SIGTERM)
            self._timer = threading.Timer(self.grace, _kill, (self.proc,))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        """The child has ended: no SIGKILL is due."""
        if self._timer is not None:
            self._timer.cancel()


def command_grace_s(cfg: JobConfig) -> float:
    """Seconds a ``command`` child without a session has between its SIGTERM and SIGKILL:
    :data:`COMMAND_STOP_GRACE_S`, at most half of ``requeue.lead_time``, so that the requeue
    is asked for well before the time limit."""
    return min(COMMAND_STOP_GRACE_S, cfg.requeue.lead_s / 2)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End a child that outlived its grace period (it may have ended meanwhile)."""
    if proc.poll() is None:
        log.warning("the command did not end %s after SIGTERM: SIGKILL", proc.pid)
        proc.kill()


def record_plain_stop(coordinator: Coordinator, signum: int, program: str, began: float) -> int:
    """A ``command`` child without a session was stopped for the requeue signal: on rank 0,
    record the attempt and handle the stop as a session would (ask Slurm why, requeue within
    ``requeue.max_requeues``), with no step or checkpoint of hpc-ddp's: the program resumes
    from its own snapshot. Returns this task's exit status (other ranks: 0, rank 0 decides)."""
    if not coordinator.dist.is_main:
        return 0
    coordinator.write_start(resumed_from_step=None, checkpoint=None, now=began)
    outcome = coordinator.stop(signum, step=None, checkpoint=None)
    log.info("command `%s` stopped: %s", program, outcome.message)
    return outcome.exit_code


def record_plain_cancel(
    coordinator: Coordinator, signum: int, program: str, began: float, code: int
) -> int:
    """A ``command`` child without a session ended after a stop signal that is not the requeue
    signal (``hpc-ddp cancel``'s SIGTERM, Slurm's own requeue or preemption): on rank 0, record
    the attempt as Slurm explains the stop, as a session would (``cancelled``), with nothing to
    request. A stop Slurm would have this job requeue (a SIGTERM while it runs: srun ending
    the step for a peer that failed, whose own record speaks) or that Slurm could not explain
    is left unrecorded, as before. Returns this task's exit status."""
    if _attempt_entries(coordinator, began):  # a peer's crash, recorded before this stop
        return exit_status(code)
    verdict = coordinator.verdict(signum)
    if verdict.request_requeue or not verdict.slurm_answered:
        return exit_status(code)
    coordinator.write_start(resumed_from_step=None, checkpoint=None, now=began)
    outcome = coordinator.stop(signum, step=None, checkpoint=None, verdict=verdict)
    log.info("command `%s` stopped: %s", program, outcome.message)
    return outcome.exit_code


def record_child_end(coordinator: Coordinator, code: int, program: str, began: float) -> None:
    """A ``command`` child ended with exit status ``code``, no stop signal given: the ledger
    must say how, whether or not the child opened a session.

    A child with a session recorded its attempt itself: only a death its session could not see
    (a signal, a non-zero exit that is not one of hpc-ddp's own) is added, as a crash. A
    program without one recorded nothing, and its exit status is its verdict, written here
    with the attempt's start: on rank 0, ``finished`` for exit 0; on any rank, a crash for
    anything else (``requeue.on_crash`` included). So ``status``, ``--wait``, ``results``
    and ``--resubmit-failed`` judge a plain command as they judge a training run.
    """
    session = bool(_attempt_entries(coordinator, began))
    failure = child_failure(code, program, session=session)
    if failure is not None:
        record_child_crash(coordinator, failure, began)
    elif not session and coordinator.dist.is_main:
        coordinator.write_start(resumed_from_step=None, checkpoint=None, now=began)
        coordinator.finish(step=None, checkpoint=None, message=f"command `{program}` exited 0")


def _attempt_entries(coordinator: Coordinator, began: float) -> list[Attempt]:
    """This attempt's ledger entries: its job's at its restart count (outside Slurm, where there
    is no job id, those that started since the task started its child at ``began``)."""
    from hpc_ddp.rundir.ledger import read_ledger

    dist = coordinator.dist
    return [
        a
        for a in read_ledger(coordinator.ledger)
        if (a.restart, a.job_id) == (coordinator.restart, dist.job_id)
        and (dist.job_id is not None or a.started >= began)
    ]


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
    from hpc_ddp.fault.coordinator import claim_crash_requeue

    dist = coordinator.dist
    # Outside Slurm nothing is requeued, and a claim named "local" would outlive the run.
    claims = coordinator.ledger.parent / "rendezvous"
    if dist.job_id is not None and not claim_crash_requeue(claims, dist.job_id, dist.attempt_key):
        log.error("%s; another rank's crash is being handled already", failure)
        return
    mine = _attempt_entries(coordinator, began)
    if mine and not mine[-1].is_open:
        log.error("%s; the attempt's end is recorded already", failure)
        return
    if not mine:  # its running attempt (`command_start`) counts from when the child started
        coordinator.write_start(resumed_from_step=None, checkpoint=None, now=began)
    coordinator.crash(step=None, checkpoint=None, error=failure, claimed=True)


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
