"""``hpc-ddp cancel RUN_DIR | SWEEP_DIR | SWEEP_DIR/tasks/N | JOB_ID | ARRAYJOB_TASK ...``:
cancel runs' Slurm jobs (local: stop the tasks).

A sweep directory cancels every job array of the sweep; ``SWEEP_DIR/tasks/N`` (or the task's
``ARRAYJOB_TASK``, e.g. ``1001_3``) cancels the one array task that runs point N now. Every
target is resolved, and every job id checked, before anything is cancelled: a damaged manifest
(``"job_id": "--me"`` would be ``scancel --me``, every job of the user) cancels nothing.

A local run's job id is a pid, and pids are reused: it is signalled only while
:mod:`hpc_ddp.local.process` proves the process under it is still that run's own.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.cli.runs import (
    find_array_task,
    manifest_jobs,
    point_task,
    resolve_targets,
    sweep_task_of,
)
from hpc_ddp.errors import RunDirError, SlurmError, TargetError
from hpc_ddp.launch.submission import runs_dir_from
from hpc_ddp.layout import MANIFEST_FILE, RUNS_DIR_ENV
from hpc_ddp.local.process import cancel_local
from hpc_ddp.manifest import read_manifest
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.jobstate import is_job_ref


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "targets",
        nargs="+",
        help="run directories, sweep directories (every array), sweep task directories "
        "(SWEEP_DIR/tasks/N), job ids or array tasks (1234_5)",
    )
    parser.add_argument("--runs-dir", help=f"where to look for job ids (default ${RUNS_DIR_ENV})")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per line, one per target"
    )


def check_targets(targets: list[str]) -> None:
    """Refuse a target that is neither an existing directory nor a well-formed job id."""
    for t in targets:
        if not Path(t).is_dir() and not is_job_ref(t):
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


def run(args: argparse.Namespace) -> int:
    """Cancel every target; a cancelled job is never requeued by hpc-ddp.

    Exit 0 when every target was cancelled or had already ended.
    """
    check_targets(args.targets)
    runs_dir = runs_dir_from(args.runs_dir, os.environ)
    plans = [plan for t in args.targets for plan in plan_cancel(t, runs_dir)]
    for plan in plans:
        if plan.local:
            message = cancel_local(plan.where, plan.jobs[0])
        else:
            message = cancel_slurm(args.slurm, plan)
        if args.json:
            shown = {
                "run_dir": str(plan.where),
                "backend": "local" if plan.local else "slurm",
                "jobs": list(plan.jobs),
                "message": message,
            }
            print(json.dumps(shown))
        else:
            print(message)
    return 0


def plan_cancel(target: str, runs_dir: Path) -> list[Cancel]:
    """What ``target`` cancels; raises (before anything is cancelled) if any id is wrong."""
    path = Path(target)
    task = sweep_task_of(path) if path.is_dir() else None
    if task is not None or (not path.is_dir() and "_" in target):
        found = point_task(*task) if task is not None else find_array_task(target, runs_dir)
        where = path if task is not None else found.sweep_dir / "tasks" / str(found.point)
        return [Cancel(where, found.source, (found.ref,), "array task")]
    plans = []
    for run_dir in resolve_targets([target], runs_dir):
        manifest = read_manifest(run_dir)
        if manifest.backend == "local":
            source = run_dir / MANIFEST_FILE
            plans.append(Cancel(run_dir, source, (manifest.job_id or "",), local=True))
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


def cancel_slurm(client: SlurmClient, plan: Cancel) -> str:
    """``scancel`` each job of ``plan`` (every array of a sweep, even when one of them cannot
    be cancelled); a line saying what was done."""
    failed: list[SlurmError] = []
    for job in plan.jobs:
        try:
            client.cancel(job, source=str(plan.source))
        except SlurmError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]
    plural = "s" * (len(plan.jobs) > 1)
    return f"cancelled slurm {plan.what}{plural} {', '.join(plan.jobs)} ({plan.where})"
