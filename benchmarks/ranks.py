"""Start the ranks of a benchmark on this machine with torchrun's environment, minus its agent.

torchrun's agent is one more process importing torch on a 2-core machine; the benchmarks only
need what it hands each rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...), so that
``derive_dist_env`` sees the ``torchrun`` launcher, and one intra-op thread per rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import REPO
from hpc_ddp.backends.local.plan import free_port

# Set by a launcher or by Slurm around us: a rank must see only the variables given to it.
_LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "HPC_DDP_")
_LAUNCH_NAMES = frozenset(
    {"RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
     "MASTER_PORT"}
)  # fmt: skip


class RankResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def rank_env(rank: int, world: int, port: int, extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without launcher variables, plus rank ``rank``'s."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_LAUNCH_PREFIXES) and name not in _LAUNCH_NAMES
    }
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    torchrun = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GROUP_RANK": "0"}
    sizes = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
    ranks = {"RANK": str(rank), "LOCAL_RANK": str(rank)}
    return {
        **env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
        **torchrun,
        **sizes,
        **ranks,
        **extra,
    }


def run_ranks(
    argv: Sequence[str], world: int, extra_env: Mapping[str, str], timeout_s: float
) -> list[RankResult]:
    """``python ARGV`` once per rank, all killed after ``timeout_s``; each rank's outcome.

    Output goes to files, not pipes: a full pipe would stall a rank inside a collective.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        logs = [(Path(tmp, f"{r}.out"), Path(tmp, f"{r}.err")) for r in range(world)]
        procs = []
        for rank, (out, err) in enumerate(logs):
            with out.open("wb") as stdout, err.open("wb") as stderr:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *argv],
                        cwd=REPO,
                        env=rank_env(rank, world, port, extra_env),
                        stdout=stdout,
                        stderr=stderr,
                    )
                )
        deadline = time.monotonic() + timeout_s
        try:
            codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return [
            RankResult(code, out.read_text(errors="replace"), err.read_text(errors="replace"))
            for code, (out, err) in zip(codes, logs, strict=True)
        ]
