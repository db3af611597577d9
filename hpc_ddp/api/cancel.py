"""Cancelling runs: what a target cancels, and whether it is provably that target's to cancel.

A run directory cancels its job; a sweep directory every job array of the sweep;
``SWEEP_DIR/tasks/N`` (or the task's ``ARRAYJOB_TASK``, e.g. ``1001_3``) the one array task that
runs point N now. Every target is resolved, and every job id checked, before anything is
cancelled: a damaged manifest (``"job_id": "--me"`` would be ``scancel --me``, every job of the
user) cancels nothing.

A job id read from a run directory is only a claim: ``cp -r runs/a runs/b`` gives ``b`` the
manifest of ``a``'s live job, and a hand-edited manifest may name anyone's. So before anything
is signalled, squeue says which script each job runs: it must be a script of this run (or
sweep) directory, else nothing of that target is cancelled (``not_this_run``). A job that has
already ended, or that Slurm does not know, is not cancelled either, and is said to be so
(``already_finished`` with its state, ``unknown``): ``scancel`` would return 0 for both.

A local run's job id is a pid, and pids are reused: it is signalled only while
:mod:`hpc_ddp.backends.local.process` proves the process under it is still that run's own, and that
its command line names this run directory. A local cancel returns once every process of the run
has ended: what ignores the SIGTERM is SIGKILLed after a grace (Slurm's ``KillWait``).

``hpc-ddp cancel``, :meth:`hpc_ddp.Job.cancel` and :meth:`hpc_ddp.Sweep.cancel` all cancel
through :func:`cancel_targets`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpc_ddp.api.targets import (
    find_array_task,
    manifest_jobs,
    point_task,
    resolve_targets,
    sweep_task_of,
)
from hpc_ddp.backends.local.process import KILL_WAIT_S
from hpc_ddp.backends.slurm.arrayjobs import live_task
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.jobstate import AccountingRecord, JobInfo, is_job_ref
from hpc_ddp.errors import RunDirError, SlurmError, TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE
from hpc_ddp.rundir.manifest import Backend, read_manifest


def check_targets(targets: Sequence[str]) -> None:
    """Refuse a target that is neither an existing directory, a sweep task's (made or not:
    a task that has not started has none yet) nor a well-formed job id."""
    for t in targets:
        if not Path(t).is_dir() and not is_job_ref(t) and sweep_task_of(Path(t)) is None:
            raise TargetError(
                f"cancel target {t!r} is neither a run directory nor a job id; nothing was "
                "cancelled. HINT: pass the run (or sweep) directory printed by `hpc-ddp submit` "
                "or `hpc-ddp sweep`, or its job id (a positive integer, e.g. 1234); "
                "`hpc-ddp status` lists the runs."
            )


@dataclass(frozen=True)
class Cancel:
    """What one target cancels: Slurm job ids read from ``source``, or a local run."""

    where: Path
    """The run, sweep or sweep task directory (for the message)."""
    source: Path
    """The file the job ids were read from: ``manifest.json`` or a sweep's ``arrays.json``."""
    jobs: tuple[str, ...]
    what: str = "job"
    local: bool = False
    """A local run: ``jobs`` is its controller's pid, checked by :func:`cancel_local`."""

    @property
    def home(self) -> Path:
        """The directory whose script the jobs must run: the run's, or the sweep's (which
        holds the record, ``arrays.json`` or ``manifest.json``)."""
        return self.source.parent


Outcome = Literal["cancelled", "already_finished", "unknown", "not_this_run", "still_running"]
"""What cancelling one target came to (``cancel --json``'s ``outcome``)."""


@dataclass(frozen=True)
class Result:
    """What was done for one target, and a line saying it."""

    outcome: Outcome
    message: str


@dataclass(frozen=True)
class CancelResult:
    """What cancelling one target came to: one object of ``hpc-ddp cancel --json``."""

    run_dir: Path
    """The run, sweep or sweep task directory."""
    backend: Backend
    jobs: tuple[str, ...]
    """The job ids (a local run: its controller's pid) it was about."""
    outcome: Outcome
    """``cancelled``, ``already_finished``, ``unknown`` (to Slurm), ``not_this_run`` (its job
    runs another directory's script: nothing of it was signalled) or, for a local run,
    ``still_running`` (some process of it survived SIGTERM and SIGKILL)."""
    message: str
    """The line ``hpc-ddp cancel`` prints for it."""

    def to_dict(self) -> dict[str, Any]:
        """As ``hpc-ddp cancel --json`` prints it, one of its ``results``."""
        return {
            "run_dir": str(self.run_dir),
            "backend": self.backend,
            "job_ids": list(self.jobs),
            "outcome": self.outcome,
            "message": self.message,
        }


def cancel_targets(
    targets: Sequence[str],
    *,
    runs_dir: Path,
    slurm: SlurmClient,
    kill_wait_s: float | None = None,
) -> Iterator[CancelResult]:
    """Cancel every target (run, sweep or sweep task directories, job ids, ``ARRAYJOB_TASK``),
    yielding what each came to as it is done; a cancelled job is never requeued by hpc-ddp.

    Every target is resolved, and every job id checked, before the first is cancelled: a
    wrong target raises (:class:`TargetError`, :class:`RunDirError`) and nothing is cancelled.
    ``runs_dir`` is where job ids are looked up. A local run is waited for until every
    process of it has ended, SIGKILLed after ``kill_wait_s`` (default
    :data:`~hpc_ddp.backends.local.process.KILL_WAIT_S`, as Slurm's ``KillWait``).
    """
    from hpc_ddp.backends.local.backend import stop_local

    check_targets(targets)
    plans = [plan for t in targets for plan in plan_cancel(t, runs_dir)]
    for plan in plans:
        if plan.local and plan.what == "local sweep":
            from hpc_ddp.sweep.local import cancel_local_sweep

            done = cancel_local_sweep(plan.where)
            result = Result(done.outcome, done.message)
        elif plan.local:
            wait = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
            done = stop_local(plan.where, plan.jobs[0], kill_wait_s=wait)
            result = Result(done.outcome, done.message)
        else:
            result = cancel_slurm(slurm, plan)
        backend: Backend = "local" if plan.local else "slurm"
        yield CancelResult(plan.where, backend, plan.jobs, result.outcome, result.message)


def plan_cancel(target: str, runs_dir: Path) -> list[Cancel]:
    """What ``target`` cancels; raises (before anything is cancelled) if any id is wrong."""
    path = Path(target)
    task = sweep_task_of(path)  # a task's directory, or the path of one not started yet
    if task is not None and (path / MANIFEST_FILE).exists():  # a local sweep's point: a run
        job = read_manifest(path).job_id or ""
        return [Cancel(path, path / MANIFEST_FILE, (job,), local=True)]
    if task is not None or (not path.is_dir() and "_" in target):
        found = point_task(*task) if task is not None else find_array_task(target, runs_dir)
        where = path if task is not None else found.sweep_dir / "tasks" / str(found.point)
        return [Cancel(where, found.source, (found.ref,), "array task")]
    plans = []
    for run_dir in resolve_targets([target], runs_dir):
        manifest = read_manifest(run_dir)
        if manifest.backend == "local":
            source = run_dir / MANIFEST_FILE
            what = "local sweep" if (run_dir / "tasks").is_dir() else "job"
            plans.append(Cancel(run_dir, source, (manifest.job_id or "",), what, local=True))
            continue
        jobs = manifest_jobs(run_dir, manifest)  # raises for an id that is no job id
        if not jobs:
            raise RunDirError(
                f"{run_dir}: the manifest has no job id; nothing to cancel. HINT: the job was "
                "never submitted; check `hpc-ddp status` or submit it again."
            )
        what = "job array" if manifest.array_jobs else "job"
        plans.append(Cancel(run_dir, run_dir / MANIFEST_FILE, tuple(jobs), what))
    return plans


def cancel_slurm(client: SlurmClient, plan: Cancel) -> Result:
    """``scancel`` each live job of ``plan`` (every array of a sweep, even when one of them
    cannot be cancelled) once squeue shows that every job of it runs a script of this run.

    A job squeue holds as finished is ``already_finished``; one squeue no longer holds is
    looked up in sacct (where there is accounting), else ``unknown``. Nothing is signalled for
    a plan with a job that is not this run's.
    """
    rows = client.job_states([_array_of(job) for job in plan.jobs])
    seen = {job: _rows_of(rows, job) for job in plan.jobs}
    for job, found in seen.items():
        foreign = next((r for r in found if not _runs_here(r.command, plan.home)), None)
        if foreign is not None:
            return _not_this_run(plan, job, foreign.command)
    live = [job for job, found in seen.items() if any(not r.state.finished for r in found)]
    failed: list[SlurmError] = []
    for job in live:
        try:
            client.cancel(job, source=str(plan.source))
        except SlurmError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]
    ended = {job: _state(found) for job, found in seen.items() if found and job not in live}
    gone = [job for job, found in seen.items() if not found]
    accounting, lacking = _accounting(client, gone)
    ended |= {j: s for j in gone if (s := _accounted(accounting, j)) is not None}
    return _said(plan, live, ended, [j for j in gone if j not in ended], lacking)


def _array_of(job: str) -> str:
    """What to ask squeue for: an array task's whole array (a pending task is only listed as
    part of its array's pending range)."""
    return job.partition("_")[0]


def _rows_of(rows: Mapping[str, JobInfo], job: str) -> list[JobInfo]:
    """squeue's rows of one job: a plain job, every task of an array, or one array task."""
    array, _, task = job.partition("_")
    if task:
        info = live_task(rows, array, int(task))
        return [] if info is None else [info]
    return [r for r in rows.values() if array in (r.job_id, r.array_job_id)]


def _runs_here(command: str, home: Path) -> bool:
    """True when a job's batch script (squeue's ``Command``) is a script hpc-ddp wrote into
    ``home`` (``job.sbatch``, a sweep's ``job-N.sbatch``); compared as files, so a symlinked
    runs directory is the same place and a copy of the run directory is not."""
    script = Path(command)
    if not command or not script.is_absolute() or not script.name.startswith("job"):
        return False
    try:
        return script.suffix == ".sbatch" and os.path.samefile(script.parent, home)
    except OSError:
        return False


def _state(found: list[JobInfo]) -> str:
    return ", ".join(dict.fromkeys(r.state.value for r in found))


def _accounting(client: SlurmClient, gone: list[str]) -> tuple[Mapping[str, AccountingRecord], str]:
    """sacct's records of the jobs squeue no longer holds, and why one may have none."""
    if not gone:
        return {}, ""
    try:
        records = client.sacct_states(gone)
    except SlurmError as exc:
        return {}, f"sacct could not be asked: {str(exc).splitlines()[0].rstrip('.')}"
    if records is None:
        return {}, "no accounting to ask"
    return records, "sacct has no record of it"


def _accounted(accounting: Mapping[str, AccountingRecord], job: str) -> str | None:
    """sacct's final state of a job squeue no longer holds (an array: of its tasks), or None."""
    mine = [r for key, r in accounting.items() if key == job or _task_of(key, job)]
    states = [r.state.value for r in mine]
    return ", ".join(dict.fromkeys(states)) or None


def _task_of(key: str, array: str) -> bool:
    """True for sacct's record of a task of ``array`` (``123_4``, not a step ``123_4.batch``)."""
    return key.startswith(f"{array}_") and "." not in key


def _not_this_run(plan: Cancel, job: str, command: str) -> Result:
    runs = f"runs {command}" if command else "does not say which script it runs"
    return Result(
        "not_this_run",
        f"{plan.where}: slurm {plan.what} {job} is not this run's: it {runs}, not a script of "
        f"{plan.home.resolve()}; nothing was cancelled. HINT: a copied run directory (cp -r) "
        f"keeps the original's {plan.source.name}, and a hand-edited one may name any job; "
        "cancel the original run by its own directory (`hpc-ddp status` lists the runs), or "
        f"`scancel {job}` if you are sure that job is the one to stop.",
    )


def _said(
    plan: Cancel, live: list[str], ended: dict[str, str], unknown: list[str], lacking: str
) -> Result:
    """The line for a plan whose live jobs were cancelled, and what the others were
    (``lacking``: why the unknown ones have no accounting record)."""
    words = []
    for job, state in ended.items():
        words.append(f"slurm {plan.what} {job} already finished ({state})")
    for job in unknown:
        words.append(f"slurm {plan.what} {job} is unknown to Slurm (not in its queue; {lacking})")
    if live:
        plural = "s" * (len(live) > 1)
        head = f"cancelled slurm {plan.what}{plural} {', '.join(live)} ({plan.where})"
        return Result("cancelled", "; ".join([head, *words]))
    outcome: Outcome = "already_finished" if ended else "unknown"
    return Result(outcome, f"{'; '.join(words)}: nothing was cancelled ({plan.where})")
