"""The local backend's launcher: the supervisor's ranks as processes of this machine.

With ``fault.enabled`` a local run's controller (submitit's) runs one task, the supervisor
(:func:`hpc_ddp.job.local_task.run_supervisor`), and the supervisor starts each launch's
``nodes x tasks_per_node`` ranks itself (:class:`LocalLauncher`, the
:class:`~hpc_ddp.backends.base.Launcher` of this backend): ``python -m hpc_ddp run RUN_DIR``
with the torchrun-style variables, a free port per launch, each rank's own GPUs, its output
appended to ``logs/rank-N.{out,err}``. So a crash, a hang or a killed rank is restarted in the
same process tree from the newest checkpoint, exactly as on Slurm
(:mod:`hpc_ddp.fault.supervisor`), and the supervisor knows each rank's exit status exactly
(``waitpid``: -9 is SIGKILL).

No rank outlives the supervisor (``PR_SET_PDEATHSIG``), nor the supervisor its controller; each
rank's identity goes to ``RUN_DIR/local-ranks/`` as it starts, so that ``status``, ``cancel`` and
``resume`` still find it if that failed (:mod:`hpc_ddp.backends.local.process`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hpc_ddp.backends.base import LaunchShape, TaskEnd
from hpc_ddp.backends.local.plan import free_port
from hpc_ddp.backends.local.process import identify_started, write_rank_identity
from hpc_ddp.rundir.layout import (
    LOCAL_GPUS_ENV,
    LOCAL_GPUS_PER_TASK_ENV,
    LOCAL_JOB_ENV,
    NO_PDEATHSIG_ENV,
    PER_RANK_LOGS_ENV,
    RunPaths,
)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

LOCAL_LAUNCHER = "local launcher"
"""Who reports a local rank's end in a blame (``Killed (local launcher)``): there is no srun."""


def _die_with_parent() -> None:
    """In a rank just forked: SIGTERM when the supervisor dies (the stop a cancel gives)."""
    libc = ctypes.CDLL(None, use_errno=True)
    args = [ctypes.c_ulong(int(signal.SIGTERM))] + [ctypes.c_ulong(0)] * 3
    libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *args)


def _reason(code: int) -> str:
    """``Killed``, ``Exited with exit code 1``: ``waitpid``'s status in srun's words."""
    if code >= 0:
        return f"Exited with exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"Killed by signal {-code}"
    return {"SIGKILL": "Killed", "SIGSEGV": "Segmentation fault", "SIGTERM": "Terminated"}.get(
        name, f"Killed by {name}"
    )


class LocalStep:
    """One launch's rank processes."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], files: list[IO[bytes]]) -> None:
        self.procs = procs
        self._files = files
        self._ends: list[TaskEnd] = []

    def _reap(self) -> None:
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None or code == 0 or any(e.rank == rank for e in self._ends):
                continue
            exit_code = code if code >= 0 else None
            self._ends.append(TaskEnd(rank, "local", _reason(code), exit_code, LOCAL_LAUNCHER))

    def poll(self) -> int | None:
        """The highest exit status (a death by signal N as 128 + N) once every rank is gone."""
        self._reap()
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        return max((128 - c if c < 0 else c) for c in codes if c is not None)

    def task_ends(self) -> list[TaskEnd]:
        """Ranks that ended badly, in the order they were seen."""
        self._reap()
        return list(self._ends)

    def node_failures(self) -> list[tuple[str, str]]:
        """None: this machine is the only node."""
        return []

    def node_answers(self, node: str) -> bool | None:
        """This machine, the only node, answers while it runs this."""
        return True

    def refused(self) -> str | None:
        """None: local processes always start."""
        return None

    def _send(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    def signal(self, name: str, beats: Mapping[int, Any]) -> None:
        """Send ``SIG<name>`` to every rank still running."""
        del beats
        self._send(int(getattr(signal, f"SIG{name}")))

    def kill(self, beats: Mapping[int, Any]) -> None:
        """SIGCONT then SIGKILL every rank still running (a stopped one must die too)."""
        del beats
        self._send(signal.SIGCONT)
        self._send(signal.SIGKILL)

    def forward(self, signum: int) -> None:
        """A stop signal the supervisor got (a cancel, the time-limit warning): to every rank."""
        self._send(signum)

    def abandon(self) -> None:
        """Nothing to leave behind: local ranks always end when killed."""


class LocalLauncher:
    """Starts each launch's ranks on this machine: the local backend's node face
    (:class:`~hpc_ddp.backends.base.Launcher`)."""

    def __init__(
        self,
        run_dir: Path,
        ntasks: int,
        job_id: str,
        *,
        gpus: Sequence[str] | None = None,
        per_task: int | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.paths = RunPaths(run_dir)
        self.ntasks = ntasks
        self.job_id = job_id
        self.gpus = gpus
        self.per_task = per_task

    def _rank_env(self, rank: int, port: int, env: Mapping[str, str]) -> dict[str, str]:
        # Started from inside a Slurm allocation, the ranks would inherit its job id and ask
        # Slurm to requeue a job that is not theirs: a local run is not a Slurm job.
        base = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        out = {
            **base,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.ntasks),
            "LOCAL_WORLD_SIZE": str(self.ntasks),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            PER_RANK_LOGS_ENV: "1",
            LOCAL_JOB_ENV: self.job_id,
        }
        if self.gpus is not None:
            mine = self.gpus[rank]
            out["CUDA_VISIBLE_DEVICES"] = mine
            out[LOCAL_GPUS_ENV] = str(len([d for d in mine.split(",") if d]))
            if self.per_task:
                out[LOCAL_GPUS_PER_TASK_ENV] = str(self.per_task)
        return out

    def start(self, plan: LaunchShape, env: Mapping[str, str]) -> LocalStep:
        """Start every rank of ``plan`` (on this machine: ``exclude`` does not apply)."""
        del plan
        port = free_port()
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        orphans = os.environ.get(NO_PDEATHSIG_ENV) == "1"
        procs: list[subprocess.Popen[bytes]] = []
        files: list[IO[bytes]] = []
        for rank in range(self.ntasks):
            out = self.paths.rank_log(rank, "out").open("ab")
            err = self.paths.rank_log(rank, "err").open("ab")
            files += [out, err]
            proc = subprocess.Popen(
                [sys.executable, "-m", "hpc_ddp", "run", str(self.run_dir)],
                env=self._rank_env(rank, port, env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                preexec_fn=None if orphans else _die_with_parent,  # noqa: PLW1509
            )
            procs.append(proc)
            ident = identify_started(proc.pid)
            if ident is not None:
                write_rank_identity(self.run_dir, rank, ident)
        return LocalStep(procs, files)

    def nodes(self) -> tuple[str, ...]:
        """None to count: every launch runs on this machine."""
        return ()

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """None: this machine is up."""
        del nodes
        return {}

    def requeue(self, exclude: Sequence[str]) -> str | None:
        """Nothing requeues a local run."""
        del exclude
        return "not a Slurm job: nothing requeues a local run (`hpc-ddp resume` does)"
