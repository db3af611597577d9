"""Cancelling a run's Slurm jobs: ``scancel`` of each live one, once squeue shows that every
job of the run runs a script of this run (a copied or hand-edited run directory may name any
job), and what the others came to (squeue, else sacct)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpc_ddp.backends.arrays import live_task
from hpc_ddp.backends.base import Cancel, Cancelled, Outcome
from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.errors import SlurmError


def cancel_jobs(client: SlurmClient, plan: Cancel) -> Cancelled:
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


def _not_this_run(plan: Cancel, job: str, command: str) -> Cancelled:
    runs = f"runs {command}" if command else "does not say which script it runs"
    return Cancelled(
        "not_this_run",
        f"{plan.where}: slurm {plan.what} {job} is not this run's: it {runs}, not a script of "
        f"{plan.home.resolve()}; nothing was cancelled. HINT: a copied run directory (cp -r) "
        f"keeps the original's {plan.source.name}, and a hand-edited one may name any job; "
        "cancel the original run by its own directory (`hpc-ddp status` lists the runs), or "
        f"`scancel {job}` if you are sure that job is the one to stop.",
    )


def _said(
    plan: Cancel, live: list[str], ended: dict[str, str], unknown: list[str], lacking: str
) -> Cancelled:
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
        return Cancelled("cancelled", "; ".join([head, *words]))
    outcome: Outcome = "already_finished" if ended else "unknown"
    return Cancelled(outcome, f"{'; '.join(words)}: nothing was cancelled ({plan.where})")
