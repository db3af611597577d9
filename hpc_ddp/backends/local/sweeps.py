"""A local sweep (:class:`ControllerSweeps`, the local backend's
:class:`~hpc_ddp.sweep.runner.SweepRunner`): a sweep controller on this machine
(:mod:`hpc_ddp.backends.local.sweep_controller`) starts each point as a local run, some at once.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.arrays import format_index_ranges
from hpc_ddp.backends.base import Cancelled
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.local.backend import LocalBackend
from hpc_ddp.backends.local.process import unmark_cancelled, was_cancelled
from hpc_ddp.backends.local.sweep_controller import (
    cancel_local_sweep,
    controller_alive,
    controller_points,
    local_parallel,
    start_controller,
)
from hpc_ddp.errors import TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.rundir.manifest import (
    Manifest,
    read_manifest,
    record_lock,
    write_manifest,
)
from hpc_ddp.state.report import run_status
from hpc_ddp.state.task import RESUBMITTABLE, TaskState, verdict_task_state
from hpc_ddp.state.verdict import BackendView
from hpc_ddp.submission.submit import create_run_dir, stamp_of
from hpc_ddp.sweep.records import read_sweep_record
from hpc_ddp.sweep.results import gather_results, task_dirs
from hpc_ddp.sweep.runner import Resubmission, TaskWord
from hpc_ddp.sweep.sweepdir import sweep_record_text, write_sweep_dir

if TYPE_CHECKING:
    from hpc_ddp.backends.arrays import PreparedArray
    from hpc_ddp.backends.base import Backends
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
    from hpc_ddp.sweep.spec import SweepSpec


class ControllerSweeps:
    """A local sweep: a sweep controller starts each point as a local run, some at once.
    ``backends``: what judges each point's run (its manifest names the local backend)."""

    def __init__(self, backends: Backends) -> None:
        self._backends = backends

    @property
    def backend(self) -> BackendName:
        """``local``."""
        return "local"

    def at_once(self, spec: SweepSpec) -> int | None:
        """The controller's limit: ``max_parallel``, or its default."""

        return local_parallel(spec.max_parallel)

    def plan(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        sweep_dir: Path,
        invocation: Sequence[str],
        now: datetime,
    ) -> tuple[list[PreparedArray], str]:
        """Nothing rendered: the controller starts each point as a local run."""
        del spec, sweep_file, sweep_dir, invocation, now
        return [], ""

    def start(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        runs_dir: Path,
        invocation: Sequence[str],
    ) -> tuple[Path, tuple[str, ...]]:
        """A detached sweep controller on this machine, started over every point."""

        sweep_dir = submit_local_sweep(
            spec, sweep_file=sweep_file, runs_dir=runs_dir, invocation=invocation
        )
        return sweep_dir, ()

    def task_jobs(self, sweep_dir: Path, points: Sequence[int]) -> dict[int, str]:
        """The local run's job id of each point started so far."""
        out = {}
        for i in points:
            task = RunPaths(sweep_dir).task(i).root
            if (task / MANIFEST_FILE).exists():
                out[i] = read_manifest(task).job_id or ""
        return out

    def settled(self, sweep_dir: Path) -> bool:
        """True once the controller has exited: every point may read ended a moment before it
        has reaped the last one."""

        return not controller_alive(sweep_dir)

    def task_words(
        self,
        sweep_dir: Path,
        points: Sequence[int],
        live: Mapping[str, JobInfo] | None,
        accounting: Mapping[str, AccountingRecord] | None,
    ) -> list[TaskWord]:
        """Each point judged as a local run, or by what the controller will do with it."""

        del live, accounting  # no queue holds a local sweep's points
        return [(*word, None) for word in local_task_words(sweep_dir, points, self._backends)]

    def resubmit(
        self,
        sweep_dir: Path,
        *,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """A new sweep controller over those points, unless the old one still runs."""

        del python, invocation, now  # nothing is rendered or submitted
        return resubmit_local(sweep_dir, dry_run, self)

    def cancel(self, sweep_dir: Path) -> Cancelled:
        """Its controller gets the SIGTERM and stops the running points
        (:func:`~hpc_ddp.backends.local.sweep_controller.cancel_local_sweep`)."""
        done = cancel_local_sweep(sweep_dir)
        return Cancelled(done.outcome, done.message)

    def busy(self, sweep_dir: Path, live: dict[int, str]) -> TargetError:
        """Its controller still runs: it may yet start its points."""
        return TargetError(
            f"nothing resubmitted: the local sweep controller of {sweep_dir} still runs (points "
            f"{format_index_ranges(live)} are running or waiting for it); two processes must "
            f"never start one point. HINT: `hpc-ddp status {sweep_dir}` follows it; resubmit "
            f"once it has ended, or `hpc-ddp cancel {sweep_dir}` first."
        )


def submit_local_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    runs_dir: Path,
    invocation: Sequence[str],
    now: datetime | None = None,
) -> Path:
    """Write a new sweep directory for ``spec`` and start its points as local runs, at most
    ``max_parallel`` at once (:mod:`hpc_ddp.backends.local.sweep_controller`); returns the
    sweep directory."""
    backend = LocalBackend()
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


def resubmit_local(sweep_dir: Path, dry_run: bool, runner: ControllerSweeps) -> Resubmission:
    """A local sweep's resubmit: a new sweep controller over its failed and cancelled points,
    under the sweep directory's record lock (a second resubmit waits, then finds them live)."""
    if dry_run:
        return _resubmit_local(sweep_dir, dry_run, runner)
    with record_lock(sweep_dir):
        return _resubmit_local(sweep_dir, dry_run, runner)


def _resubmit_local(sweep_dir: Path, dry_run: bool, runner: ControllerSweeps) -> Resubmission:
    """A local sweep's failed and cancelled points, started again by a new sweep controller,
    each going on from its checkpoint in its own directory. Refused (nothing started) while
    the sweep's controller still runs: it may yet start them, and two processes must never
    start one point."""

    record = read_sweep_record(sweep_dir)
    rows = gather_results(sweep_dir, runner)
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


_LIVE = frozenset({TaskState.RUNNING, TaskState.PENDING, TaskState.REQUEUED})
CONTROLLER_EXIT_S = 15.0
"""How long ``--resubmit-failed`` waits for a local sweep controller whose points have all
ended to exit (it notices within a poll, then reaps its last point's processes)."""


def _wait_for_exit(sweep_dir: Path) -> None:
    import time

    deadline = time.monotonic() + CONTROLLER_EXIT_S
    while controller_alive(sweep_dir) and time.monotonic() < deadline:
        time.sleep(0.2)


def local_task_words(
    sweep_dir: Path, points: Sequence[int], backends: Backends
) -> list[tuple[TaskState, str | None]]:
    """(state, job id) of each of a local sweep's ``points``: a started point is a local run,
    judged as ``status`` judges one (its processes stand in for Slurm); one the live controller
    has yet to start (again) is ``pending``; one never started, once no controller will, is
    ``cancelled`` (the sweep was) or ``failed`` (the controller died), which
    ``--resubmit-failed`` starts.

    What the whole sweep shares (the live controller and the points it names, the cancel
    mark, the sweep's own manifest) is read once for all the points, not once per point: the
    controller's command line lists every point, so reading it per point was quadratic (a
    10,000-point sweep's ``status`` took half a minute)."""

    queued = controller_points(sweep_dir) or frozenset()
    cancelled: bool | None = None
    sweep_submitted: str | None = None
    paths = RunPaths(sweep_dir)
    made = task_dirs(sweep_dir)
    out: list[tuple[TaskState, str | None]] = []
    for index in points:
        task = paths.task(index).root
        if str(index) not in made or not (task / MANIFEST_FILE).exists():
            if index in queued:
                out.append((TaskState.PENDING, None))
                continue
            if cancelled is None:
                cancelled = was_cancelled(sweep_dir)
            out.append((TaskState.CANCELLED if cancelled else TaskState.FAILED, None))
            continue
        manifest = read_manifest(task)
        # Started again by a controller that has not come to it yet: its last run is the past.
        if index in queued:
            if sweep_submitted is None:
                sweep_submitted = read_manifest(sweep_dir).submitted_at
            if manifest.submitted_at < sweep_submitted:
                out.append((TaskState.PENDING, manifest.job_id))
                continue
        row = run_status(task, BackendView({}, accounting={}), backends)
        out.append((verdict_task_state(str(row["state"])), manifest.job_id))
    return out
