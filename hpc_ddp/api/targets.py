"""Which runs a target means: every run under ``--runs-dir``, or the run dirs and job ids given.

Shared by the Python API (:mod:`hpc_ddp.api`) and, through it, by the ``status``, ``cancel``,
``logs``, ``results`` and ``checkpoints`` verbs; finding runs reads manifests and sweep records
and nothing else. A target that names nothing (no such path, no
run with that job id) is a :class:`TargetError` (exit 2) with a hint, for every verb alike.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.backends.arrays import (
    ARRAYS_RECORD,
    current_refs,
    format_index_ranges,
    parse_index_ranges,
    read_arrays,
)
from hpc_ddp.backends.jobs import is_job_ref
from hpc_ddp.errors import RunDirError, RunsDirError, TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.submission.submit import check_runs_dir, runs_dir_from
from hpc_ddp.sweep.records import SWEEP_RECORD, read_sweep_record

LIST_HINT = "`hpc-ddp status` lists the runs under --runs-dir (default $HPC_DDP_RUNS_DIR or ./runs)"


def runs_dir_of(arg: str | None) -> Path:
    """Where the runs are: ``--runs-dir`` (``arg``), else ``$HPC_DDP_RUNS_DIR``, else
    ``./runs``."""
    return runs_dir_from(arg, os.environ)


def require_dir(target: str, what: str = "run directory") -> Path:
    """``target`` as a directory; a missing path or a file is a :class:`TargetError`."""
    path = Path(target)
    if not path.is_dir():
        problem = f"is a file, not a {what}" if path.exists() else f"no such {what}"
        raise TargetError(f"{target}: {problem}. HINT: {LIST_HINT}.")
    return path


def list_runs(runs_dir: Path) -> list[Path]:
    """Every run and sweep directory (one with a ``manifest.json``) under ``runs_dir``."""
    check_runs_dir(runs_dir, write=False)
    if not runs_dir.exists():
        return []
    try:
        entries = sorted(runs_dir.iterdir())
    except OSError as exc:
        raise RunsDirError(
            f"cannot list --runs-dir {str(runs_dir)!r}: {exc.strerror or exc}. HINT: pass a "
            "readable directory with --runs-dir (or $HPC_DDP_RUNS_DIR)."
        ) from None
    found = []
    for p in entries:
        try:
            if (p / MANIFEST_FILE).exists():
                found.append(p)
        except OSError:  # a run directory we may not look into: listed, then shown DAMAGED
            found.append(p)
    return found


def resolve_targets(targets: Sequence[str], runs_dir: Path) -> list[Path]:
    """Run directories for the given run dirs or job ids (all runs when none given).

    A job id is matched against every readable manifest under ``runs_dir``; damaged ones are
    skipped (and named if nothing matched), so one bad run never hides the others.
    """
    if not targets:
        return list_runs(runs_dir)
    found: list[Path] = []
    listing: list[Path] | None = None
    for t in targets:
        path = Path(t)
        if path.is_dir():
            if not (path / MANIFEST_FILE).exists():
                read_manifest(path)  # raises: "no manifest.json" with its hint
            found.append(path)
            continue
        if not is_job_ref(t):
            require_dir(t)  # raises: no such run directory, or a file
        listing = list_runs(runs_dir) if listing is None else listing
        match, damaged = [], []
        for p in listing:
            try:
                if read_manifest(p).job_id == t:
                    match.append(p)
            except RunDirError:
                damaged.append(p.name)
        if not match:
            raise TargetError(
                f"{t!r} is neither a run directory nor a job id found under {runs_dir}"
                f"{_skipped(damaged)}. HINT: pass the run directory printed by `hpc-ddp "
                f"submit`, or its job id; {LIST_HINT}."
            )
        found.extend(match)
    return found


def _skipped(damaged: list[str]) -> str:
    if not damaged:
        return ""
    more = " ..." if len(damaged) > 5 else ""
    return (
        f" ({len(damaged)} run(s) with a damaged manifest were skipped: "
        f"{', '.join(damaged[:5])}{more})"
    )


# --- sweep tasks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayTask:
    """One point of a sweep and the array task that runs it (``scancel ARRAYJOB_TASK``)."""

    sweep_dir: Path
    point: int
    ref: str
    """``ARRAYJOB_TASK``, e.g. ``1001_3`` (the task id is the point minus the array's offset)."""

    @property
    def source(self) -> Path:
        """The record the ref was read from."""
        return self.sweep_dir / ARRAYS_RECORD


def sweep_task_of(path: Path) -> tuple[Path, int] | None:
    """(sweep dir, point) when ``path`` is ``SWEEP_DIR/tasks/<N>`` of a sweep directory.

    A point whose task has not started has no directory yet: its path names it all the same
    when the sweep's record has that point.
    """
    if path.exists() and not path.is_dir():
        return None
    resolved = path.resolve()
    sweep_dir = resolved.parent.parent
    if resolved.parent.name != "tasks" or not resolved.name.isdigit():
        return None
    if not (sweep_dir / SWEEP_RECORD).is_file():
        return None
    point = int(resolved.name)
    if path.is_dir():
        return sweep_dir, point
    points = {p.index for p in read_sweep_record(sweep_dir).points}
    return (sweep_dir, point) if point in points else None


def point_task(sweep_dir: Path, point: int) -> ArrayTask:
    """The array task that runs ``point`` now (the latest array submitted for it)."""
    ref = current_refs(read_arrays(sweep_dir)).get(point)
    if ref is None:
        raise RunDirError(
            f"{sweep_dir}: point {point} is in no job array of {ARRAYS_RECORD}; nothing to "
            f"cancel. HINT: it was never submitted; `hpc-ddp status {sweep_dir}` shows the sweep."
        )
    return ArrayTask(sweep_dir, point, f"{ref[0]}_{ref[1]}")


def find_array_task(ref: str, runs_dir: Path) -> ArrayTask:
    """The sweep task that ``ARRAYJOB_TASK`` names, among the sweeps under ``runs_dir``."""
    job, _, task = ref.partition("_")
    damaged = []
    for sweep_dir in list_runs(runs_dir):
        try:
            arrays = read_arrays(sweep_dir)
        except RunDirError:
            damaged.append(sweep_dir.name)
            continue
        for array in arrays:
            if array.job_id != job:
                continue
            points = parse_index_ranges(array.points)
            if int(task) + array.offset not in points:
                tasks = format_index_ranges(p - array.offset for p in points)
                raise TargetError(
                    f"{ref}: array job {job} of sweep {sweep_dir} has no task {task} (its "
                    f"tasks: {tasks}). HINT: pass one of its tasks, or the task's directory "
                    "SWEEP_DIR/tasks/N."
                )
            return ArrayTask(sweep_dir, int(task) + array.offset, ref)
    raise TargetError(
        f"{ref}: no sweep under {runs_dir} has an array job {job}{_skipped(damaged)}. HINT: pass "
        f"the task's directory (SWEEP_DIR/tasks/N), or --runs-dir where the sweep is; {LIST_HINT}."
    )
