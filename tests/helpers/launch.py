"""Start N real rank processes the way torchrun would (RANK, WORLD_SIZE, MASTER_* ...).

Cheaper than torchrun itself (no agent process that imports torch too), with the same
environment contract, so ``derive_dist_env`` sees the ``torchrun`` launcher.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class Ranks:
    """The rank processes of one launch; their output goes to files (pipes could fill up and
    block a rank while its peer waits for it in a collective)."""

    procs: list[subprocess.Popen[bytes]]
    outputs: Sequence[tuple[IO[bytes], IO[bytes]]]

    def wait(self, timeout: float = 60.0) -> list[tuple[int, str, str]]:
        """(returncode, stdout, stderr) per rank; kills all of them on timeout."""
        deadline = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        out = []
        for p, (stdout, stderr) in zip(self.procs, self.outputs, strict=True):
            out.append((p.returncode, _read(stdout), _read(stderr)))
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
    procs = []
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
        files = (tempfile.TemporaryFile(), tempfile.TemporaryFile())  # noqa: SIM115 (Ranks closes)
        outputs.append(files)
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=rank_env, cwd=REPO, stdout=files[0], stderr=files[1]
            )
        )
    return Ranks(procs, outputs)


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
