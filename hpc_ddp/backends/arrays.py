"""A directory's job arrays: ``arrays.json``, which array task runs each point, the queue's row.

A sweep is submitted as one job array (or as few as ``MaxArraySize`` allows), and
``--resubmit-failed`` adds arrays over the points that failed; ``SWEEP_DIR/arrays.json`` records
each: its job id, the points it runs and the offset from task id to point. The point's current
array task is the one of the latest array that runs it. The login side (``status``, ``cancel``,
``results``, ``--resubmit-failed``) reads the record here, and so does each array task when it
starts (:mod:`hpc_ddp.job.task`): a task that is not its point's current one refuses to run.
Each array task's batch-script log is in the sweep's ``logs/`` under its array job and task id:
:func:`batch_logs` finds a point's.

Index ranges are Slurm's ``--array`` syntax (``0-5,7``). An :class:`ArrayPlan` is one array's
points and offset, a :class:`PreparedArray` one ready to be written and submitted (each backend
renders its own, :mod:`hpc_ddp.backends.slurm.array_sweep`). Any backend whose scheduler runs
job arrays shares this record; queue rows (:class:`~hpc_ddp.backends.jobs.JobInfo`) are
passed in.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.jobs import JobInfo, is_job_ref
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import RunDirError

if TYPE_CHECKING:
    from hpc_ddp.lemons.record import Exclusion

ARRAYS_RECORD = "arrays.json"


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


@dataclass(frozen=True)
class ArrayPlan:
    """One job array: task id ``t`` runs point ``t + offset``; all its points share a script."""

    points: tuple[int, ...]
    offset: int
    group: int
    """Index of the script variant (points whose slurm/env/requeue sections are equal)."""

    def spec(self, max_parallel: int | None) -> str:
        """The ``--array`` value: task ids as ranges, then the ``%N`` throttle."""
        ids = format_index_ranges(p - self.offset for p in self.points)
        return ids if max_parallel is None else f"{ids}%{max_parallel}"


@dataclass(frozen=True)
class PreparedArray:
    """An array ready to be written and submitted."""

    plan: ArrayPlan
    array: str
    script_name: str
    script: str
    argv: tuple[str, ...]
    lemons: Exclusion | None = None
    """What the array does with the lemon record (its script's ``--exclude``, and why), as a
    submit does (:mod:`hpc_ddp.lemons`); None: the record was not asked, or holds nothing."""


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


# --- the record ---------------------------------------------------------------------------------


def read_arrays(sweep_dir: Path) -> list[ArrayRecord]:
    """The arrays submitted for a sweep, in submission order ([] before the first submit).

    Anything but a JSON list of array records with the right value types (a job id in Slurm's
    form, ``points`` as index ranges) is a :class:`RunDirError` with a hint: ``status`` shows
    the sweep DAMAGED, and nothing is sent to Slurm from it.
    """
    path = sweep_dir / ARRAYS_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _damaged_arrays(path, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, list):
        raise _damaged_arrays(path, f"a JSON {type(data).__name__}, not a list of arrays")
    return [_array_record(path, number, item) for number, item in enumerate(data)]


_ARRAY_TYPES: dict[str, type] = {
    "job_id": str, "points": str, "offset": int, "array": str, "script": str,
    "submitted_at": str, "reason": str, "command": list,
}  # fmt: skip
_ARRAY_OPTIONAL = frozenset({"reason", "command"})


def write_arrays(sweep_dir: Path, records: Sequence[ArrayRecord]) -> None:
    """Write ``arrays.json`` atomically."""
    data = [dataclasses.asdict(r) for r in records]
    write_text_atomic(sweep_dir / ARRAYS_RECORD, json.dumps(data, indent=1) + "\n")


def _array_record(path: Path, number: int, item: Any) -> ArrayRecord:
    """Array ``number`` of ``arrays.json``, checked (a :class:`RunDirError` if it is wrong)."""
    if not isinstance(item, dict):
        raise _damaged_arrays(path, f"array {number} is a JSON {type(item).__name__}")
    for key, kind in _ARRAY_TYPES.items():
        if key not in item:
            if key in _ARRAY_OPTIONAL:
                continue
            raise _damaged_arrays(path, f"array {number} has no {key}")
        value = item[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _damaged_arrays(
                path, f"array {number}: {key} is {value!r:.80}, expected {kind.__name__}"
            )
    why = _array_values_wrong(item)
    if why is not None:
        raise _damaged_arrays(path, f"array {number}: {why}")
    known = {f.name for f in fields(ArrayRecord)}  # keys a newer hpc-ddp added are left out
    return ArrayRecord(**{k: v for k, v in item.items() if k in known})


def _array_values_wrong(item: dict[str, Any]) -> str | None:
    """Why a well-typed array record still cannot be right, or None."""
    if not is_job_ref(item["job_id"]):
        return f"job_id {item['job_id']!r:.80} is not a Slurm job id (e.g. 1234)"
    try:
        points = parse_index_ranges(item["points"])
    except ValueError:
        points = []
    if not points:
        return f"points {item['points']!r:.80} are not array indices (e.g. 0-5,7)"
    if item["offset"] < 0 or item["offset"] > points[0]:
        return f"offset {item['offset']} is not between 0 and its first point {points[0]}"
    if not all(isinstance(word, str) for word in item.get("command", [])):
        return f"command {item['command']!r:.80} is not a list of strings"
    return None


def _damaged_arrays(path: Path, why: str) -> RunDirError:
    return RunDirError(
        f"{path}: damaged array record ({why[:300]}). HINT: it is written by `hpc-ddp sweep`; "
        "restore it from a backup or move the sweep aside (its array job ids are also in "
        "manifest.json, array_jobs)."
    )


def current_refs(arrays: Sequence[ArrayRecord]) -> dict[int, tuple[str, int]]:
    """Point index -> (array job id, task id) of the latest array that runs it."""
    refs: dict[int, tuple[str, int]] = {}
    for record in arrays:
        for index in parse_index_ranges(record.points):
            refs[index] = (record.job_id, index - record.offset)
    return refs


def batch_logs(logs_dir: Path, stream: str) -> list[Path]:
    """The batch script's logs (``batch-*.<stream>``, ``stream`` ``out`` or ``err``) of the run
    whose logs directory is ``logs_dir`` (``RUN_DIR/logs``), in submission order as far as it
    is known.

    A run's are in ``logs_dir``. A sweep task's (``SWEEP_DIR/tasks/<i>``) are in the
    sweep's ``logs/``, named by array job and task id, one per array that ran point ``i``
    (``arrays.json``; sweeps written before then kept them in the task's ``logs/``, which
    come first). Only files that exist are listed; a damaged ``arrays.json`` lists none of
    the sweep's.
    """
    own = sorted(logs_dir.glob(f"batch-*.{stream}"))
    task = logs_dir.parent.resolve()  # `.` in a task directory, or an offset array's link
    if task.parent.name != "tasks" or not task.name.isdigit():
        return own
    sweep_dir = task.parent.parent
    point = int(task.name)
    try:
        arrays = read_arrays(sweep_dir)
    except RunDirError:
        return own
    found = []
    for record in arrays:
        if point in parse_index_ranges(record.points):
            path = sweep_dir / "logs" / f"batch-{record.job_id}_{point - record.offset}.{stream}"
            if path.exists() or path.is_symlink():
                found.append(path)
    return [*own, *found]


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
