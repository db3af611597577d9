"""Reading a sweep's results: how each task stands, its metrics, one row per point.

A task's state comes from two witnesses: Slurm (squeue keeps a task for ``MinJobAge`` after it
ends) and the task's ledger, whose last attempt's cause says whether it finished. Neither alone
is enough: a task killed without a word leaves an open ledger entry, and a finished task
disappears from squeue. :mod:`hpc_ddp.state.task` weighs them with the same verdict ``status``
gives a run. The records (``sweep.yaml``, ``arrays.json``) are read by
:mod:`hpc_ddp.sweep.records`. Everything here reads files only; the Slurm view is passed in.
Login-node side: standard library, PyYAML and the pure core.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.arrays import current_refs, live_task, read_arrays
from hpc_ddp.backends.jobs import AccountingRecord, JobInfo, JobState
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.metrics import NOT_METRICS, drop_replayed
from hpc_ddp.state.task import RESUBMITTABLE, TaskState, task_state
from hpc_ddp.state.verdict import current_attempts
from hpc_ddp.sweep.records import SweepPointRecord, SweepRecord, read_sweep_record

if TYPE_CHECKING:
    from hpc_ddp.sweep.runner import SweepRunner

log = logging.getLogger(__name__)


# --- state --------------------------------------------------------------------------------------


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
        attempts = current_task_attempts(read_ledger(paths.task(point.index).ledger), ref)
        if task_state(attempts, info, True) in RESUBMITTABLE:
            out.append(point.index)
    return out


def current_task_attempts(
    attempts: Sequence[Attempt], ref: tuple[str, int] | None
) -> list[Attempt]:
    """A task's attempts in the array task that runs it now (``ref``: array job, task id), the
    only ones its state may rest on: an earlier array's crash says nothing about the task a
    ``--resubmit-failed`` array runs now."""
    if ref is None:
        return list(attempts)
    return current_attempts(attempts, job_ref=f"{ref[0]}_{ref[1]}")


# --- metrics ------------------------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every whole row of a ``metrics.jsonl`` that counts (rows a later attempt logged again
    are left out, and the resume markers: :func:`~hpc_ddp.rundir.metrics.drop_replayed`);
    never fails.

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
    return drop_replayed(rows)


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


def logged_metrics(rows: Sequence[ResultRow]) -> list[str]:
    """Every name that some task logged a number for in its ``metrics.jsonl``, sorted."""
    names: set[str] = set()
    for row in rows:
        for line in read_metrics(row.run_dir / "metrics.jsonl"):
            names.update(
                k for k, v in line.items() if k not in NOT_METRICS and _number(v) is not None
            )
    return sorted(names)


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


def unheld_arrays(sweep_dir: Path, live: Mapping[str, JobInfo]) -> list[str]:
    """The sweep's array job ids with a current task that squeue (``live``) no longer holds:
    only sacct can say how those tasks ended. None for a sweep whose records are damaged
    (its status says so)."""
    try:
        refs = current_refs(read_arrays(sweep_dir))
    except RunDirError:
        return []
    gone = (job for job, task in refs.values() if live_task(live, job, task) is None)
    return list(dict.fromkeys(gone))


def gather_results(
    sweep_dir: Path,
    runner: SweepRunner,
    live: Mapping[str, JobInfo] | None = None,
    metric: str | None = None,
    accounting: Mapping[str, AccountingRecord] | None = None,
) -> list[ResultRow]:
    """One row per point of the sweep, in index order; none is ever left out.

    ``live`` is squeue's view (the Slurm backend's ``states`` of the sweep's array jobs); ``None``
    when Slurm could not be asked, and states then come from the ledgers alone. ``runner``: the
    sweep's backend's (its manifest names it). ``accounting``
    is sacct's records of the tasks squeue no longer holds (of :func:`unheld_arrays`), where
    there is accounting. ``metric`` defaults to the sweep's. Works while the sweep runs:
    partial files are read as they are.
    """
    record = read_sweep_record(sweep_dir)
    key = metric or record.metric
    mode = record.mode if key == record.metric else "min"
    points = [p.index for p in record.points]
    words = runner.task_words(sweep_dir, points, live, accounting)
    made = task_dirs(sweep_dir)
    return [
        _row(sweep_dir, point, key, mode, state, job, attempts, made=str(point.index) in made)
        for point, (state, job, attempts) in zip(record.points, words, strict=True)
    ]


def task_dirs(sweep_dir: Path) -> frozenset[str]:
    """The names in ``SWEEP_DIR/tasks/`` (a point's directory is made when it first starts),
    listed once: most points of a large sweep that has just started have none, and looking
    for each one's files by name costs more than the listing."""
    try:
        return frozenset(os.listdir(RunPaths(sweep_dir).tasks))
    except OSError:
        return frozenset()


def array_task_words(
    sweep_dir: Path,
    points: Sequence[int],
    live: Mapping[str, JobInfo] | None,
    accounting: Mapping[str, AccountingRecord] | None,
) -> list[tuple[TaskState, str | None, list[Attempt] | None]]:
    """(state, array task, ledger) of each point of a Slurm sweep: its task's ledger weighed
    against squeue's row of the array task that runs it now, else sacct's record."""
    arrays = read_arrays(sweep_dir)
    refs = current_refs(arrays)
    scripts = {a.job_id: str((sweep_dir / a.script).resolve()) for a in arrays}
    paths = RunPaths(sweep_dir)
    out: list[tuple[TaskState, str | None, list[Attempt] | None]] = []
    for index in points:
        task = paths.task(index)
        attempts = read_ledger(task.ledger)
        ref = refs.get(index)
        info = None if live is None or ref is None else live_task(live, *ref)
        accounted = None
        if info is None and ref is not None and accounting:
            accounted = _accounted(accounting.get(f"{ref[0]}_{ref[1]}"), scripts[ref[0]])
        state = task_state(current_task_attempts(attempts, ref), info, live is not None, accounted)
        job = None if ref is None else f"{ref[0]}_{ref[1]}"
        out.append((state, job, attempts))
    return out


def _row(
    sweep_dir: Path,
    point: SweepPointRecord,
    key: str,
    mode: str,
    state: TaskState,
    job: str | None,
    attempts: Sequence[Attempt] | None = None,
    *,
    made: bool = True,
) -> ResultRow:
    """One point's row: its state and job as given, its metrics and attempts from its files
    (none, without reading, when its directory was not ``made``: it never started)."""
    task = RunPaths(sweep_dir).task(point.index)
    if attempts is None:
        attempts = read_ledger(task.ledger) if made else []
    rows = read_metrics(task.metrics) if made else []
    final, best, best_step = metric_summary(rows, key, mode)
    steps = [s for r in rows if isinstance(s := r.get("step"), int)]
    steps += [a.steps_done for a in attempts if a.steps_done is not None]
    last = attempts[-1] if attempts else None
    return ResultRow(
        index=point.index,
        name=point.name,
        values=point.overrides,
        state=state,
        final=final,
        best=best,
        best_step=best_step,
        loss=metric_summary(rows, "loss", "min")[0],
        steps=max(steps) if steps else None,
        attempts=len(attempts),
        last_cause=None if last is None or last.cause is None else last.cause.value,
        job=job,
        run_dir=task.root,
    )


def _accounted(record: AccountingRecord | None, script: str) -> JobState | None:
    """sacct's state of an array task, if the line is this sweep's (a job id the cluster gave
    again names another job) and the task ended."""
    mine = None if record is None else record.submitted_with([script])
    return mine.state if mine is not None and mine.state.finished else None


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
    sweep_dir: Path, runner: SweepRunner, live_states: Mapping[str, JobInfo]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """For ``hpc-ddp status SWEEP_DIR``: the count per state and one plain dict per task.

    ``live_states`` is what the Slurm backend's ``states(manifest.array_jobs)`` returned. When
    Slurm could not be asked, call :func:`gather_results` with ``live=None`` instead, so that
    the states come from the ledgers alone rather than from an empty queue.
    """
    rows = gather_results(sweep_dir, runner, live_states)
    return sweep_summary(rows), [row_dict(r) for r in rows]


def row_dict(row: ResultRow) -> dict[str, Any]:
    """A row as ``results --json`` and ``status --json`` print it (:mod:`hpc_ddp.output`):
    the swept values under ``values`` (dotted key -> value), never mixed with the row's own
    keys; ``job_id`` is the array task (``ARRAYJOB_TASK``) or the local run's job id."""
    return {
        "index": row.index,
        "name": row.name,
        "state": row.state.value,
        "values": {k: list(v) if isinstance(v, tuple) else v for k, v in row.values.items()},
        "best": row.best,
        "best_step": row.best_step,
        "final": row.final,
        "loss": row.loss,
        "steps": row.steps,
        "attempts": row.attempts,
        "last_cause": row.last_cause,
        "job_id": row.job,
        "run_dir": str(row.run_dir),
    }
