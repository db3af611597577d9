"""A run's files as ``status`` judges them without torch: checkpoint files, the last metric.

A checkpoint's first bytes and its zip directory (a few kilobytes) tell a torn, empty or
overwritten file from a whole one, and its pickle, read without running anything
(:mod:`hpc_ddp.rundir.checkpoint_label`), the step and run it holds: a file named for another
step or written by another run is never the newest checkpoint. Its content (every part has a
digest: weights, optimizer, RNG states, progress, ...) needs torch to check (``hpc-ddp
checkpoints --verify``, and the runtime on every resume).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.checkpoint_label import label_problem, not_regular
from hpc_ddp.rundir.layout import (
    SHARDED_RECORD,
    RunPaths,
    parse_checkpoint_name,
    parse_sharded_checkpoint_name,
)
from hpc_ddp.rundir.metrics import drop_replayed

__all__ = [
    "checkpoint_steps",
    "damaged_checkpoint",
    "last_metric",
    "recorded_run_id",
    "shard_set_steps",
]

_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE = "/data.pkl"
"""The record every ``torch.save`` archive holds: the pickle (``<archive>/data.pkl``)."""


def checkpoint_steps(paths: RunPaths) -> list[int]:
    """Steps of the checkpoints in a run, ascending, by file name alone (no torch import)."""
    if not paths.checkpoints.is_dir():
        return []
    names = (parse_checkpoint_name(p.name) for p in paths.checkpoints.iterdir())
    return sorted(step for step in names if step is not None)


def shard_set_steps(paths: RunPaths) -> list[int]:
    """Steps of a run's committed sharded (FSDP) checkpoints, ascending: ``step-N/``
    directories holding their digest record (renamed in whole, the record written last)."""
    if not paths.checkpoints.is_dir():
        return []
    steps = (
        s
        for p in paths.checkpoints.iterdir()
        if (s := parse_sharded_checkpoint_name(p.name)) is not None
        and (p / SHARDED_RECORD).is_file()
    )
    return sorted(steps)


def recorded_run_id(paths: RunPaths) -> str | None:
    """The run's id as ``RUN_DIR/run_id`` holds it (None: no such file, or not readable);
    never creates one, unlike :func:`hpc_ddp.rundir.run_id.read_run_id` (status writes nothing)."""
    try:
        text = paths.run_id_file.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


def damaged_checkpoint(path: Path, run_id: str | None = None) -> str | None:
    """Why ``path`` cannot be a whole checkpoint of run ``run_id`` (None: of any run), judged
    without torch; None if it looks whole.

    ``torch.save`` writes a zip archive: it starts with ``PK\\x03\\x04`` and ends with the
    archive's central directory, which lists the pickle (``data.pkl``) and one record per
    tensor. So an empty, torn (cut short), overwritten or spliced file shows here at the cost of
    reading the first bytes and the directory; the pickle says the step it holds (which its
    name must say) and the run that wrote it. A file that passes may still fail to load, or
    hold content that changed on disk (``hpc-ddp checkpoints --verify`` loads each one and
    checks every digest). Never opens what is not a regular file (a FIFO would block), and
    never raises for a damaged file: whatever reading it raises is the reason.
    """
    kind = not_regular(path)
    if kind is not None:
        return kind
    try:
        with path.open("rb") as f:
            head = f.read(4)
        if not head:
            return "empty file"
        if head != _ZIP_MAGIC:
            return "not a torch zip archive"
        if not zipfile.is_zipfile(path):
            return "truncated: the zip archive has no end"
        return _damaged_directory(path) or label_problem(path, run_id)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    except Exception as exc:  # is_zipfile lets BadZipFile out of a damaged zip64 locator
        return f"damaged zip archive ({type(exc).__name__}: {exc})"


def _damaged_directory(path: Path) -> str | None:
    """What is wrong with the archive's directory: unreadable, no pickle, or records that are
    not where it says (bytes cut out of the file or added to it before the directory)."""
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except OSError:
        raise  # the caller says unreadable
    except Exception as exc:  # BadZipFile, ValueError, EOFError, struct.error, ...
        return f"damaged zip directory ({exc})"
    if not any(r.filename.endswith(_PICKLE) for r in records):
        return "not a torch archive: no data.pkl record"
    # zipfile shifts every offset by the difference between where the directory is and where
    # it says it is (to read self-extracting archives), so bytes cut out before the directory
    # move the records' offsets: the first and the last record's header no longer start there.
    with path.open("rb") as f:
        for record in {id(r): r for r in (records[0], records[-1])}.values():
            f.seek(max(record.header_offset, 0))
            if record.header_offset < 0 or f.read(4) != _ZIP_MAGIC:
                return f"spliced or torn: record {record.filename} is not where the directory says"
    return None


def _metric_rows(paths: RunPaths) -> list[dict[str, Any]]:
    """Every JSON object row of ``metrics.jsonl`` ([] without one)."""
    rows = []
    try:
        with paths.metrics.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunDirError(
            f"{paths.metrics}: unreadable metrics ({exc.strerror or exc}). HINT: check the "
            "file's permissions, or move it aside (training appends a new one)."
        ) from None
    return rows


def step_times(paths: RunPaths) -> list[tuple[float, int]]:
    """(time, step) of every row that logged a step, rows a later attempt replayed included:
    when each step was reached, for the goodput account."""
    out = []
    for row in _metric_rows(paths):
        when, step = row.get("time"), row.get("step")
        if isinstance(when, (int, float)) and isinstance(step, int) and "event" not in row:
            out.append((float(when), step))
    return out


def last_metric(paths: RunPaths, key: str) -> Any:
    """The last value logged for ``key`` in ``metrics.jsonl`` (None if never logged), among
    the rows that count: a row a later attempt logged again is not the last word
    (:func:`~hpc_ddp.rundir.metrics.drop_replayed`, as ``results`` reads them).

    Lines that are not JSON objects (a torn last line from a killed writer, binary garbage, a
    bare number or list) are skipped. A metrics file that cannot be read at all is a
    :class:`RunDirError`.
    """
    rows = _metric_rows(paths)
    values = [row[key] for row in drop_replayed(rows) if key in row]
    return values[-1] if values else None
