"""Which rank failed first, read from srun's own words in the batch log. Pure but for one read.

A rank killed outright (SIGKILL, the OOM killer, a segfault) writes nothing: the ledger then
holds, at best, a peer's complaint about the lost connection ("rank 0 on n1: RuntimeError:
... Connection reset by peer"), which names the wrong rank. srun saw the death and says so in
the batch script's stderr (``RUN_DIR/logs/batch-<job>.err``), then terminates the others::

    srun: error: n2: task 1: Killed
    srun: launch/slurm: _step_signal: Terminating StepId=206.0
    srun: error: n1: task 0: Terminated
    srun: Force Terminated StepId=206.0

The first failed task of the last such burst is the culprit; the lines after it are srun
cleaning up. A requeued job appends every attempt to the same log (``--open-mode=append``), so
an earlier attempt's burst must not be blamed for the last one: a line that is not part of a
burst (an attempt's start, a warning, anything else) ends it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# "srun: error: n2: task 1: Killed", "srun: error: n1: tasks 0-1: Exited with exit code 1"
_FAILURE = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<reason>.+)$")
# srun's clean-up after a failure: part of the same burst, blames nobody.
_CLEANUP = re.compile(
    r"^srun: (launch/slurm: _step_signal: Terminating|Force Terminated|Job step aborted"
    r"|error: Timed out waiting for job step to complete)|^slurmstepd: error: \*\*\* STEP"
)


@dataclass(frozen=True)
class TaskFailure:
    """One task (global rank) srun reported as failed."""

    rank: int
    node: str
    reason: str
    """srun's words: ``Killed``, ``Exited with exit code 1``, ``Segmentation fault`` ..."""

    def describe(self) -> str:
        """``rank 1 on n2: Killed``."""
        return f"rank {self.rank} on {self.node}: {self.reason}"


def _ranks(spec: str) -> list[int]:
    ranks: list[int] = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


def parse_failure_bursts(text: str) -> list[list[TaskFailure]]:
    """Every burst of srun task failures in ``text``, in order (see the module docstring)."""
    bursts: list[list[TaskFailure]] = []
    current: list[TaskFailure] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _FAILURE.match(line)
        if match:
            if current is None:
                current = []
                bursts.append(current)
            reason = match["reason"].strip()
            current.extend(TaskFailure(r, match["node"], reason) for r in _ranks(match["tasks"]))
        elif current is not None and not _CLEANUP.match(line):
            current = None
    return [b for b in bursts if b]


def first_failure(text: str) -> TaskFailure | None:
    """The task that failed first in the last burst of ``text``, or None when none failed."""
    bursts = parse_failure_bursts(text)
    return bursts[-1][0] if bursts else None


def failed_rank(logs_dir: Path) -> TaskFailure | None:
    """:func:`first_failure` of the newest ``batch-*.err`` in a run's ``logs/`` directory."""
    try:
        logs = sorted(logs_dir.glob("batch-*.err"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    if not logs:
        return None
    try:
        text = logs[-1].read_text(errors="replace")
    except OSError:
        return None
    return first_failure(text)
