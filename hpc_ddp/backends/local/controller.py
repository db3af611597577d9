"""A local run's controller: submitit's, the one detached process that runs a local job's tasks.

submitit's LocalExecutor already starts N real task processes, watches them and forwards
signals, so it does that job here (with ``fault.enabled``, one task: the supervisor, which
starts the ranks itself). Each task runs :func:`hpc_ddp.job.local_task.run_task` (or
:func:`~hpc_ddp.job.local_task.run_supervisor`): what ``hpc-ddp run`` runs on a Slurm task,
in the same run directory, logs and checkpoints included.

The controller is detached from whoever submitted: its stdin is ``/dev/null``, its output a
log file of the run, and it leads a session of its own, so ``$(hpc-ddp submit ...)`` returns
once submitted, and every process of the run can be found (and, by a ``cancel`` that must,
killed: :mod:`hpc_ddp.backends.local.stop`). Its pid is the local job's id, its identity
``RUN_DIR/local.json`` (:mod:`hpc_ddp.backends.local.process`). :func:`wait_local` waits for
it and its ranks to end and reads how each task ended (:mod:`hpc_ddp.backends.local.outcome`).

Imports submitit only when used: never on the dry-run path.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.local.outcome import LocalResult, task_outcomes
from hpc_ddp.backends.local.plan import free_port, job_environment, local_gpu_plan
from hpc_ddp.backends.local.process import (
    clear_rank_identities,
    identify_started,
    live_ranks,
    write_identity,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.rundir.layout import RunPaths

if TYPE_CHECKING:
    import subprocess


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
        signal_delay_s=cfg.requeue.lead_s,
    )
    gpus = local_gpu_plan(cfg.slurm, os.environ.get("CUDA_VISIBLE_DEVICES"))
    started = time.time()
    with _sigint_ignored():
        # The tasks' entry points, which submitit pickles by name and runs in the tasks.
        from hpc_ddp.job.local_task import run_supervisor, run_task

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
    it with a cancel). Its environment is ``env``
    (:func:`~hpc_ddp.backends.local.plan.job_environment`), which its tasks inherit.
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
