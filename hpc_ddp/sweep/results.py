"""Reading a sweep directory: its points, its job arrays, how each task stands, and its metrics.

A sweep directory (written by :mod:`hpc_ddp.sweep.submit`)::

    SWEEP_DIR/
      sweep.yaml       the expanded points and what they set (one JSON-valued line per point)
      arrays.json      every job array submitted for it: job id, the points it runs, offset
      manifest.json    the sweep's manifest (``array_jobs``: every array job id, in order)
      job.sbatch       the array's script (``job-<n>.sbatch`` for later arrays)
      tasks/<i>/       point i's run directory (config.yaml, ledger.jsonl, metrics.jsonl, ...)

A task's state comes from two witnesses: Slurm (squeue keeps a task for ``MinJobAge`` after it
ends) and the task's ledger, whose last attempt's cause says whether it finished. Neither alone
is enough: a task killed without a word leaves an open ledger entry, and a finished task
disappears from squeue. Everything here reads files only; the Slurm view is passed in.
Login-node side: standard library, PyYAML and the pure core.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hpc_ddp.config.yaml_dialect import parse_yaml
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.rundir import RunPaths
from hpc_ddp.runtime.ledger import Attempt, EndCause, read_ledger
from hpc_ddp.slurm.client import JobInfo, JobState

SWEEP_RECORD = "sweep.yaml"
ARRAYS_RECORD = "arrays.json"

log = logging.getLogger(__name__)


class TaskState(str, Enum):
    """Where one sweep task stands."""

    PENDING = "pending"
    """Queued and never started."""
    RUNNING = "running"
    REQUEUED = "requeued"
    """Stopped on purpose (time limit, preemption, requeue) and queued to go on."""
    FINISHED = "finished"
    """Its ledger's last attempt ended ``finished``."""
    FAILED = "failed"
    """Gone from the queue without finishing (crash, budget spent, killed, never started)."""
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    """No word from Slurm and the ledger does not settle it."""


RESUBMITTABLE = frozenset({TaskState.FAILED, TaskState.CANCELLED})
"""States ``hpc-ddp sweep --resubmit-failed`` submits again."""

_RUNNING = frozenset({JobState.RUNNING, JobState.COMPLETING, JobState.CONFIGURING,
                      JobState.SUSPENDED, JobState.STOPPED, JobState.SIGNALING,
                      JobState.STAGE_OUT, JobState.RESIZING})  # fmt: skip
_REQUEUED = frozenset({JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED,
                       JobState.SPECIAL_EXIT})  # fmt: skip
_REQUEUE_CAUSES = frozenset({EndCause.TIME_LIMIT, EndCause.PREEMPTED, EndCause.MANUAL_REQUEUE})


@dataclass(frozen=True)
class SweepPointRecord:
    """One point as recorded in ``sweep.yaml``."""

    index: int
    name: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class SweepRecord:
    """``sweep.yaml``: what was expanded, and how to rank it."""

    name: str
    sweep_file: str
    base: str
    metric: str
    mode: str
    max_parallel: int | None
    keys: tuple[str, ...]
    """Every swept key, in order of first appearance."""
    points: tuple[SweepPointRecord, ...]


@dataclass(frozen=True)
class ArrayRecord:
    """One submitted job array: task id ``t`` of job ``job_id`` runs point ``t + offset``."""

    job_id: str
    points: str
    """The points it runs, as ranges (``0-5,7``)."""
    offset: int
    array: str
    """The ``--array`` value it was submitted with (task ids, ``%N`` throttle)."""
    script: str
    """Its script, relative to the sweep directory."""
    submitted_at: str
    reason: str = "sweep"
    """``sweep`` or ``resubmit-failed``."""
    command: list[str] = field(default_factory=list)


# --- index ranges -------------------------------------------------------------------------------


def format_index_ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8`` (Slurm's ``--array`` syntax, sorted)."""
    parts: list[str] = []
    ordered = sorted(set(indices))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


def parse_index_ranges(text: str) -> list[int]:
    """``0-2,5,7-11:2%3`` or squeue's ``[4-9%2]`` -> the indices (``%N`` dropped), ascending."""
    body = text.strip().strip("[]").split("%", 1)[0]
    out: set[int] = set()
    for part in filter(None, body.split(",")):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"not an array index range: {part!r} in {text!r}")
        start = int(match.group(1))
        stop = int(match.group(2) or start)
        out.update(range(start, stop + 1, int(match.group(3) or 1)))
    return sorted(out)


# --- reading the records ------------------------------------------------------------------------


def read_sweep_record(sweep_dir: Path) -> SweepRecord:
    """Read ``sweep.yaml``; a missing or damaged one is a :class:`RunDirError` with a hint.

    A path that is not a directory at all is a :class:`ConfigError` (the argument is wrong).
    """
    path = sweep_dir / SWEEP_RECORD
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(
            f"{sweep_dir}: is a file, not a sweep directory. HINT: pass the sweep directory "
            "printed by `hpc-ddp sweep` (it holds sweep.yaml and tasks/)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(
            f"{sweep_dir}: no {SWEEP_RECORD}, so not a sweep directory. HINT: pass the sweep "
            "directory printed by `hpc-ddp sweep`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(
            f"{path}: cannot read the sweep record ({exc}). HINT: check that it is a readable "
            "file written by `hpc-ddp sweep`"
        ) from None
    try:
        doc = _parse_record(text, str(path))
        points = tuple(
            SweepPointRecord(int(p["index"]), str(p["name"]), dict(p.get("overrides") or {}))
            for p in doc["points"]
        )
        max_parallel = doc.get("max_parallel")
        return SweepRecord(
            name=str(doc["name"]),
            sweep_file=str(doc.get("sweep_file", "")),
            base=str(doc.get("base", "")),
            metric=str(doc["metric"]["name"]),
            mode=str(doc["metric"]["mode"]),
            max_parallel=None if max_parallel is None else int(max_parallel),
            keys=tuple(str(k) for k in doc.get("keys") or ()),
            points=points,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunDirError(
            f"{path}: unreadable sweep record ({exc!r}). HINT: it is written by `hpc-ddp "
            "sweep`; restore it or sweep again"
        ) from None
    except ConfigError as exc:  # not YAML at all: a damaged record, not a usage error
        raise RunDirError(str(exc)) from None


def _parse_record(text: str, source: str) -> Any:
    """``sweep.yaml`` is YAML whose point lines are JSON objects: read those as JSON (fast),
    and fall back to the YAML reader should anyone have edited the file."""
    head, sep, tail = text.partition("\npoints:\n")
    if sep:
        try:
            doc = parse_yaml(head + "\n", source)
            lines = [line for line in tail.splitlines() if line.strip()]
            if isinstance(doc, dict) and all(line.startswith("- {") for line in lines):
                doc["points"] = [json.loads(line[2:]) for line in lines]
                return doc
        except ValueError:
            pass
    return parse_yaml(text, source)


def read_arrays(sweep_dir: Path) -> list[ArrayRecord]:
    """The arrays submitted for a sweep, in submission order ([] before the first submit)."""
    path = sweep_dir / ARRAYS_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [ArrayRecord(**item) for item in data]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError) as exc:
        raise RunDirError(f"{path}: unreadable array record ({exc}).") from None


def current_refs(arrays: Sequence[ArrayRecord]) -> dict[int, tuple[str, int]]:
    """Point index -> (array job id, task id) of the latest array that runs it."""
    refs: dict[int, tuple[str, int]] = {}
    for record in arrays:
        for index in parse_index_ranges(record.points):
            refs[index] = (record.job_id, index - record.offset)
    return refs


def live_task(live: Mapping[str, JobInfo], job_id: str, task_id: int) -> JobInfo | None:
    """squeue's row for one array task: its own (``J_3``) or the pending range holding it."""
    own = live.get(f"{job_id}_{task_id}")
    if own is not None:
        return own
    for info in live.values():
        text = info.array_task_id or ""
        if info.array_job_id == job_id and text.startswith("["):
            try:
                if task_id in parse_index_ranges(text):
                    return info
            except ValueError:
                continue
    return None


# --- state --------------------------------------------------------------------------------------


def task_state(attempts: Sequence[Attempt], live: JobInfo | None, live_known: bool) -> TaskState:
    """Where a task stands, from its ledger and squeue's row (``live_known``: squeue answered).

    A finished ledger wins over anything Slurm says. Otherwise a live row decides; a task that
    has left the queue without finishing failed (or was cancelled). Without squeue's answer
    the ledger's best guess is given, and ``unknown`` where it has none.
    """
    last = attempts[-1] if attempts else None
    if last is not None and last.cause is EndCause.FINISHED:
        return TaskState.FINISHED
    if live is not None:
        state = live.state
        if state in _RUNNING:
            return TaskState.RUNNING
        if state in _REQUEUED:
            return TaskState.REQUEUED
        if state is JobState.PENDING:
            return TaskState.REQUEUED if attempts or live.restart_count else TaskState.PENDING
        if state is JobState.CANCELLED or (last is not None and last.cause is EndCause.CANCELLED):
            return TaskState.CANCELLED
        if state.finished:
            return TaskState.FAILED
        return TaskState.UNKNOWN
    if last is not None and last.cause is EndCause.CANCELLED:
        return TaskState.CANCELLED
    if live_known:
        return TaskState.FAILED  # left the queue without finishing (or never ran)
    if last is None:
        return TaskState.UNKNOWN
    if last.cause is None:
        return TaskState.RUNNING if last.is_open else TaskState.UNKNOWN
    if last.cause in _REQUEUE_CAUSES and last.requeue_requested:
        return TaskState.REQUEUED
    return TaskState.FAILED


def failed_points(
    sweep_dir: Path, live: Mapping[str, JobInfo], record: SweepRecord | None = None
) -> list[int]:
    """Points to submit again: failed or cancelled per :func:`task_state`, given squeue's
    answer ``live`` for the sweep's array jobs (points never submitted count as failed)."""
    record = record or read_sweep_record(sweep_dir)
    refs = current_refs(read_arrays(sweep_dir))
    paths = RunPaths(sweep_dir)
    out = []
    for point in record.points:
        ref = refs.get(point.index)
        info = None if ref is None else live_task(live, *ref)
        if task_state(read_ledger(paths.task(point.index).ledger), info, True) in RESUBMITTABLE:
            out.append(point.index)
    return out


# --- metrics ------------------------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every whole row of a ``metrics.jsonl``; never fails.

    A torn last line (the task is writing it) is skipped silently. Other lines that are not
    JSON objects (binary junk, a list, a number) are skipped with one warning per file, and so
    is a file that cannot be read at all: a results table shows what it can.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("%s: cannot read it (%s); its task is shown without metrics", path, exc)
        return []
    lines = text.split("\n")  # a last element other than "" is a torn line, still being written
    rows = []
    bad: list[int] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif number < len(lines):
            bad.append(number)
    if bad:
        log.warning(
            "%s: skipped %d line(s) that are not JSON objects (first: line %d). HINT: each line "
            'should be one object such as {"step": 10, "loss": 0.5}; check what else '
            "writes to this file",
            path,
            len(bad),
            bad[0],
        )
    return rows


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return number if math.isfinite(number) else None


def metric_summary(
    rows: Sequence[Mapping[str, Any]], key: str, mode: str
) -> tuple[float | None, float | None, int | None]:
    """(final, best, step of best) of ``key``: the last value logged and the min/max."""
    final = best = None
    best_step = None
    for row in rows:
        value = _number(row.get(key))
        if value is None:
            continue
        final = value
        if best is None or (value < best if mode == "min" else value > best):
            best, best_step = value, row.get("step")
    return final, best, best_step if isinstance(best_step, int) else None


def loss_curve(rows: Sequence[Mapping[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    """(step, value) of ``key`` by step; a step logged again after a resume keeps its last value."""
    by_step: dict[int, float] = {}
    for row in rows:
        step, value = row.get("step"), _number(row.get(key))
        if isinstance(step, int) and value is not None:
            by_step[step] = value
    return sorted(by_step.items())


# --- rows ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResultRow:
    """One task of a sweep in the results table."""

    index: int
    name: str
    values: dict[str, Any]
    """The swept values of this point (dotted key -> value)."""
    state: TaskState
    final: float | None
    best: float | None
    best_step: int | None
    loss: float | None
    steps: int | None
    attempts: int
    last_cause: str | None
    job: str | None
    run_dir: Path


def gather_results(
    sweep_dir: Path, live: Mapping[str, JobInfo] | None = None, metric: str | None = None
) -> list[ResultRow]:
    """One row per point of the sweep, in index order; none is ever left out.

    ``live`` is squeue's view (``SlurmClient.job_states`` of the sweep's array jobs); ``None``
    when Slurm could not be asked, and states then come from the ledgers alone. ``metric``
    defaults to the sweep's. Works while the sweep runs: partial files are read as they are.
    """
    record = read_sweep_record(sweep_dir)
    key = metric or record.metric
    mode = record.mode if key == record.metric else "min"
    refs = current_refs(read_arrays(sweep_dir))
    paths = RunPaths(sweep_dir)
    out = []
    for point in record.points:
        task = paths.task(point.index)
        attempts = read_ledger(task.ledger)
        ref = refs.get(point.index)
        info = None if live is None or ref is None else live_task(live, *ref)
        rows = read_metrics(task.metrics)
        final, best, best_step = metric_summary(rows, key, mode)
        steps = [s for r in rows if isinstance(s := r.get("step"), int)]
        steps += [a.steps_done for a in attempts if a.steps_done is not None]
        last = attempts[-1] if attempts else None
        out.append(
            ResultRow(
                index=point.index,
                name=point.name,
                values=point.overrides,
                state=task_state(attempts, info, live is not None),
                final=final,
                best=best,
                best_step=best_step,
                loss=metric_summary(rows, "loss", "min")[0],
                steps=max(steps) if steps else None,
                attempts=len(attempts),
                last_cause=None if last is None or last.cause is None else last.cause.value,
                job=None if ref is None else f"{ref[0]}_{ref[1]}",
                run_dir=task.root,
            )
        )
    return out


def sort_rows(rows: Sequence[ResultRow], key: str, mode: str) -> list[ResultRow]:
    """Rows best first by ``key`` (``best``, ``final``, ``loss``, ``steps``, ``attempts``,
    ``index`` or a swept key), ``mode`` ``min`` or ``max``; ties keep index order and rows
    without a value come last."""

    def value(row: ResultRow) -> Any:
        if key in _ROW_KEYS:
            return getattr(row, key)
        return row.values.get(key)

    ordered = sorted(rows, key=lambda r: r.index)
    present = [r for r in ordered if value(r) is not None]
    missing = [r for r in ordered if value(r) is None]
    try:
        present.sort(key=value, reverse=mode == "max")  # stable, also when reversed
    except TypeError:  # a swept key with values of mixed types: compare them as text
        present.sort(key=lambda r: str(value(r)), reverse=mode == "max")
    return present + missing


_ROW_KEYS = ("best", "final", "loss", "steps", "attempts", "index")


def sweep_summary(rows: Iterable[ResultRow]) -> dict[str, int]:
    """How many tasks are in each state (every state listed, zeros included)."""
    counts = {state.value: 0 for state in TaskState}
    for row in rows:
        counts[row.state.value] += 1
    return counts


def sweep_status(
    sweep_dir: Path, live_states: Mapping[str, JobInfo]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """For ``hpc-ddp status SWEEP_DIR``: the count per state and one plain dict per task.

    ``live_states`` is what ``SlurmClient.job_states(manifest.array_jobs)`` returned. When
    Slurm could not be asked, call :func:`gather_results` with ``live=None`` instead, so that
    the states come from the ledgers alone rather than from an empty queue.
    """
    rows = gather_results(sweep_dir, live_states)
    return sweep_summary(rows), [row_dict(r) for r in rows]


def row_dict(row: ResultRow) -> dict[str, Any]:
    """A row as plain JSON-able data."""
    return {
        "index": row.index,
        "name": row.name,
        "state": row.state.value,
        **row.values,
        "best": row.best,
        "best_step": row.best_step,
        "final": row.final,
        "loss": row.loss,
        "steps": row.steps,
        "attempts": row.attempts,
        "last_cause": row.last_cause,
        "job": row.job,
        "run_dir": str(row.run_dir),
    }
