"""The local backend: the same runtime in ``nodes x tasks_per_node`` processes on this machine.

submitit's LocalExecutor already starts N real task processes, watches them and forwards
signals, so it does that job here. Each task maps submitit's ids onto the torchrun-style
variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and then runs exactly what ``hpc-ddp run``
runs on a Slurm task: the run directory is the same, logs and checkpoints included.

No rank outlives its controller: each asks the kernel for a SIGTERM when the controller dies
(the stop a cancel gives: the ranks agree on a step, rank 0 saves), and records its identity
in ``RUN_DIR/local-ranks/`` so that ``status``, ``cancel`` and ``resume`` still see it if
that failed (:mod:`hpc_ddp.local.process`).

Imports submitit (and, in the task, torch) only when used: never on the dry-run path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hpc_ddp.config.model import JobConfig
from hpc_ddp.layout import NO_PDEATHSIG_ENV, PER_RANK_LOGS_ENV, RunPaths
from hpc_ddp.local.process import (
    RANKS_DIR,
    clear_rank_identities,
    identify,
    identify_started,
    write_identity,
    write_rank_identity,
)

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


def free_port() -> int:
    """A TCP port that is free on loopback right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _StoppedEarly(BaseException):
    """SIGTERM while no session catches it (before training started): nothing to save."""


def _stop_early(signum: int, frame: FrameType | None) -> None:
    del frame
    raise _StoppedEarly(signum)


def _die_with_controller(controller: int) -> None:
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


def run_task(run_dir: str, master_port: int) -> int:
    """Body of one local task: set the dist variables from submitit's, then run the job."""
    import submitit

    from hpc_ddp.job.task import run_job

    env = submitit.JobEnvironment()
    # Until the session catches stop signals, a SIGTERM (a cancel, the controller's death)
    # ends the task at once: submitit's own handler would only log it and train on.
    signal.signal(signal.SIGTERM, _stop_early)
    try:
        if os.environ.get(NO_PDEATHSIG_ENV) != "1":
            _die_with_controller(int(env.job_id) if env.job_id.isdigit() else os.getppid())
        me = identify(os.getpid())
        if me is not None:
            write_rank_identity(Path(run_dir), env.global_rank, me)
        _set_dist_env(env.global_rank, env.local_rank, env.num_tasks, master_port)
        from hpc_ddp.job.task import redirect_to_rank_logs, task_run_dir

        redirect_to_rank_logs(RunPaths(task_run_dir(Path(run_dir), os.environ)), env.global_rank)
        return run_job(Path(run_dir), os.environ)
    except _StoppedEarly as stop:
        name = signal.Signals(stop.args[0]).name
        raise RuntimeError(
            f"{name} before training started (the run was cancelled or its controller "
            "exited): stopped, nothing to save"
        ) from None
    finally:
        # The task is over: a late SIGTERM must not turn its result into a failure.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _set_dist_env(rank: int, local_rank: int, world: int, master_port: int) -> None:
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
        }
    )


def submit_local(cfg: JobConfig, paths: RunPaths) -> LocalJob:
    """Start the job's tasks as local processes; returns at once.

    The controller's identity goes to ``RUN_DIR/local.json`` so that ``cancel`` can prove,
    later, that the pid it is about to signal is still this run's
    (see :mod:`hpc_ddp.local.process`); the ranks record their own as they start.
    """
    import submitit

    clear_rank_identities(paths.root)  # a resumed run's earlier ranks are not this job's
    executor = submitit.LocalExecutor(folder=str(paths.root / "submitit"))
    executor.update_parameters(
        tasks_per_node=cfg.slurm.ntasks,
        nodes=1,
        timeout_min=max(1, cfg.slurm.time_s // 60),
        # Mirror the rendered --signal: submitit sends USR2 this long before the timeout.
        signal_delay_s=cfg.requeue.lead_time,
    )
    job = executor.submit(run_task, str(paths.root), free_port())
    ident = identify_started(int(job.job_id))
    if ident is not None:
        write_identity(paths.root, ident)
    return LocalJob(str(job.job_id), job, cfg.slurm.ntasks, paths.root / "submitit")


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

    def state(self, cancelled: bool) -> str:
        """A Slurm-like state: COMPLETED, CANCELLED or FAILED."""
        if cancelled:
            return "CANCELLED"
        ok = self.controller == "FINISHED" and all(o.ok for o in self.outcomes)
        return "COMPLETED" if ok else "FAILED"

    def describe(self, cancelled: bool = False) -> str:
        """One line for the user: the state and, for a failure, the rank to blame."""
        state = self.state(cancelled)
        line = f"local job {self.job_id}: {state}"
        culprit = first_failure(self.outcomes)
        if state == "FAILED" and culprit is not None:
            others = [str(o.rank) for o in self.outcomes if not o.ok and o.rank != culprit.rank]
            also = f" (then rank {', '.join(others)})" if others else ""
            line += f": rank {culprit.rank} failed{also}: {culprit.detail}"
        elif state == "FAILED":
            line += f": the controller ended {self.controller}"
        return line


def wait_local(
    job: LocalJob, follow: Path | None = None, poll_s: float = 0.5, follow_from: int = 0
) -> LocalResult:
    """Wait until a local job ends, copying ``follow`` (a log file) to stderr meanwhile, from
    byte ``follow_from`` on (a resumed run appends to its earlier attempts' logs)."""
    offset = follow_from

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
    controller = str(job.handle.state)
    outcomes = task_outcomes(job.folder, job.job_id, job.ntasks)
    return LocalResult(job.job_id, controller, outcomes)
