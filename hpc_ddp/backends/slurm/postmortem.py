"""Why a job failed, read from the words its logs kept: parsing is pure, reading is a few tails.

A rank killed outright (SIGKILL, the OOM killer, a segfault) writes nothing: the ledger then
holds, at best, a peer's complaint about the lost connection ("rank 0 on n1: RuntimeError:
... Connection reset by peer"), which names the wrong rank. srun saw the death and says so in
the batch script's stderr (``RUN_DIR/logs/batch-<job>.err``; a sweep task's is in the sweep's
``logs/``), then terminates the others::

    srun: error: n2: task 1: Killed
    srun: launch/slurm: _step_signal: Terminating StepId=206.0
    srun: error: n1: task 0: Terminated
    srun: Force Terminated StepId=206.0

The first failed task of the last such burst is the culprit; the lines after it are srun
cleaning up. A requeued job appends every attempt to the same log (``--open-mode=append``), so
an earlier attempt's burst must not be blamed for the last one: a line that is not part of a
burst (an attempt's start, a warning, anything else) ends it.

A job that dies before its first attempt starts (all checkpoints damaged, a bad import, a
missing interpreter) leaves no ledger entry at all; :func:`startup_failure` finds its error
in srun's words, the rank logs (``hpc-ddp run: error: ...``, a traceback's last line, read as
every backend reads them: :mod:`hpc_ddp.backends.ranklogs`) or the batch log.
:class:`SrunPostmortem` is Slurm's :class:`~hpc_ddp.backends.base.Postmortem`: what ``status``
and the doctor ask of a Slurm job's logs.

The supervisor (``fault:``) reads srun's lines as they come (:func:`parse_srun_line`): a task
that ended, a node that failed (``srun: error: Node failure on n2``, SlurmdTimeout after the
node went silent; ``Task launch for StepId=... failed on node n2: ...``), and a step Slurm
would not create (``Unable to create step for job 42: Requested node configuration is not
available``: too few usable nodes left).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.backends.arrays import batch_logs
from hpc_ddp.backends.ranklogs import rank_error, rank_logs, tail

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


@dataclass(frozen=True)
class NodeFailure:
    """A node srun says failed under the step."""

    node: str
    reason: str


@dataclass(frozen=True)
class StepRefused:
    """srun could not create the step at all (no task ran)."""

    reason: str

    @property
    def too_few_nodes(self) -> bool:
        """The allocation no longer has the nodes the step needs (some were lost)."""
        return "node configuration is not available" in self.reason


_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (?P<node>\S+)$")
_LAUNCH_FAILED = re.compile(
    r"^srun: error: Task launch for StepId=\S+ failed on node (?P<node>[^:\s]+): (?P<reason>.+)$"
)
_STEP_REFUSED = re.compile(r"^srun: error: Unable to create step for job \S+: (?P<reason>.+)$")

SrunEvent = list[TaskFailure] | NodeFailure | StepRefused


def parse_srun_line(raw: str) -> SrunEvent | None:
    """What one line of srun's stderr says about its step, or None for anything else."""
    line = raw.strip()
    if match := _FAILURE.match(line):
        reason = match["reason"].strip()
        return [TaskFailure(r, match["node"], reason) for r in _ranks(match["tasks"])]
    if match := _NODE_FAILURE.match(line):
        return NodeFailure(match["node"], "srun: Node failure")
    if match := _LAUNCH_FAILED.match(line):
        return NodeFailure(match["node"], f"srun: task launch failed: {match['reason'].strip()}")
    if match := _STEP_REFUSED.match(line):
        return StepRefused(match["reason"].strip())
    return None


def exit_code_of(reason: str) -> int | None:
    """``Exited with exit code 7`` -> 7; None for a death by signal (``Killed``...)."""
    prefix = "Exited with exit code "
    tail = reason.removeprefix(prefix)
    return int(tail) if reason.startswith(prefix) and tail.isdigit() else None


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


def _batch_errs(logs_dir: Path) -> list[Path]:
    """The run's ``batch-*.err`` logs, oldest first (``logs_dir`` is ``RUN_DIR/logs``; a sweep
    task's are in its sweep's ``logs/``, see
    :func:`~hpc_ddp.backends.arrays.batch_logs`)."""
    return sorted(batch_logs(logs_dir, "err"), key=lambda p: p.stat().st_mtime)


def failed_rank(logs_dir: Path) -> TaskFailure | None:
    """:func:`first_failure` of the newest ``batch-*.err`` of the run whose ``logs/``
    directory is ``logs_dir`` (a sweep task's are in the sweep's ``logs/``)."""
    try:
        logs = _batch_errs(logs_dir)
    except OSError:
        return None
    if not logs:
        return None
    try:
        text = logs[-1].read_text(errors="replace")
    except OSError:
        return None
    return first_failure(text)


# The batch shell's own complaints ("line 9: /venv/bin/python: No such file or directory",
# "module: command not found"), not srun's notes ("lacks support for cpu binding").
_SHELL_ERROR = re.compile(
    r"error|not found|no such file|permission denied|killed|segmentation fault|cannot|failed",
    re.IGNORECASE,
)


def startup_failure(logs_dir: Path) -> str | None:
    """Why a job ended without a word in its ledger, from what its logs say; None if silent.

    In order: a task srun saw killed by a signal (it wrote nothing itself); the lowest rank
    whose ``rank-N.err`` ends in an error (``hpc-ddp run: error: ... none of 2 checkpoints
    loads``); any task srun saw fail; the batch script's last error line (a ``module load``
    or a missing interpreter fails before srun starts). Warnings are not errors: a log of
    notes only is silence.
    """
    failure = failed_rank(logs_dir)
    if failure is not None and not failure.reason.startswith("Exited with exit code"):
        return failure.describe()
    try:
        ranks = rank_logs(logs_dir)
        batch_errs = _batch_errs(logs_dir)
    except OSError:
        return None
    said = rank_error(ranks)
    if said is not None:
        return said
    if failure is not None:
        return failure.describe()
    if batch_errs:
        lines = [raw.strip() for raw in tail(batch_errs[-1]).splitlines()]
        words = [x for x in lines if _SHELL_ERROR.search(x) and not _CLEANUP.match(x)]
        if words:
            return f"{batch_errs[-1].name}: {words[-1][:300]}"
    return None


def has_logs(logs_dir: Path) -> bool:
    """True once the batch script (or a rank) has written any log file."""
    try:
        batch = any(batch_logs(logs_dir, s) for s in ("out", "err"))
        return batch or any(logs_dir.glob("rank-*"))
    except OSError:
        return False


class SrunPostmortem:
    """Slurm's :class:`~hpc_ddp.backends.base.Postmortem`: srun's words in the batch log."""

    def failed_rank(self, logs_dir: Path) -> TaskFailure | None:
        """:func:`failed_rank`."""
        return failed_rank(logs_dir)

    def no_log(self, logs_dir: Path) -> str | None:
        """``the batch script left no log in logs/ (it never started?)`` unless
        :func:`has_logs`."""
        if has_logs(logs_dir):
            return None
        return "the batch script left no log in logs/ (it never started?)"
