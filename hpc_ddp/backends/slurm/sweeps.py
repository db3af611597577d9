"""A Slurm sweep: job arrays, one task per point, recorded in ``arrays.json``
(:class:`ArraySweeps`, the Slurm backend's :class:`~hpc_ddp.sweep.runner.SweepRunner`).

Like :mod:`hpc_ddp.submission.submit`: planning and rendering the arrays are pure
(:mod:`hpc_ddp.backends.slurm.array_sweep`: the dry run shows them),
:mod:`hpc_ddp.sweep.sweepdir` writes the sweep directory, and :func:`schedule_arrays` is the
one place that calls ``sbatch``. Each array leaves out the lemon nodes a submit of its points
would (:func:`lemon_exclusions`).

Speed matters here (a 1,000-point sweep should submit as fast as submitit's ``map_array``), so
the configs are dumped through :mod:`hpc_ddp.sweep.configtext` and written into one file, each
task writing its own ``config.yaml`` from it when it starts (:mod:`hpc_ddp.rundir.taskconfig`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.arrays import (
    ArrayRecord,
    PreparedArray,
    current_refs,
    format_index_ranges,
    live_task,
    read_arrays,
    write_arrays,
)
from hpc_ddp.backends.base import Cancelled
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
from hpc_ddp.backends.slurm.array_sweep import SLURM_DEFAULT_MAX_ARRAY_SIZE, prepare_arrays
from hpc_ddp.backends.slurm.backend import SlurmBackend
from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import SlurmError, SubmissionError, TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.rundir.manifest import (
    Manifest,
    read_manifest,
    record_lock,
    write_manifest,
)
from hpc_ddp.rundir.taskconfig import load_task_config
from hpc_ddp.submission.exclusion import lemon_exclusion
from hpc_ddp.submission.submit import create_run_dir, stamp_of
from hpc_ddp.sweep.records import read_sweep_record
from hpc_ddp.sweep.results import array_task_words, failed_points
from hpc_ddp.sweep.runner import Resubmission, TaskWord
from hpc_ddp.sweep.sweepdir import link_offset_tasks, sweep_record_text, write_sweep_dir

if TYPE_CHECKING:
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.lemons.record import Exclusion
    from hpc_ddp.sweep.spec import SweepSpec

log = logging.getLogger(__name__)


def lemon_exclusions(
    configs: Mapping[int, JobConfig], client: SlurmClient, env: Mapping[str, str], now: float
) -> dict[int, Exclusion]:
    """What each point's array does with the lemon record of ``env``'s user, by a submit's
    rule (:func:`~hpc_ddp.submission.exclusion.lemon_exclusion`): only the lemons of the
    point's partition, and only while it keeps the point's smallest ``--nodes`` besides them.
    Decided once per distinct ``slurm`` section and lemon settings (a 1,000-point sweep asks
    ``sinfo`` once); empty without a record, which costs a sweep nothing more."""
    backend = SlurmBackend(client)
    decided: dict[tuple[object, ...], Exclusion | None] = {}
    out: dict[int, Exclusion] = {}
    for index, cfg in configs.items():
        key = (cfg.slurm, cfg.fault.lemon_nodes, cfg.fault.lemon_window_days)
        if key not in decided:
            decided[key] = lemon_exclusion(cfg, backend, env, now)
        found = decided[key]
        if found is not None:
            out[index] = found
    return out


def say_lemons(arrays: Sequence[PreparedArray]) -> None:
    """Warn of what the arrays do with the lemon record, as a submit does (each distinct
    line once)."""
    lines = [line for a in arrays if a.lemons is not None for line in a.lemons.lines()]
    for line in dict.fromkeys(lines):
        log.warning("%s", line)


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
        say_lemons(arrays)
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
    """:func:`prepare_arrays` for every point of ``spec`` (what a dry run shows), each array
    leaving out the lemon nodes a submit of its points would (:func:`lemon_exclusions`)."""
    now = now or datetime.now(timezone.utc)
    base = Path(spec.base_source)
    configs = {p.index: p.config for p in spec.points}
    return prepare_arrays(
        configs,
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
        lemons=lemon_exclusions(configs, client, os.environ, now.timestamp()),
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
    when = now or datetime.now(timezone.utc)
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
        lemons=lemon_exclusions(configs, client, os.environ, when.timestamp()),
    )
    if dry_run:
        return Resubmission(points, arrays, [], running)
    say_lemons(arrays)
    records = schedule_arrays(
        sweep_dir, arrays, client, manifest=manifest, previous=previous, reason="resubmit-failed"
    )
    return Resubmission(points, arrays, records, running)


def live_points(arrays: Sequence[ArrayRecord], live: Mapping[str, JobInfo]) -> dict[int, str]:
    """Point -> its array task's ref, for every point whose current task squeue shows queued or
    running (``live``: squeue's rows of the sweep's arrays)."""
    out: dict[int, str] = {}
    for point, (job_id, task_id) in current_refs(arrays).items():
        info = live_task(live, job_id, task_id)
        if info is not None and not info.state.finished:
            out[point] = info.ref
    return out


class ArraySweeps:
    """A Slurm sweep: job arrays, one task per point, recorded in ``arrays.json``; every
    command goes through ``slurm``'s client."""

    def __init__(self, slurm: SlurmBackend) -> None:
        self._slurm = slurm

    @property
    def backend(self) -> BackendName:
        """``slurm``."""
        return "slurm"

    def at_once(self, spec: SweepSpec) -> int | None:
        """The arrays' throttle (``%N``), ``max_parallel``; None: Slurm's limits alone."""
        return spec.max_parallel

    def plan(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        sweep_dir: Path,
        invocation: Sequence[str],
        now: datetime,
    ) -> tuple[list[PreparedArray], str]:
        """The arrays, split at Slurm's ``MaxArraySize`` (its default when Slurm cannot be
        asked, which the note says)."""

        try:
            max_array_size, note = self._slurm.max_array_size(), ""
        except SlurmError:
            max_array_size = SLURM_DEFAULT_MAX_ARRAY_SIZE
            note = f"# Slurm not reachable: assumed MaxArraySize={max_array_size} (Slurm's default)"
        arrays = prepare_sweep(
            spec,
            sweep_file=sweep_file,
            sweep_dir=sweep_dir,
            max_array_size=max_array_size,
            python=sys.executable,
            invocation=invocation,
            client=self._slurm.client,
            now=now,
        )
        return arrays, note

    def start(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        runs_dir: Path,
        invocation: Sequence[str],
    ) -> tuple[Path, tuple[str, ...]]:
        """One job array per sweep (or as few as ``MaxArraySize`` allows), submitted."""

        submission = submit_sweep(
            spec,
            sweep_file=sweep_file,
            runs_dir=runs_dir,
            python=sys.executable,
            invocation=invocation,
            client=self._slurm.client,
        )
        return submission.sweep_dir, tuple(dict.fromkeys(r.job_id for r in submission.arrays))

    def task_jobs(self, sweep_dir: Path, points: Sequence[int]) -> dict[int, str]:
        """The array task that runs each point now."""
        refs = current_refs(read_arrays(sweep_dir))
        return {i: f"{refs[i][0]}_{refs[i][1]}" for i in points if i in refs}

    def settled(self, sweep_dir: Path) -> bool:
        """True: Slurm's ended state of each task says it by itself."""
        del sweep_dir
        return True

    def task_words(
        self,
        sweep_dir: Path,
        points: Sequence[int],
        live: Mapping[str, JobInfo] | None,
        accounting: Mapping[str, AccountingRecord] | None,
    ) -> list[TaskWord]:
        """Each task's ledger weighed against squeue's row (or sacct's record) of its task."""

        return array_task_words(sweep_dir, points, live, accounting)

    def resubmit(
        self,
        sweep_dir: Path,
        *,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """One new array (or as few as ``MaxArraySize`` allows) over exactly those points."""

        return resubmit_arrays(sweep_dir, self._slurm.client, python, invocation, dry_run, now)

    def cancel(self, sweep_dir: Path) -> Cancelled:
        """Nothing but its job arrays runs a Slurm sweep: those are cancelled as jobs."""
        return Cancelled("unknown", f"{sweep_dir}: a Slurm sweep is cancelled as its job arrays")

    def busy(self, sweep_dir: Path, live: dict[int, str]) -> TargetError:
        """Naming the arrays whose tasks still run."""
        arrays = ", ".join(dict.fromkeys(ref.split("_", 1)[0] for ref in live.values()))
        shown = ", ".join(list(dict.fromkeys(live.values()))[:8])
        more = " ..." if len(set(live.values())) > 8 else ""
        return TargetError(
            f"nothing resubmitted: {len(live)} task(s) of {sweep_dir} (points "
            f"{format_index_ranges(live)}) are still queued or running in array job(s) {arrays} "
            f"({shown}{more}), and no task has failed; two jobs must never write one task "
            f"directory. HINT: `hpc-ddp status {sweep_dir}` follows them; resubmit once they "
            f"have ended, or `hpc-ddp cancel {sweep_dir}` first."
        )
