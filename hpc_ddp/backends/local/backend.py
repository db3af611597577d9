"""The local backend: the same runtime in ``nodes x tasks_per_node`` processes on this machine.

submitit's LocalExecutor already starts N real task processes, watches them and forwards
signals, so it does that job here. Each task maps submitit's ids onto the torchrun-style
variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and then runs exactly what ``hpc-ddp run``
runs on a Slurm task: the run directory is the same, logs and checkpoints included.

No rank outlives its controller: each asks the kernel for a SIGTERM when the controller dies
(the stop a cancel gives: the ranks agree on a step, rank 0 saves), and records its identity
in ``RUN_DIR/local-ranks/`` so that ``status``, ``cancel`` and ``resume`` still see it if
that failed (:mod:`hpc_ddp.backends.local.process`).

The controller is detached from whoever submitted: its stdin is ``/dev/null``, its output a
log file of the run, and it leads a session of its own, so ``$(hpc-ddp submit ...)`` returns
once submitted, and every process of the run can be found (and, by a ``cancel`` that must,
killed: :func:`stop_local`).

Imports submitit (and, in the task, torch) only when used: never on the dry-run path.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.base import Cancel, Cancelled, PlanRequest, Started, SubmitPlan, Word
from hpc_ddp.backends.local.process import (
    IDENTITY_FILE,
    KILL_WAIT_S,
    RANKS_DIR,
    LocalCancel,
    ProcIdentity,
    cancel_local,
    clear_rank_identities,
    describe_processes,
    identify_started,
    live_controller,
    live_ranks,
    local_alive,
    run_processes,
    signal_if_same,
    unmark_cancelled,
    was_cancelled,
    write_identity,
)
from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.durable import append_line
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.rundir.checkpoints import newest_checkpoint
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RUN_DIR_ENV, Checkpoint, RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.ledger_events import end_event
from hpc_ddp.rundir.manifest import BackendName, Manifest
from hpc_ddp.rundir.metrics import drop_replayed
from hpc_ddp.rundir.run_id import recorded_run_id

if TYPE_CHECKING:
    import subprocess

    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class LocalJob:
    """A running local job: submitit's handle and the controller pid used as its job id."""

    job_id: str
    handle: Any
    ntasks: int
    folder: Path
    """submitit's folder (``RUN_DIR/submitit``): the tasks' result pickles."""
    started: float = 0.0
    """When it was started (``time.time()``): its ranks' ledger entries start later."""
    supervised: bool = False
    """Its one controller task is the supervisor (``fault.enabled``), which starts the ranks."""

    def ended(self) -> bool:
        """True once the controller and every rank process have exited. Ranks outlive a
        controller killed outright for a moment (its death stops them at an agreed step), or
        for good when that signal is off: the run has ended only when they are gone too."""
        return bool(self.handle.done()) and not live_ranks(self.folder.parent)


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
        f"{minutes} min, USR2 {cfg.requeue.lead_time} s before it"
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


def submit_local(cfg: JobConfig, paths: RunPaths) -> LocalJob:
    """Start the job's tasks as local processes; returns at once.

    The controller's identity goes to ``RUN_DIR/local.json`` so that ``cancel`` can prove,
    later, that the pid it is about to signal is still this run's
    (see :mod:`hpc_ddp.backends.local.process`); the ranks record their own as they start.
    """
    clear_rank_identities(paths.root)  # a resumed run's earlier ranks are not this job's
    executor = _detached_executor(paths.root / "submitit", job_environment(cfg, paths, os.environ))
    supervised = cfg.fault.enabled
    executor.update_parameters(
        # Supervised: the controller's one task is the supervisor, which starts the ranks.
        tasks_per_node=1 if supervised else cfg.slurm.ntasks,
        nodes=1,
        timeout_min=max(1, cfg.slurm.time_s // 60),
        # Mirror the rendered --signal: submitit sends USR2 this long before the timeout.
        signal_delay_s=cfg.requeue.lead_time,
    )
    gpus = local_gpu_plan(cfg.slurm, os.environ.get("CUDA_VISIBLE_DEVICES"))
    started = time.time()
    with _sigint_ignored():
        # The node face's entries, which submitit pickles by name and runs in the tasks.
        from hpc_ddp.backends.local.launcher import free_port, run_supervisor, run_task

        if supervised:
            job = executor.submit(run_supervisor, str(paths.root), gpus, cfg.slurm.gpus_per_task)
        else:
            job = executor.submit(
                run_task, str(paths.root), free_port(), gpus, cfg.slurm.gpus_per_task
            )
    ident = identify_started(int(job.job_id))
    if ident is not None:
        write_identity(paths.root, ident)
    ntasks = 1 if supervised else cfg.slurm.ntasks
    folder = paths.root / "submitit"
    return LocalJob(str(job.job_id), job, ntasks, folder, started, supervised)


CONTROLLER_LOG = "controller.log"
"""In ``RUN_DIR/submitit/``: what submitit's local controller writes (its stdout and stderr)."""


def _detached_executor(folder: Path, env: Mapping[str, str]) -> Any:
    """submitit's ``LocalExecutor``, whose controller is detached from its caller.

    submitit starts the controller with the caller's stdin, stdout and stderr, and the
    controller outlives the call: ``x=$(hpc-ddp submit ... --json)``, ``| tee`` and any
    caller that reads the output to its end waited for the whole run. Here the controller gets
    ``/dev/null`` for stdin and :data:`CONTROLLER_LOG` for stdout and stderr (its tasks get
    their own log files from it, and the ranks ``logs/rank-N.*``), so no descriptor of the
    caller's is held. It also leads a session of its own: every process of the run is in it
    (the tasks, the supervisor's ranks, a ``command``'s children, unless one starts its own),
    which is how ``cancel`` finds them all (:func:`hpc_ddp.backends.local.process.session_members`),
    and a Ctrl-C at the caller's terminal reaches only the caller (``submit --wait`` answers
    it with a cancel). Its environment is ``env`` (:func:`job_environment`), which its tasks
    inherit.
    """
    import submitit

    class DetachedExecutor(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> Any:
            # submitit's own (1.5): the same parameters and environment, the controller
            # started by _start_controller instead of submitit's start_controller.
            from submitit.local.local import LocalJob as SubmititJob

            ntasks = self.parameters.get("tasks_per_node", 1)
            process = _start_controller(
                Path(self.folder),
                command,
                ntasks,
                env=env,
                timeout_min=self.parameters.get("timeout_min", 2.0),
                signal_delay_s=self.parameters.get("signal_delay_s", 30),
            )
            tasks = list(range(ntasks))
            return SubmititJob(folder=self.folder, job_id=str(process.pid), process=process,
                               tasks=tasks)  # fmt: skip

    return DetachedExecutor(folder=str(folder))


def _start_controller(
    folder: Path,
    command: str,
    ntasks: int,
    *,
    env: Mapping[str, str],
    timeout_min: float,
    signal_delay_s: int,
) -> subprocess.Popen[bytes]:
    """submitit's controller (``python -m submitit.local._local FOLDER``) with the job's
    environment (``env``) and submitit's, detached (:func:`_detached_executor`)."""
    import subprocess  # not at the top: a dry run imports this module and runs nothing

    controller_env = {
        **env,
        "SUBMITIT_LOCAL_NTASKS": str(ntasks),
        "SUBMITIT_LOCAL_COMMAND": command,
        "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * timeout_min)),
        "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(signal_delay_s)),
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_STDERR_TO_STDOUT": "",
        "SUBMITIT_EXECUTOR": "local",
        # Each task sets its own (local_gpu_plan); submitit's controller asks for a value.
        "CUDA_VISIBLE_DEVICES": "",
        "SUBMITIT_LOCAL_WITH_SHELL": "",
    }
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / CONTROLLER_LOG).open("ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "submitit.local._local", str(folder)],
            env=controller_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the controller starts, so that it and its ranks inherit that (exec
    keeps an ignored signal ignored, and Python and the session leave it so).

    A Ctrl-C at the terminal goes to the whole foreground process group. The controller leads
    a session of its own (:func:`_start_controller`), out of that group's reach; this is for
    a signal that still comes (a ``kill -INT`` of its group): submitit's controller would die
    of it and, cleaning up, SIGINT its ranks a second time while they save (a second SIGINT is
    a KeyboardInterrupt: a crash, no checkpoint) and print a traceback. Instead only
    ``submit --wait`` answers it, with the cancel an agreed stop and a checkpoint give
    (:mod:`hpc_ddp.submission.wait`); without ``--wait`` nothing at the terminal stops the run.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a thread's caller answers Ctrl-C
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


# --- a forced stop -------------------------------------------------------------------------


@dataclass(frozen=True)
class ForcedStop:
    """What a forced stop killed, and what it lost."""

    ranks: list[int]
    """The rank processes killed (those still running)."""
    reached: int | None
    """The last step training logged (``metrics.jsonl``); None when it logged none."""
    checkpoint: Checkpoint | None
    """The newest checkpoint on disk that looks whole, as listed (a file ``step-N.pt`` or a
    shard set ``step-N``, :func:`~hpc_ddp.rundir.checkpoints.newest_checkpoint`): the run goes
    on from there."""

    def lost(self) -> str:
        """What was lost, in words: the steps since the newest checkpoint."""
        if self.reached is None:
            return "no step was logged, so none is known lost"
        if self.checkpoint is None:
            return f"no checkpoint was saved: the {self.reached} step(s) trained are lost"
        lost = max(0, self.reached - self.checkpoint.step)
        return (
            f"training had logged step {self.reached}; the {lost} step(s) after checkpoint "
            f"{self.checkpoint.name} are lost"
        )


def force_stop(run_dir: Path, job_id: str | None, since: float) -> ForcedStop:
    """Stop a local run at once (a second Ctrl-C): SIGKILL its ranks, then its controller and
    every other process of its session (a ``command``'s children), each only while it
    provably is this run's, and record the attempt's end.

    A killed rank writes nothing, so the attempt's end is written here, as the ``hpc_ddp run``
    parent writes a killed child's: ``cancelled`` (a person stopped it), with what was lost.
    ``since``: when this job was started (its attempt is the one that started since).
    """
    forced = _kill_all(run_dir, job_id)
    _record_forced_end(RunPaths(run_dir), since, forced, "forced by a second Ctrl-C")
    return forced


def _kill_all(run_dir: Path, job_id: str | None) -> ForcedStop:
    """SIGKILL every process of the run still running (:func:`run_processes`), ranks first;
    what that lost."""
    ranks = [r for r, ident in live_ranks(run_dir).items() if signal_if_same(ident, signal.SIGKILL)]
    for ident in run_processes(run_dir, job_id):
        signal_if_same(ident, signal.SIGKILL)
    paths = RunPaths(run_dir)
    logged = [r["step"] for r in _metric_rows(paths.metrics) if isinstance(r.get("step"), int)]
    newest = newest_checkpoint(paths.checkpoints, run_id=recorded_run_id(paths))
    return ForcedStop(ranks, max(logged) if logged else None, newest)


GONE_WAIT_S = 10.0
"""After the SIGKILL, how long ``cancel`` waits to see every process gone (the kernel ends a
killed process at once unless it is stuck in the kernel, e.g. on a dead file system)."""


def stop_local(
    run_dir: Path, job_id: str | None, *, kill_wait_s: float = KILL_WAIT_S, poll_s: float = 0.1
) -> LocalCancel:
    """Cancel a local run and wait until every process of it has ended.

    :func:`cancel_local` sends the SIGTERM (the stop a cancel gives); then this waits up to
    ``kill_wait_s`` for the controller, the ranks and every other process of the run's
    session (:func:`run_processes`) to end, SIGKILLs those still running, records the
    attempt's end (a killed rank writes none) and waits again, :data:`GONE_WAIT_S`. It says
    ``cancelled`` only once nothing of the run runs; else ``still_running``, naming what does.
    """
    said = cancel_local(run_dir, job_id)
    if said.outcome != "cancelled":
        return said
    began = time.monotonic()
    stubborn = _wait_gone(run_dir, job_id, began + kill_wait_s, poll_s)
    if not stubborn:
        took = time.monotonic() - began
        return LocalCancel("cancelled", f"{said.message}; every process ended in {took:.1f} s")
    forced = _kill_all(run_dir, job_id)
    why = f"killed by cancel: still running {kill_wait_s:g} s after SIGTERM"
    _record_forced_end(RunPaths(run_dir), _job_started(run_dir), forced, why)
    left = _wait_gone(run_dir, job_id, time.monotonic() + GONE_WAIT_S, poll_s, kill=True)
    if not left:
        return LocalCancel(
            "cancelled",
            f"{said.message}; killed after {kill_wait_s:g} s: {len(stubborn)} process(es) "
            f"still ran after SIGTERM (pid {', '.join(str(i.pid) for i in stubborn)}) and were "
            f"sent SIGKILL; {forced.lost()}",
        )
    return LocalCancel(
        "still_running",
        f"{run_dir}: local job {job_id} still runs after SIGTERM and, {kill_wait_s:g} s later, "
        f"SIGKILL: {describe_processes(left)}. HINT: a process that survives SIGKILL is stuck "
        "in the kernel (a dead file system, a device): `ps -o pid,stat,wchan -p PID` says where.",
    )


def _wait_gone(
    run_dir: Path, job_id: str | None, deadline: float, poll_s: float, *, kill: bool = False
) -> list[ProcIdentity]:
    """Poll until no process of the run runs, or ``deadline``: those still running ([]).
    ``kill``: SIGKILL each one seen (a process started meanwhile, e.g. by a supervisor not yet
    killed, dies too)."""
    while True:
        left = run_processes(run_dir, job_id)
        if not left or time.monotonic() >= deadline:
            return left
        if kill:
            for ident in left:
                signal_if_same(ident, signal.SIGKILL)
        time.sleep(poll_s)


def _job_started(run_dir: Path) -> float:
    """When the run's current local job was started: ``local.json`` is written just after its
    controller starts, before any rank writes an attempt (0 when there is none)."""
    try:
        return (run_dir / IDENTITY_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _metric_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` that count (:func:`drop_replayed`); [] if unreadable."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return drop_replayed(rows)


def _record_forced_end(paths: RunPaths, since: float, forced: ForcedStop, why: str) -> None:
    """The attempt's end, unless it has one (rank 0 may have written it just before) or none
    started (killed before the session wrote a start: there is no attempt to end)."""
    try:
        attempts = read_ledger(paths.ledger)
    except RunDirError as exc:
        log.warning("%s", exc)
        return
    mine = [a for a in attempts if a.started >= since]
    if not mine or not mine[-1].is_open:
        return
    last = mine[-1]
    checkpoint = None if forced.checkpoint is None else forced.checkpoint.name
    line = end_event(
        attempt=last.attempt,
        restart=last.restart,
        launch=last.launch,
        job_id=last.job_id,
        job_ref=last.job_ref,
        cause=EndCause.CANCELLED,
        steps_done=forced.reached,
        checkpoint=checkpoint,
        requeue_requested=False,
        message=f"{why}: the ranks were killed; {forced.lost()}",
    )
    append_line(paths.ledger, line)


# --- how the tasks ended -------------------------------------------------------------------


@dataclass(frozen=True)
class TaskOutcome:
    """How one local task (global rank) ended, from the result submitit's task wrapper left."""

    rank: int
    ok: bool
    detail: str
    """``exit code 0``, ``ConfigError: train.model: ...``, or why there is no result."""
    reported_at: float | None
    """When the result was written (its mtime); None when the task left none."""


def _last_error_line(trace: str) -> str:
    """``ConfigError: ...`` from a formatted traceback's last line (module path dropped)."""
    lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    head, sep, tail = last.partition(": ")
    return f"{head.rsplit('.', 1)[-1]}{sep}{tail}"


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain values only: a result file is ``(str, int | str)``, and ``status`` must
    never run code that a file in a run directory names."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain value")


def _read_result(path: Path) -> tuple[str, object]:
    with path.open("rb") as f:
        value = _PlainUnpickler(f).load()
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)):
        raise ValueError(f"not a task result: {type(value).__name__}")
    return value[0], value[1]


def task_outcomes(folder: Path, job_id: str, ntasks: int) -> list[TaskOutcome]:
    """Each task's outcome, read from ``<folder>/<job>_<rank>_result.pkl``.

    submitit's task wrapper pickles ``("success", value)`` (here :func:`run_task`'s exit code)
    or ``("error", traceback)`` before the task exits. A task killed outright leaves nothing.
    """
    out = []
    for rank in range(ntasks):
        path = folder / f"{job_id}_{rank}_result.pkl"
        try:
            mtime = path.stat().st_mtime
            outcome, value = _read_result(path)
        except FileNotFoundError:
            why = "ended without a result (killed by a signal, or it exited before reporting)"
            out.append(TaskOutcome(rank, False, why, None))
            continue
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            out.append(TaskOutcome(rank, False, f"unreadable result {path.name} ({exc})", None))
            continue
        if outcome == "success":
            code = value if isinstance(value, int) else 0
            out.append(TaskOutcome(rank, code == 0, f"exit code {code}", mtime))
        else:
            out.append(TaskOutcome(rank, False, _last_error_line(str(value)), mtime))
    return out


def first_failure(outcomes: list[TaskOutcome]) -> TaskOutcome | None:
    """The failed task to blame: one killed outright (its peers only complain about the lost
    connection), else the first to report an error, else None when every task succeeded."""
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return None
    return min(failed, key=lambda o: (o.reported_at is not None, o.reported_at or 0.0, o.rank))


def local_failure(run_dir: Path, job_id: str) -> str | None:
    """``rank 1 failed: ValueError: ...`` for an ended local job, from its tasks' result files
    (for ``status``); None when no task is known to have failed."""
    folder = run_dir / "submitit"
    if (run_dir / "launches").is_dir():
        return None  # supervised: its one task is the supervisor; the ledger names the rank
    ranks = len(list((run_dir / RANKS_DIR).glob("rank-*.json")))
    ranks = max(ranks, len(list(folder.glob(f"{job_id}_*_result.pkl"))))
    if not ranks and not any(folder.glob(f"{job_id}_*_log.*")):
        return "no task started (the controller ended before it started them)"
    culprit = first_failure(task_outcomes(folder, job_id, ranks))
    return None if culprit is None else f"rank {culprit.rank} failed: {culprit.detail}"


@dataclass(frozen=True)
class LocalResult:
    """A finished local job: the controller's state and every task's outcome."""

    job_id: str
    controller: str
    """submitit's view of the controller process: FINISHED, or INTERRUPTED (killed)."""
    outcomes: list[TaskOutcome]
    supervised: bool = False
    """The one task was the supervisor: the ledger names the rank to blame, not its result."""

    def describe(self, state: str) -> str:
        """One line for the user: the run's ``state`` (the verdict ``status`` gives it) and,
        for a failure, the rank to blame."""
        line = f"local job {self.job_id}: {state}"
        culprit = None if self.supervised else first_failure(self.outcomes)
        if state == "FAILED" and culprit is not None:
            others = [str(o.rank) for o in self.outcomes if not o.ok and o.rank != culprit.rank]
            also = f" (then rank {', '.join(others)})" if others else ""
            line += f": rank {culprit.rank} failed{also}: {culprit.detail}"
        return line


def wait_local(
    job: LocalJob,
    follow: Path | None = None,
    poll_s: float = 0.5,
    follow_from: int = 0,
    on_poll: Callable[[], None] | None = None,
) -> LocalResult:
    """Wait until a local job has ended (:meth:`LocalJob.ended`), copying ``follow`` (a log
    file) to stderr meanwhile, from byte ``follow_from`` on (a resumed run appends to its
    earlier attempts' logs). ``on_poll`` is called between polls (``submit --wait`` acts on a
    Ctrl-C there, not in the handler)."""
    offset = follow_from
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character split by a read

    def copy_new() -> None:
        nonlocal offset
        if follow is None or not follow.exists():
            return
        with follow.open("rb") as f:
            f.seek(offset)
            # In pieces: a rank that floods its log must not fill this process's memory.
            while chunk := f.read(1 << 16):
                offset += len(chunk)
                sys.stderr.write(decoder.decode(chunk))
        sys.stderr.flush()

    while not job.ended():
        copy_new()
        if on_poll is not None:
            on_poll()
        time.sleep(poll_s)
    copy_new()
    controller = str(job.handle.state)
    outcomes = task_outcomes(job.folder, job.job_id, job.ntasks)
    return LocalResult(job.job_id, controller, outcomes, job.supervised)


# --- the login face ------------------------------------------------------------------------


class LocalBackend:
    """Runs go to processes of this machine (:class:`~hpc_ddp.backends.base.Backend`): no
    queue holds them; their processes, proven against what they recorded, say what they do."""

    @property
    def name(self) -> BackendName:
        """``local``."""
        return "local"

    @property
    def ledger_since_submit(self) -> bool:
        """True: a resumed local job starts only once its old ranks are provably gone."""
        return True

    def plan(self, cfg: JobConfig, paths: RunPaths, request: PlanRequest) -> SubmitPlan:
        """No script: submitit's controller starts the processes. Checks that this machine
        can run them (a dry run says so too, rather than show a job that cannot start)."""
        check_local_job(cfg)
        command = (sys.executable, "-m", "submitit.local._local", str(paths.root / "submitit"))
        return SubmitPlan(None, command, describe_local_plan(cfg, paths.root), request)

    def moved(self, plan: SubmitPlan, cfg: JobConfig, paths: RunPaths) -> SubmitPlan:
        """The plan for ``paths``: nothing was rendered, so it is made again."""
        return self.plan(cfg, paths, plan.request)

    def check(self, cfg: JobConfig) -> None:
        """:func:`check_local_job`."""
        check_local_job(cfg)

    def start(self, cfg: JobConfig, paths: RunPaths) -> Started:
        """:func:`submit_local`, after the checks, with an earlier cancel's mark cleared."""
        check_local_job(cfg)
        unmark_cancelled(paths.root)  # a resumed run's earlier cancel is not this one's
        log = paths.rank_log(0, "err")
        # Rank 0's progress goes to its stderr (logging), as on Slurm; a resumed run appends.
        follow_from = log.stat().st_size if log.exists() else 0
        try:
            job = submit_local(cfg, paths)
        except OSError as exc:  # e.g. its submitit folder cannot be made: nothing started
            raise RunDirError(
                f"{paths.root}: the local job could not start: {exc}. HINT: the run "
                "directory must be writable, with no file where it keeps its sub-directories "
                "(submitit/, logs/); fix that and submit (or resume) again."
            ) from None
        command = ("submitit-local", job.job_id)
        return Started(job.job_id, command, handle=job, follow_from=follow_from)

    def test_only(self, paths: RunPaths) -> str:
        """Refused: only Slurm answers whether a job would start."""
        del paths
        raise ConfigError("--test-only asks Slurm; HINT: use --backend slurm on a Slurm cluster.")

    def job_refs(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """None: a local job id is its controller's pid, which no scheduler knows."""
        del run_dir, manifest
        return []

    def states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """None: no queue holds a local job (:meth:`word` says what its processes do)."""
        del job_ids
        return {}

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord] | None:
        """Nothing to account for ({}, not None: no record is missing): no scheduler ran it."""
        del job_ids
        return {}

    def cancel_ids(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """The controller's pid (checked against the run's records by the cancel itself)."""
        del run_dir
        return [manifest.job_id or ""]

    def cancel(self, plan: Cancel, *, kill_wait_s: float | None = None) -> Cancelled:
        """:func:`stop_local`: returns once every process of the run has ended (SIGKILLed
        after ``kill_wait_s``, default :data:`KILL_WAIT_S`, as Slurm's ``KillWait``)."""
        wait = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
        done = stop_local(plan.where, plan.jobs[0], kill_wait_s=wait)
        return Cancelled(done.outcome, done.message)

    def word(self, run_dir: Path, job_id: str) -> Word:
        """Running while its controller or any of its rank processes is (each proven against
        its record, never a bare pid), cancelled once a person cancelled it and everything has
        stopped; and a note for ranks left orphaned."""
        controller = live_controller(run_dir, job_id)
        ranks = live_ranks(run_dir)
        if controller is None and ranks:
            listed = ", ".join(str(r) for r in sorted(ranks))
            orphans = f"the local controller has exited, but rank {listed} still run: "
            return Word(True, False, orphans + f"`hpc-ddp cancel {run_dir}` stops them")
        if controller is not None:
            return Word(True, False)
        return Word(False, was_cancelled(run_dir))

    def settled(self, run_dir: Path, job_id: str) -> bool:
        """True once neither its controller nor a rank runs: its ledger may say finished a
        moment before its processes have exited."""
        return not local_alive(run_dir, job_id)

    def startup_failure(self, run_dir: Path, job_id: str | None) -> str | None:
        """What its tasks reported in their result files (exactly, per rank), else what the
        logs say."""
        from hpc_ddp.backends.slurm.postmortem import startup_failure

        found = local_failure(run_dir, job_id) if job_id else None
        return found or startup_failure(RunPaths(run_dir).logs)

    def running(self, run_dir: Path, job_id: str | None, source: str) -> tuple[bool, str]:
        """(True, ``local job 123 is running``) while its controller or a rank runs."""
        del source
        alive = local_alive(run_dir, job_id)
        return alive, f"local job {job_id} is running" if alive else ""
