"""How a local job's tasks ended: each task's outcome, read from the result file submitit's
task wrapper leaves, the rank to blame for a failure, and a finished job's result.

A result file is read as plain values only (``status`` never runs code a file in a run
directory names). A supervised run's one task is its supervisor: there the ledger, not the
result, names the rank to blame.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.backends.local.process import RANKS_DIR


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

    submitit's task wrapper pickles ``("success", value)`` (here the exit code of
    :func:`~hpc_ddp.job.local_task.run_task`) or ``("error", traceback)`` before the task
    exits. A task killed outright leaves nothing.
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
