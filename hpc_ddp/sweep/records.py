"""A sweep directory's records: its points (``sweep.yaml``), its job arrays (``arrays.json``),
and which array task runs each point now.

A sweep directory (written by :mod:`hpc_ddp.sweep.submit`)::

    SWEEP_DIR/
      sweep.yaml       the expanded points and what they set (one JSON-valued line per point)
      arrays.json      every job array submitted for it: job id, the points it runs, offset
      manifest.json    the sweep's manifest (``array_jobs``: every array job id, in order)
      job.sbatch       the array's script (``job-<n>.sbatch`` for later arrays)
      tasks/<i>/       point i's run directory (config.yaml, ledger.jsonl, metrics.jsonl, ...)

Everything here reads files only; squeue's rows are passed in. Login-node side: standard
library, PyYAML and the pure core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_ddp.config.yaml_dialect import parse_yaml
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.slurm.jobstate import JobInfo

SWEEP_RECORD = "sweep.yaml"
ARRAYS_RECORD = "arrays.json"


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
