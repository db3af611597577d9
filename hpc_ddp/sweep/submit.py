"""Submitting a sweep: one sweep directory, one job array (or as few as Slurm allows).

Like :mod:`hpc_ddp.submission.submit`: planning and rendering the arrays are pure
(:mod:`hpc_ddp.backends.slurm.array_sweep`: the dry run shows them),
:mod:`hpc_ddp.sweep.sweepdir` writes the sweep directory, and :func:`schedule_arrays` is the
one place that calls ``sbatch``.

Speed matters here (a 1,000-point sweep should submit as fast as submitit's ``map_array``), so
the configs are dumped through :mod:`hpc_ddp.sweep.configtext` and written into one file, each
task writing its own ``config.yaml`` from it when it starts (:mod:`hpc_ddp.rundir.taskconfig`).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from hpc_ddp.backends.arrays import (
    ArrayRecord,
    PreparedArray,
    current_refs,
    format_index_ranges,
    live_task,
    read_arrays,
    write_arrays,
)
from hpc_ddp.backends.jobs import JobInfo
from hpc_ddp.backends.slurm.array_sweep import prepare_arrays
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import SlurmError, SubmissionError
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.rundir.manifest import Manifest, read_manifest, record_lock, write_manifest
from hpc_ddp.rundir.taskconfig import load_task_config
from hpc_ddp.state.task import RESUBMITTABLE, TaskState
from hpc_ddp.submission.submit import create_run_dir, stamp_of
from hpc_ddp.sweep.records import read_sweep_record
from hpc_ddp.sweep.results import failed_points
from hpc_ddp.sweep.runner import runner_for
from hpc_ddp.sweep.spec import SweepSpec
from hpc_ddp.sweep.sweepdir import link_offset_tasks, sweep_record_text, write_sweep_dir


def schedule_arrays(
    sweep_dir: Path,
    arrays: Sequence[PreparedArray],
    client: SlurmClient,
    *,
    manifest: Manifest,
    previous: Sequence[ArrayRecord] = (),
    reason: str = "sweep",
) -> list[ArrayRecord]:
    """Write the scripts, ``sbatch`` each array, and record them (also when one is refused).

    ``manifest`` is the sweep's manifest so far (``job_id`` None for a new sweep: the first
    array's then fills it); the new array job ids are appended to its ``array_jobs``.
    """
    for prepared in arrays:
        write_text_atomic(sweep_dir / prepared.script_name, prepared.script)
        link_offset_tasks(sweep_dir, prepared.plan)
    submitted: list[ArrayRecord] = []
    try:
        for prepared in arrays:
            result = client.submit(sweep_dir / prepared.script_name)
            submitted.append(
                ArrayRecord(
                    job_id=result.job_id or "",
                    points=format_index_ranges(prepared.plan.points),
                    offset=prepared.plan.offset,
                    array=prepared.array,
                    script=prepared.script_name,
                    submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    reason=reason,
                    command=list(prepared.argv),
                )
            )
    except SlurmError as exc:
        if not submitted:
            raise
        ids = ", ".join(r.job_id for r in submitted)
        raise SubmissionError(
            f"{exc}\nArray job(s) {ids} of this sweep were submitted before that and are "
            f"recorded in {sweep_dir}. HINT: once the cause is fixed, `hpc-ddp sweep "
            f"--resubmit-failed {sweep_dir}` submits the points that were left out"
        ) from None
    finally:
        if submitted:
            write_arrays(sweep_dir, [*previous, *submitted])
            if manifest.job_id is None:
                first = submitted[0]
                manifest = dataclasses.replace(
                    manifest,
                    job_id=first.job_id,
                    submitted_at=first.submitted_at,
                    command=first.command,
                    array=first.array,
                )
            jobs = [*manifest.array_jobs, *(r.job_id for r in submitted)]
            write_manifest(RunPaths(sweep_dir), dataclasses.replace(manifest, array_jobs=jobs))
    return submitted


@dataclass(frozen=True)
class SweepSubmission:
    """A submitted sweep."""

    sweep_dir: Path
    arrays: list[ArrayRecord]


def submit_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    runs_dir: Path,
    python: str,
    invocation: Sequence[str],
    client: SlurmClient,
    now: datetime | None = None,
) -> SweepSubmission:
    """Write a new sweep directory for ``spec`` and submit its array(s)."""
    now = now or datetime.now(timezone.utc)
    name = spec.name
    # Claimed by mkdir: a sweep submitted in the same second gets the next suffix, never this
    # directory (whose clean-up below would otherwise delete the other sweep's files).
    sweep_dir = create_run_dir(runs_dir.resolve(), name, stamp_of(now))
    record = sweep_record_text(spec, name, sweep_file.resolve())
    try:
        # Ask slurmctld for MaxArraySize while the configs are written: only the scripts need
        # it, and the round trip costs as much as writing hundreds of configs.
        with ThreadPoolExecutor(max_workers=1) as pool:
            limit = pool.submit(client.max_array_size)
            write_sweep_dir(sweep_dir, spec, record)
            max_array_size = limit.result()
        arrays = prepare_sweep(
            spec,
            sweep_file=sweep_file,
            sweep_dir=sweep_dir,
            max_array_size=max_array_size,
            python=python,
            invocation=invocation,
            client=client,
            now=now,
        )
        manifest = Manifest(
            name=name,
            backend="slurm",
            job_id=None,
            submitted_at="",
            command=[],
            config_source=str(sweep_file),
            run_dir=str(sweep_dir),
        )
        # Held until arrays.json names the arrays: a task that starts at once waits for it.
        with record_lock(sweep_dir):
            records = schedule_arrays(sweep_dir, arrays, client, manifest=manifest)
    except BaseException:
        if not (sweep_dir / MANIFEST_FILE).exists():
            shutil.rmtree(sweep_dir, ignore_errors=True)  # nothing submitted: leave no trace
        raise
    return SweepSubmission(sweep_dir, records)


def submit_local_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    runs_dir: Path,
    invocation: Sequence[str],
    now: datetime | None = None,
) -> Path:
    """Write a new sweep directory for ``spec`` and start its points as local runs, at most
    ``max_parallel`` at once (:mod:`hpc_ddp.sweep.local`); returns the sweep directory."""
    from hpc_ddp.backends.registry import backend_for
    from hpc_ddp.sweep.local import local_parallel, start_controller

    backend = backend_for("local")
    for point in spec.points:  # every point must fit this machine before anything is written
        backend.check(point.config)
    now = now or datetime.now(timezone.utc)
    name = spec.name
    sweep_dir = create_run_dir(runs_dir.resolve(), name, stamp_of(now))
    record = sweep_record_text(spec, name, sweep_file.resolve())
    try:
        write_sweep_dir(sweep_dir, spec, record)
        with record_lock(sweep_dir):
            points = [p.index for p in spec.points]
            job_id = start_controller(sweep_dir, points, local_parallel(spec.max_parallel))
            manifest = Manifest(
                name=name,
                backend="local",
                job_id=job_id,
                submitted_at=now.isoformat(timespec="seconds"),
                command=list(invocation),
                config_source=str(sweep_file),
                run_dir=str(sweep_dir),
            )
            write_manifest(RunPaths(sweep_dir), manifest)
    except BaseException:
        if not (sweep_dir / MANIFEST_FILE).exists():
            shutil.rmtree(sweep_dir, ignore_errors=True)  # nothing started: leave no trace
        raise
    return sweep_dir


def prepare_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    sweep_dir: Path,
    max_array_size: int,
    python: str,
    invocation: Sequence[str],
    client: SlurmClient,
    now: datetime | None = None,
) -> list[PreparedArray]:
    """:func:`prepare_arrays` for every point of ``spec`` (what a dry run shows)."""
    base = Path(spec.base_source)
    return prepare_arrays(
        {p.index: p.config for p in spec.points},
        name=spec.name,
        sweep_dir=sweep_dir,
        max_parallel=spec.max_parallel,
        max_array_size=max_array_size,
        # A relative slurm.template is taken from the base job file's directory.
        template_dir=base.parent if base.is_file() else sweep_file.parent,
        python=python,
        config_source=str(sweep_file),
        invocation=invocation,
        client=client,
        now=now,
    )


@dataclass(frozen=True)
class Resubmission:
    """What ``--resubmit-failed`` found and did (``records`` empty for a dry run)."""

    points: list[int]
    arrays: list[PreparedArray]
    records: list[ArrayRecord]
    live: dict[int, str] = field(default_factory=dict)
    """Points whose array task is queued or running now, and that task (``ARRAYJOB_TASK``, or
    the pending range holding it): never submitted again while it is."""


def resubmit_failed(
    sweep_dir: Path,
    *,
    client: SlurmClient,
    python: str,
    invocation: Sequence[str],
    dry_run: bool = False,
    now: datetime | None = None,
) -> Resubmission:
    """Submit the failed and cancelled tasks of a sweep again, as one new array (or as few as
    ``MaxArraySize`` allows) over exactly those points.

    Their directories are reused as they are: the runtime resumes each from its last
    checkpoint and appends to its ledger, metrics and logs. The sweep directory's record lock
    is held from the choice of the points to the record of the new array: a second
    ``--resubmit-failed`` waits, then finds those tasks live and submits nothing.
    """
    runner = runner_for(sweep_dir)  # job arrays, or a local sweep's controller
    return runner.resubmit(
        sweep_dir, client=client, python=python, invocation=invocation, dry_run=dry_run, now=now
    )


def resubmit_arrays(
    sweep_dir: Path,
    client: SlurmClient,
    python: str,
    invocation: Sequence[str],
    dry_run: bool,
    now: datetime | None,
) -> Resubmission:
    """:func:`resubmit_failed` for a Slurm sweep: one new array over exactly those points."""
    if dry_run:
        return _resubmit_locked(sweep_dir, client, python, invocation, dry_run, now)
    with record_lock(sweep_dir):
        return _resubmit_locked(sweep_dir, client, python, invocation, dry_run, now)


def resubmit_local(sweep_dir: Path, dry_run: bool) -> Resubmission:
    """:func:`resubmit_failed` for a local sweep: a new sweep controller over those points."""
    if dry_run:
        return _resubmit_local(sweep_dir, dry_run)
    with record_lock(sweep_dir):
        return _resubmit_local(sweep_dir, dry_run)


def _resubmit_local(sweep_dir: Path, dry_run: bool) -> Resubmission:
    """A local sweep's failed and cancelled points, started again by a new sweep controller,
    each going on from its checkpoint in its own directory. Refused (nothing started) while
    the sweep's controller still runs: it may yet start them, and two processes must never
    start one point."""
    from hpc_ddp.sweep.local import controller_alive, local_parallel, start_controller
    from hpc_ddp.sweep.results import gather_results

    record = read_sweep_record(sweep_dir)
    rows = gather_results(sweep_dir)
    points = [r.index for r in rows if r.state in RESUBMITTABLE]
    running = {r.index: r.job or "" for r in rows if r.state in _LIVE}
    if not running:  # a controller with nothing left to run is on its way out: let it go
        _wait_for_exit(sweep_dir)
    if controller_alive(sweep_dir):
        # Not one point is started beside a live controller: it may still start them itself.
        queued = {r.index: "pending" for r in rows if r.state is TaskState.PENDING}
        return Resubmission([], [], [], {**running, **queued})
    if not points or dry_run:
        return Resubmission(points, [], [], running)
    from hpc_ddp.backends.local.process import unmark_cancelled

    manifest = read_manifest(sweep_dir)
    unmark_cancelled(sweep_dir)  # the earlier cancel is not this controller's
    job_id = start_controller(sweep_dir, points, local_parallel(record.max_parallel))
    previous = [*manifest.previous_jobs, *([manifest.job_id] if manifest.job_id else [])]
    write_manifest(
        RunPaths(sweep_dir),
        dataclasses.replace(
            manifest,
            job_id=job_id,
            previous_jobs=previous,
            submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ),
    )
    return Resubmission(points, [], [], running)


def _resubmit_locked(
    sweep_dir: Path,
    client: SlurmClient,
    python: str,
    invocation: Sequence[str],
    dry_run: bool,
    now: datetime | None,
) -> Resubmission:
    record = read_sweep_record(sweep_dir)
    manifest = read_manifest(sweep_dir)
    previous = read_arrays(sweep_dir)
    job_ids = list(dict.fromkeys(a.job_id for a in previous))
    live = client.job_states(job_ids) if job_ids else {}
    points = failed_points(sweep_dir, live, record)
    running = live_points(previous, live)
    if not points:
        return Resubmission([], [], [], running)
    # A point whose task never started (cancelled while pending) has only its packed config.
    configs = {i: load_task_config(sweep_dir, i) for i in points}
    base = Path(record.base)
    arrays = prepare_arrays(
        configs,
        name=record.name,
        sweep_dir=sweep_dir,
        max_parallel=record.max_parallel,
        max_array_size=client.max_array_size(),
        template_dir=base.parent if base.is_file() else Path(record.sweep_file).parent,
        python=python,
        config_source=record.sweep_file,
        invocation=invocation,
        client=client,
        first_number=len(previous),
        now=now,
    )
    if dry_run:
        return Resubmission(points, arrays, [], running)
    records = schedule_arrays(
        sweep_dir, arrays, client, manifest=manifest, previous=previous, reason="resubmit-failed"
    )
    return Resubmission(points, arrays, records, running)


_LIVE = frozenset({TaskState.RUNNING, TaskState.PENDING, TaskState.REQUEUED})
CONTROLLER_EXIT_S = 15.0
"""How long ``--resubmit-failed`` waits for a local sweep controller whose points have all
ended to exit (it notices within a poll, then reaps its last point's processes)."""


def _wait_for_exit(sweep_dir: Path) -> None:
    import time

    from hpc_ddp.sweep.local import controller_alive

    deadline = time.monotonic() + CONTROLLER_EXIT_S
    while controller_alive(sweep_dir) and time.monotonic() < deadline:
        time.sleep(0.2)


def live_points(arrays: Sequence[ArrayRecord], live: Mapping[str, JobInfo]) -> dict[int, str]:
    """Point -> its array task's ref, for every point whose current task squeue shows queued or
    running (``live``: squeue's rows of the sweep's arrays)."""
    out: dict[int, str] = {}
    for point, (job_id, task_id) in current_refs(arrays).items():
        info = live_task(live, job_id, task_id)
        if info is not None and not info.state.finished:
            out[point] = info.ref
    return out
