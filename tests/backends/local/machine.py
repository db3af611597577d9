"""What the local backend's end-to-end tests read of this machine and run on it.

Processes are read from ``/proc`` (no code of the package under test decides what is found);
the CLI runs as a user runs it, with no Slurm variables (a local run is not a Slurm job).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def says(log: Path, text: str) -> bool:
    """Whether ``log`` exists and holds ``text``."""
    return log.is_file() and text in log.read_text()


def proc_state(pid: int) -> str:
    """The state letter ``/proc/PID/stat`` gives (``Z``: a zombie)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def pids_running(needle: str) -> list[int]:
    """Every process whose command line contains ``needle`` (read from /proc: no code of the
    package under test decides what is found)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if needle in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def hpc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``hpc-ddp ARGS`` from the repository, with no Slurm variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run([sys.executable, "-m", "hpc_ddp", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
