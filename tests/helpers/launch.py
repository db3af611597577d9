"""Start N real rank processes the way torchrun would (RANK, WORLD_SIZE, MASTER_* ...).

Cheaper than torchrun itself (no agent process that imports torch too), with the same
environment contract, so ``derive_dist_env`` sees the ``torchrun`` launcher. The ranks are
forked from a process that imported torch once (:mod:`tests.helpers.zygote`), unless their
environment differs from it in what torch reads at import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from hpc_ddp.backends.local import plan as local_plan

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def free_port() -> int:
    """The local backend's pick (below the ephemeral range, which other tests' connections
    take ports from)."""
    return local_plan.free_port()


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean child environment: no inherited launcher or Slurm variables, one thread."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "HPC_DDP_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


IMPORT_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH", "PYTHON", "LD_")
"""Variables read while torch is imported (or by the interpreter at its start): a rank whose
values differ from the zygote's starts fresh. (CUDA's are read when CUDA is first used, which
the zygote never does.)"""


class RankProcess(Protocol):
    """What the tests use of a rank's process (a ``Popen``, or a :class:`Forked` one)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class Forked:
    """A rank forked by the zygote: ``Popen``'s face, its exit status reported by the zygote."""

    def __init__(self, pid: int, zygote: _Zygote) -> None:
        self.pid = pid
        self._zygote = zygote

    @property
    def returncode(self) -> int | None:
        return self._zygote.codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._zygote.changed:
            ended = self._zygote.changed.wait_for(
                lambda: self.pid in self._zygote.codes or self._zygote.gone, timeout
            )
        if not ended:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
        code = self.returncode
        if code is None:
            raise RuntimeError(f"the zygote ended before rank pid {self.pid}")
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    """This test process's zygote (:mod:`tests.helpers.zygote`), started at first use."""

    def __init__(self) -> None:
        self.env = base_env()
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPERS / "zygote.py")], env=self.env, cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.codes: dict[int, int] = {}
        self.gone = False
        self.changed = threading.Condition()
        self._pids: list[int] = []
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline() or b"{}")
        if "ready" not in first:
            raise RuntimeError(f"the zygote did not start: {self.proc.wait()}")
        threading.Thread(target=self._read, daemon=True).start()

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a rank with ``env`` may be forked: torch was imported under the same."""

        def imported(e: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k.startswith(IMPORT_ENV)}

        return self.proc.poll() is None and imported(env) == imported(self.env)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], outputs: Sequence[str]) -> Forked:
        request = {"argv": [*argv], "env": dict(env), "cwd": str(REPO),
                   "stdout": outputs[0], "stderr": outputs[1]}  # fmt: skip
        with self._lock, self.changed:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            self.changed.wait_for(lambda: self._pids or self.gone, 60)
            if not self._pids:
                raise RuntimeError("the zygote forked no rank")
            return Forked(self._pids.pop(0), self)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event: dict[str, Any] = json.loads(line)
            with self.changed:
                if "pid" in event:
                    self._pids.append(int(event["pid"]))
                else:
                    self.codes[int(event["exited"])] = int(event["code"])
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


NO_ZYGOTE_ENV = "HPC_DDP_TEST_FRESH_RANKS"
"""Set to 1: every rank starts a fresh interpreter (to rule the zygote out, or to time it)."""


def _forker(env: Mapping[str, str]) -> _Zygote | None:
    global _zygote
    if os.environ.get(NO_ZYGOTE_ENV) == "1":
        return None
    with _zygote_lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        return _zygote if _zygote.fits(env) else None


@dataclass
class Ranks:
    """The rank processes of one launch; their output goes to files (pipes could fill up and
    block a rank while its peer waits for it in a collective)."""

    procs: list[RankProcess]
    outputs: Sequence[tuple[IO[bytes], IO[bytes]]]

    def wait(self, timeout: float = 60.0) -> list[tuple[int, str, str]]:
        """(returncode, stdout, stderr) per rank; kills all of them on timeout."""
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        out = []
        for code, (stdout, stderr) in zip(codes, self.outputs, strict=True):
            out.append((code, _read(stdout), _read(stderr)))
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    Path(f.name).unlink(missing_ok=True)  # a forked rank's (the others' are gone already)
    return text


def start_ranks(
    argv: Sequence[str],
    world: int,
    env: Mapping[str, str] | None = None,
    *,
    per_node: int | None = None,
) -> Ranks:
    """Start ``python argv...`` once per rank, torchrun-style, on one free port; ``per_node``
    ranks to a (pretended) node, all of them on one by default."""
    port = free_port()
    procs: list[RankProcess] = []
    outputs = []
    per_node = per_node or world
    for rank in range(world):
        rank_env = base_env(env)
        rank_env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank % per_node),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(per_node),
            GROUP_RANK=str(rank // per_node),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        proc, files = start_process(argv, rank_env)
        procs.append(proc)
        outputs.append(files)
    return Ranks(procs, outputs)


def start_process(
    argv: Sequence[str], env: Mapping[str, str]
) -> tuple[RankProcess, tuple[IO[bytes], IO[bytes]]]:
    """``python argv...`` with exactly ``env``, in the repository: forked from the zygote where
    ``env`` fits it, else started fresh; its stdout and stderr files (read them with
    :meth:`Ranks.wait`, or seek and read, then close)."""
    zygote = _forker(env)
    named = zygote is not None  # the zygote's child opens them by name
    files: tuple[IO[bytes], IO[bytes]] = (
        tempfile.NamedTemporaryFile(delete=not named),  # noqa: SIM115 (the caller closes)
        tempfile.NamedTemporaryFile(delete=not named),  # noqa: SIM115
    )
    if zygote is not None:
        return zygote.spawn(argv, env, [files[0].name, files[1].name]), files
    popen = subprocess.Popen(
        [sys.executable, *argv], env=dict(env), cwd=REPO, stdout=files[0], stderr=files[1]
    )
    return popen, files


def run_ranks(
    argv: Sequence[str],
    world: int,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    *,
    per_node: int | None = None,
) -> list[tuple[int, str, str]]:
    """Start the ranks and wait for all of them."""
    return start_ranks(argv, world, env, per_node=per_node).wait(timeout)
