"""A ``command:`` program, run by ``hpc-ddp run`` as this task's child: its argv (``{params.NAME}``
substituted, ``python`` as the task's interpreter), its stop signals forwarded, its end judged
and recorded (:func:`run_command`).

A program that opened a session records its own attempt; this process stays its parent, beats
for it (:mod:`hpc_ddp.fault.watchdog`), lets it finish a rescue before ending it, and takes a
crash (killed by a signal, or a non-zero exit that is not one of hpc-ddp's own) on the session's
crash path, ``requeue.on_crash`` included. A program without a session is judged by its exit
status, which this process records in the ledger for it: a stop it was sent, a cancel, its end,
its crash.
"""

from __future__ import annotations

import contextlib
import logging
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

from hpc_ddp.backends.catalog import is_scheduler
from hpc_ddp.backends.node_registry import allocation_for
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import PYTHON_NAMES, resolve_command
from hpc_ddp.exitcodes import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.rundir.layout import (
    RUN_DIR_ENV,
    RUN_ID_ENV,
    TASK_LAUNCHER_ENV,
    TASK_PLACE_ENV,
    WATCHDOG_OWNER_ENV,
    RunPaths,
)
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
