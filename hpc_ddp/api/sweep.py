"""A sweep from Python: submit it as one job array, watch it, rank its results, resubmit what
failed.

::

    import hpc_ddp

    sweep = hpc_ddp.submit_sweep("jobs/sweep-lr.yaml", {"train.max_steps": 200})
    sweep.wait(check=False)       # until no task is queued or running
    best = sweep.results()[0]     # the rows `hpc-ddp results` shows, best first

A :class:`Sweep` is its sweep directory and its array job ids; ``Sweep.from_dir(path)`` in a new
process is the same sweep. Each point is a :class:`~hpc_ddp.api.job.Job` of :meth:`Sweep.tasks`
(its run directory is ``SWEEP_DIR/tasks/N``). The ``sweep`` and ``results`` verbs print what
the functions here return; nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_ddp.api.arguments import Overrides, override_args, path_arg
from hpc_ddp.api.cancel import CancelResult, cancel_targets
from hpc_ddp.api.job import BackendChoice, Job
from hpc_ddp.api.status import SweepStatus, collect_status, wait_until_ended
from hpc_ddp.api.targets import require_dir
from hpc_ddp.backends.arrays import ArrayRecord, PreparedArray, read_arrays
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.errors import (
    BackendError,
    ConfigError,
    RunDirError,
    RunFailedError,
    RunsDirError,
)
from hpc_ddp.rundir.layout import MANIFEST_FILE, RUNS_DIR_ENV
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.sweep.records import SweepRecord, read_sweep_record
from hpc_ddp.sweep.results import ResultRow
from hpc_ddp.sweep.runner import Resubmission
from hpc_ddp.sweep.spec import SweepSpec

if TYPE_CHECKING:
    from hpc_ddp.backends.registry import SlurmClient

RESULT_COLUMNS = ("best", "final", "loss", "steps", "attempts", "index")
"""Columns of the results table that rows can be sorted by, besides a logged metric or a
swept key."""


# --- the sweep ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """A submitted sweep: its directory and the job arrays submitted for it, oldest first.

    Rebuild one anywhere from the sweep directory alone with :meth:`from_dir`. The methods
    read the sweep directory and ask Slurm each time; none of them caches.
    """

    sweep_dir: Path
    array_jobs: tuple[str, ...]
    """Every array job id submitted for the sweep (``--resubmit-failed`` adds one); none for
    a local sweep."""
    backend: str = "slurm"
    """``slurm`` (job arrays) or ``local`` (a sweep controller on this machine starts each
    point as a local run: :mod:`hpc_ddp.backends.local.sweeps`)."""
    backends: Registry = field(default_factory=Registry, compare=False, repr=False)
    """The backends its methods ask (default: the real ones)."""

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        backends: Registry | None = None,
        slurm: SlurmClient | None = None,
    ) -> Sweep:
        """The sweep of a sweep directory, read from its records (``sweep.yaml``,
        ``arrays.json``); ``backends`` (or, deprecated, ``slurm``): what its methods ask. A
        path that is no sweep directory is a :class:`~hpc_ddp.errors.TargetError` or
        :class:`~hpc_ddp.errors.RunDirError` with a hint."""
        registry = registry_of(backends, slurm)
        sweep_dir = require_dir(str(path), "sweep directory")
        read_sweep_record(sweep_dir)  # no sweep.yaml: not a sweep, said with a hint
        jobs = tuple(dict.fromkeys(a.job_id for a in read_arrays(sweep_dir)))
        backend = "slurm"
        if (sweep_dir / MANIFEST_FILE).exists():
            backend = read_manifest(sweep_dir).backend
        return cls(sweep_dir, jobs, backend, backends=registry)

    def record(self) -> SweepRecord:
        """``sweep.yaml``: the points, what each sets, and the metric the sweep ranks by."""
        return read_sweep_record(self.sweep_dir)

    def arrays(self) -> list[ArrayRecord]:
        """Every job array submitted for the sweep (``arrays.json``), oldest first."""
        return read_arrays(self.sweep_dir)

    def tasks(self) -> list[Job]:
        """One :class:`~hpc_ddp.api.job.Job` per point, in index order, each with the array
        task that runs it now (its ``job_id``; empty for a point never submitted)."""
        runner = self.backends.sweeps_of(self.sweep_dir)
        points = [p.index for p in self.record().points]
        jobs = runner.task_jobs(self.sweep_dir, points)
        return [
            Job(self.sweep_dir / "tasks" / str(i), jobs.get(i, ""), runner.backend, index=i,
                backends=self.backends)
            for i in points
        ]  # fmt: skip

    def status(self) -> SweepStatus:
        """How many tasks are in each state, and each task's row, as ``hpc-ddp status
        SWEEP_DIR --json`` shows them."""
        [found] = collect_status([str(self.sweep_dir)], self.sweep_dir.parent, self.backends)
        if not isinstance(found, SweepStatus):  # DAMAGED: its note says why
            raise RunDirError(
                f"{self.sweep_dir}: {found.note}. HINT: `hpc-ddp status {self.sweep_dir}` "
                "shows it; restore the sweep's records, or sweep again."
            )
        return found

    def wait(
        self, timeout: float | None = None, *, check: bool = True, poll_s: float | None = None
    ) -> SweepStatus:
        """Wait until no task is queued, running or requeued, and return the sweep's status.

        With ``check`` a sweep where any task did not finish (failed, cancelled) raises
        :class:`~hpc_ddp.errors.RunFailedError` naming those tasks; a search that expects
        some points to fail passes ``check=False`` and reads :meth:`results`. Past ``timeout``
        seconds a :class:`~hpc_ddp.errors.WaitTimeoutError`; the tasks go on.
        """
        done = wait_until_ended(self.status, timeout=timeout, what=str(self.sweep_dir),
                                poll_s=poll_s, settled=self._settled)  # fmt: skip
        if check and not done.succeeded:
            lines = tuple(
                f"task {t['index']}: {t['state']}"
                + (f" ({t['last_cause']})" if t.get("last_cause") else "")
                + f": {t['run_dir']}"
                for t in done.unfinished
            )
            listed = "".join(f"\n  {line}" for line in lines)
            raise RunFailedError(
                f"{self.sweep_dir}: {len(lines)} of {len(done.tasks)} task(s) did not finish"
                f"{listed}. HINT: `hpc-ddp logs {self.sweep_dir} --task N` shows why; "
                "Sweep.resubmit_failed() goes on with them from their checkpoints.",
                status=done,
                reasons=lines,
            )
        return done

    def results(
        self, sort: str | None = None, mode: Literal["min", "max"] | None = None
    ) -> list[dict[str, Any]]:
        """The rows ``hpc-ddp results SWEEP_DIR --json`` shows (its ``rows``), best first, as
        plain dicts: ``index``, ``name``, ``state``, ``values`` (each swept key's value),
        ``best``/``final``/``best_step`` of the metric, ``loss``, ``steps``, ``attempts``,
        ``last_cause``, ``job_id``, ``run_dir`` (docs/json.md).

        ``sort``: a logged metric (ranked by its best value), a swept key, or one of
        :data:`RESULT_COLUMNS` (default: the sweep's metric); ``mode`` ``min`` or ``max``
        (default: the sweep's for its metric). Works while the sweep runs.
        """
        from hpc_ddp.sweep.results import row_dict

        if mode not in (None, "min", "max"):
            raise ValueError(
                f"mode={mode!r} is not a ranking mode. HINT: pass 'min' (lower is better), "
                "'max' (higher is better), or None for the sweep's own."
            )
        gathered = gather(self.sweep_dir, self.backends, sort=sort, mode=mode)
        return [row_dict(r) for r in gathered.rows]

    def cancel(self) -> CancelResult:
        """Cancel every array of the sweep, as ``hpc-ddp cancel SWEEP_DIR`` does."""
        [result] = cancel_targets(
            [str(self.sweep_dir)], runs_dir=self.sweep_dir.parent, backends=self.backends
        )
        return result

    def resubmit_failed(self) -> Sweep:
        """Submit the failed and cancelled tasks again, as one new array over exactly those
        points, each going on from its checkpoint in its own directory; returns the sweep with
        the new array (unchanged when nothing failed). Refused (:class:`TargetError`) while
        tasks run and none has failed."""
        resubmit(self.sweep_dir, backends=self.backends)
        return Sweep.from_dir(self.sweep_dir, backends=self.backends)

    def _settled(self) -> bool:
        """True unless a local sweep's controller still runs: every point may read ended a
        moment before it has reaped the last one and exited."""
        return self.backends.sweeps_of(self.sweep_dir).settled(self.sweep_dir)


# --- submitting ---------------------------------------------------------------------------------


def load_sweep_spec(
    sweep_file: str | Path,
    overrides: Overrides = (),
    *,
    site: str | Path | None = None,
) -> SweepSpec:
    """A sweep file expanded into its points, each checked as a job (and from the login node,
    as ``submit`` checks a job); ``overrides`` apply to the base job, a swept key wins. An
    override whose value lists values (``train.lr=0.1,0.01``) is a grid axis crossed with the
    file's points; ``sweep_file`` may then be a plain job file."""
    from hpc_ddp.config.load import find_site_profile
    from hpc_ddp.config.preflight import preflight_points
    from hpc_ddp.sweep.spec import load_sweep, split_sweep_overrides

    path = Path(path_arg("sweep_file", sweep_file) or "")
    profile = find_site_profile(path_arg("site", site), os.environ, Path.home())
    plain, axes = split_sweep_overrides(override_args(overrides))
    spec = load_sweep(path, plain, profile, axes=axes)
    preflight_points((f"{path}: point {p.index}", p.config) for p in spec.points)
    return spec


def sweep_runs_dir(runs_dir: str | Path | None) -> Path:
    """Where a sweep directory goes: ``runs_dir``, else ``$HPC_DDP_RUNS_DIR``, else ``./runs``,
    refused (:class:`RunsDirError`) when it is a file, lies under one, or cannot be written."""
    from hpc_ddp.submission.submit import runs_dir_from

    path = runs_dir_from(path_arg("runs_dir", runs_dir), os.environ)
    origin = (
        "--runs-dir" if runs_dir else f"${RUNS_DIR_ENV}" if os.environ.get(RUNS_DIR_ENV)
        else "the default runs directory"
    )  # fmt: skip
    check_runs_dir(path, origin)
    return path


def check_runs_dir(runs_dir: Path, origin: str) -> None:
    """Refuse a runs directory that is a file, lies under one, or cannot be written to.

    ``origin`` names where it came from (``--runs-dir``) in the message.
    """
    for path in (runs_dir, *runs_dir.absolute().parents):
        if not path.exists():
            continue  # it will be created
        if not path.is_dir():
            what = "is a file" if path == runs_dir else f"lies under the file {path}"
            raise RunsDirError(
                f"{origin} {runs_dir}: {what}, not a directory. HINT: give a directory for "
                "the sweep directories (it is created if missing)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunsDirError(
                f"{origin} {runs_dir}: {path} is not writable. HINT: choose a directory you "
                "can write to"
            )
        return


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep would write and submit (``hpc-ddp sweep --dry-run``); nothing done yet."""

    spec: SweepSpec
    sweep_dir: Path
    """Where the sweep directory would go now."""
    arrays: list[PreparedArray]
    """Each job array: its points, ``--array`` range, script and sbatch command."""
    note: str = ""
    """Set when Slurm could not be asked for ``MaxArraySize`` (its default was assumed)."""
    backend: BackendName = "slurm"
    at_once: int | None = None
    """How many points would run at once (:func:`at_once`)."""


def at_once(spec: SweepSpec, backend: BackendName) -> int | None:
    """How many points of a sweep run at once: Slurm's array throttle, ``max_parallel``
    (None: no limit); a local sweep's controller, ``max_parallel`` or its default."""
    return Registry().sweeps(backend).at_once(spec)


def plan_sweep(
    spec: SweepSpec,
    *,
    sweep_file: str | Path,
    runs_dir: Path,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
    invocation: Sequence[str] = (),
    backend: BackendName = "slurm",
) -> SweepPlan:
    """What :func:`launch_sweep` would write and start for ``spec``, and where: the arrays
    rendered (none for a local sweep: its points run as local runs), nothing written.
    ``backends`` (or, deprecated, ``slurm``): whose sweep runner plans it."""
    from hpc_ddp.submission.submit import new_run_dir, stamp_of

    now = datetime.now(timezone.utc)
    spec = _with_lead_times(spec, now.timestamp())
    sweep_dir = new_run_dir(runs_dir.resolve(), spec.name, stamp_of(now))
    runner = registry_of(backends, slurm).sweeps(backend)
    arrays, note = runner.plan(
        spec,
        sweep_file=Path(sweep_file),
        sweep_dir=sweep_dir,
        invocation=list(invocation) or ["hpc_ddp.submit_sweep", str(sweep_file)],
        now=now,
    )
    return SweepPlan(spec, sweep_dir, arrays, note, backend=backend, at_once=runner.at_once(spec))


def _with_lead_times(spec: SweepSpec, now: float) -> SweepSpec:
    """``spec`` with each point's ``requeue.lead_time: auto`` resolved from the user's
    save-time history, as a submit resolves a run's (:mod:`hpc_ddp.submission.leadtime`)."""
    if all(p.config.requeue.lead_time != "auto" for p in spec.points):
        return spec
    import dataclasses

    from hpc_ddp.submission.leadtime import resolve_lead_time

    points = tuple(
        dataclasses.replace(p, config=resolve_lead_time(p.config, os.environ, now)[0])
        for p in spec.points
    )
    return dataclasses.replace(spec, points=points)


# --- what the verbs show ------------------------------------------------------------------------


def points_table(spec: SweepSpec) -> str:
    """The points as a table: index, name and each swept key (blank where a point leaves it)."""
    from tabulate import tabulate

    keys = list(dict.fromkeys(k for p in spec.points for k, _ in p.overrides))
    rows = []
    for p in spec.points:
        values = dict(p.overrides)
        rows.append(
            [p.index, p.config.name, *(_cell(values[k]) if k in values else "" for k in keys)]
        )
    return tabulate(rows, headers=["#", "name", *keys], disable_numparse=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def arrays_text(arrays: Sequence[PreparedArray]) -> str:
    """Each array's script and the command that would submit it (a dry run), headed by its
    script's name and task range when there are several, and followed by the lemon nodes it
    leaves out and why, as ``submit --dry-run`` says them."""
    text = ""
    for a in arrays:
        if len(arrays) > 1:
            offset = a.plan.offset
            text += f"# ---- {a.script_name}: --array={a.array}, task t runs point t+{offset}\n"
        text += a.script
        text += f"# would run: {shlex.join(a.argv)}\n"
        text += "".join(f"# {line}\n" for line in a.lemons.lines()) if a.lemons else ""
    return text


def submitted_json(sweep: Sweep, points: int) -> dict[str, Any]:
    """``sweep --json`` once submitted or started (schema ``hpc-ddp.sweep/1``)."""
    from hpc_ddp.output import SWEEP, document

    arrays = sweep.arrays()
    return document(
        SWEEP,
        {
            "dry_run": False,
            "sweep_dir": str(sweep.sweep_dir),
            "backend": sweep.backend,
            "points": points,
            "job_id": read_manifest(sweep.sweep_dir).job_id,
            "array_jobs": [r.job_id for r in arrays],
            "arrays": [{"job_id": r.job_id, "points": r.points, "array": r.array} for r in arrays],
        },
    )


def plan_json(plan: SweepPlan) -> dict[str, Any]:
    """``sweep --dry-run --json`` (schema ``hpc-ddp.sweep/1``, ``dry_run`` true)."""
    from hpc_ddp.output import SWEEP, document

    spec = plan.spec
    return document(
        SWEEP,
        {
            "dry_run": True,
            "sweep_dir": str(plan.sweep_dir),
            "backend": plan.backend,
            "metric": {"name": spec.metric, "mode": spec.mode},
            "max_parallel": plan.at_once,
            "points": [
                {"index": p.index, "name": p.config.name, "values": _values(p.overrides)}
                for p in spec.points
            ],
            "arrays": [_array_json(a) for a in plan.arrays],
        },
    )


def _values(overrides: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in overrides}


def _array_json(a: PreparedArray) -> dict[str, Any]:
    shown = {
        "points": list(a.plan.points),
        "offset": a.plan.offset,
        "array": a.array,
        "script_name": a.script_name,
        "script": a.script,
        "command": list(a.argv),
    }
    if a.lemons is not None and a.lemons.lemons:  # as submit --dry-run --json's
        shown["lemons"] = a.lemons.to_dict()
    return shown


def resubmission_json(sweep_dir: Path, result: Resubmission, *, dry_run: bool) -> dict[str, Any]:
    """``sweep --resubmit-failed --json`` (schema ``hpc-ddp.sweep/1``)."""
    from hpc_ddp.output import SWEEP, document

    backend = Sweep.from_dir(sweep_dir).backend
    job_id = read_manifest(sweep_dir).job_id
    if dry_run and backend == "local":
        # A dry run started nothing: the recorded controller's pid, only while it still runs.
        job_id = None if Registry().sweeps("local").settled(sweep_dir) else job_id
    shown = {
        "dry_run": dry_run,
        "sweep_dir": str(sweep_dir),
        "backend": backend,
        "resubmitted": result.points,
        "job_id": job_id,
        "array_jobs": [r.job_id for r in result.records],
        "arrays": [_array_json(a) for a in result.arrays] if dry_run else [],
    }
    return document(SWEEP, shown)


def choose_sweep_backend(backend: BackendChoice) -> BackendName:
    """``auto``: Slurm when ``sbatch`` is on PATH, else local processes (as for a run)."""
    from hpc_ddp.submission.submit import choose_backend

    return choose_backend(backend)


def launch_sweep(
    spec: SweepSpec,
    *,
    sweep_file: str | Path,
    runs_dir: Path,
    backends: Registry | None = None,
    invocation: Sequence[str] = (),
    backend: BackendName = "slurm",
) -> Sweep:
    """Write a new sweep directory for ``spec`` under ``runs_dir`` and submit its job array
    (or as few as ``MaxArraySize`` allows); ``backend="local"``: start its points as local
    runs, ``max_parallel`` at once (default 1), under a detached sweep controller."""
    registry = registry_of(backends)
    try:
        sweep_dir, jobs = registry.sweeps(backend).start(
            spec,
            sweep_file=Path(sweep_file),
            runs_dir=runs_dir,
            invocation=list(invocation) or ["hpc_ddp.submit_sweep", str(sweep_file)],
        )
    except OSError as exc:  # the checks passed, and then the disk said no
        raise RunDirError(
            f"writing the sweep directory under {runs_dir} failed: {exc}. HINT: check the "
            "space and permissions there, or choose another --runs-dir"
        ) from None
    return Sweep(sweep_dir, jobs, backend, backends=registry)


def submit_sweep(
    sweep_file: str | Path,
    overrides: Overrides = (),
    *,
    runs_dir: str | Path | None = None,
    site: str | Path | None = None,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
    backend: BackendChoice = "auto",
) -> Sweep:
    """Expand a sweep file and submit every point as one Slurm job array (throttled by its
    ``max_parallel``), as ``hpc-ddp sweep SWEEP_FILE KEY=VALUE ...`` does.

    ``overrides`` (``{"train.max_steps": 200}`` or ``["train.max_steps=200"]``) apply to the
    base job; a swept key wins, and a command-line value with a comma (``"train.lr=0.1,0.01"``)
    is a grid axis (:func:`hpc_ddp.sweep.spec.split_sweep_overrides`). ``backend``: ``auto``
    (Slurm when ``sbatch`` is on PATH, else local), ``slurm``, or ``local`` (every point a
    local run on this machine, ``max_parallel`` at once, default 1). ``runs_dir`` and ``site``
    ``backends`` (or, deprecated, ``slurm``) as for :func:`hpc_ddp.submit`. A bad sweep file or
    point is a :class:`~hpc_ddp.errors.ConfigError` naming it, and nothing is submitted.
    """
    registry = registry_of(backends, slurm)
    path_arg("runs_dir", runs_dir)  # before the sweep file is read
    chosen = choose_sweep_backend(backend)
    spec = load_sweep_spec(sweep_file, overrides, site=site)
    where = sweep_runs_dir(runs_dir)
    args = override_args(overrides)
    invocation = ["hpc_ddp.submit_sweep", str(sweep_file), *args]
    return launch_sweep(spec, sweep_file=sweep_file, runs_dir=where, backends=registry,
                        invocation=invocation, backend=chosen)  # fmt: skip


def resubmit(
    sweep_dir: Path,
    *,
    backends: Registry | None,
    invocation: Sequence[str] = (),
    dry_run: bool = False,
) -> Resubmission:
    """``--resubmit-failed``: submit the failed and cancelled tasks of a sweep again (with
    ``dry_run``, only say what would be). Nothing to resubmit while tasks of the sweep are
    queued or running is a :class:`TargetError` naming their arrays (two jobs must never write
    one task directory).

    Their directories are reused as they are: each goes on from its last checkpoint and appends
    to its ledger, metrics and logs. The sweep directory's record lock is held from the choice
    of the points to the record of what started them: a second resubmit waits, then finds
    those points live and starts nothing."""
    runner = registry_of(backends).sweeps_of(sweep_dir)  # job arrays, or a local sweep's controller
    result = runner.resubmit(
        sweep_dir,
        python=sys.executable,
        invocation=list(invocation) or ["hpc-ddp", "sweep", "--resubmit-failed", str(sweep_dir)],
        dry_run=dry_run,
        now=None,
    )
    if not result.points and result.live and not dry_run:
        raise runner.busy(sweep_dir, result.live)
    return result


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    """A sweep's rows, sorted, and how (what ``hpc-ddp results`` prints)."""

    record: SweepRecord
    rows: list[ResultRow]
    """Every point, best first by :attr:`sort_key`; rows without a value last."""
    sweep_dir: str
    sort_key: str
    metric: str
    """The metric gathered (``best``, ``final``)."""
    mode: str
    slurm_answered: bool
    """False when the states come from the task ledgers alone (Slurm not asked, or not
    answering)."""


def gather(
    sweep_dir: Path,
    backends: Registry | None,
    *,
    sort: str | None = None,
    mode: str | None = None,
    ask_backend: bool = True,
) -> Results:
    """Every task of the sweep with its state and metrics, sorted (see :meth:`Sweep.results`).

    ``sort`` naming a metric no task logged (and no swept key or column) is a
    :class:`ConfigError` listing what was logged. ``ask_backend`` False: states from the ledgers.
    """
    from hpc_ddp.sweep.results import gather_results, logged_metrics, sort_rows

    registry = registry_of(backends)
    record = read_sweep_record(sweep_dir)
    live = _live(sweep_dir, registry) if ask_backend else None
    accounting = None if live is None else _accounting(sweep_dir, live, registry)
    sort_key, metric, chosen = choose_sort(record, sort, mode)
    runner = registry.sweeps_of(sweep_dir)
    rows = sort_rows(gather_results(sweep_dir, runner, live, metric, accounting), sort_key, chosen)
    if metric != record.metric and all(r.best is None for r in rows):
        raise unlogged_metric(record, metric, logged_metrics(rows))
    return Results(record, rows, str(sweep_dir), sort_key, metric, chosen, live is not None)


def results_json(found: Results, rows: Sequence[ResultRow] | None = None) -> dict[str, Any]:
    """What ``hpc-ddp results --json`` prints (schema ``hpc-ddp.results/1``): the sweep, how
    its rows are ranked, and the rows (``rows``: those shown, default all), each as
    :meth:`Sweep.results` gives it."""
    from hpc_ddp.output import RESULTS, document
    from hpc_ddp.sweep.results import row_dict, sweep_summary

    return document(
        RESULTS,
        {
            "sweep_dir": found.sweep_dir,
            "metric": {"name": found.metric, "mode": found.mode},
            "sort_key": found.sort_key,
            "slurm_answered": found.slurm_answered,
            "summary": sweep_summary(found.rows),
            "rows": [row_dict(r) for r in (found.rows if rows is None else rows)],
        },
    )


def choose_sort(record: SweepRecord, key: str | None, mode: str | None) -> tuple[str, str, str]:
    """(row key to sort by, metric to gather, mode) for ``--sort KEY`` and ``--mode``."""
    if key is None or key == record.metric:
        return "best", record.metric, mode or record.mode
    if key in record.keys or key in RESULT_COLUMNS:
        metric_mode = record.mode if key in ("best", "final") else "min"
        return key, record.metric, mode or metric_mode
    return "best", key, mode or "min"


def unlogged_metric(record: SweepRecord, metric: str, logged: list[str]) -> ConfigError:
    """``--sort METRIC`` where no task logged METRIC: name what was logged, and the nearest."""
    import difflib

    close = difflib.get_close_matches(metric, [*logged, *record.keys, *RESULT_COLUMNS], n=1)
    maybe = f"did you mean {close[0]!r}? " if close else ""
    keys = ", ".join([*record.keys, *RESULT_COLUMNS])
    return ConfigError(
        f"--sort {metric}: no task logged a metric {metric!r} (metrics logged: "
        f"{', '.join(logged) or 'none yet'}), and it is no swept key or column. HINT: {maybe}"
        f"sort by a logged metric or one of: {keys}"
    )


def _live(sweep_dir: Path, backends: Registry) -> dict[str, JobInfo] | None:
    job_ids = list(dict.fromkeys(a.job_id for a in read_arrays(sweep_dir)))
    try:
        return backends.backend("slurm").states(job_ids) if job_ids else {}
    except BackendError:
        return None


def _accounting(
    sweep_dir: Path, live: dict[str, JobInfo], backends: Registry
) -> dict[str, AccountingRecord] | None:
    """sacct's records of the tasks squeue no longer holds; None without accounting."""
    from hpc_ddp.sweep.results import unheld_arrays

    unheld = unheld_arrays(sweep_dir, live)
    try:
        return backends.backend("slurm").accounting(unheld) if unheld else None
    except BackendError:
        return None
