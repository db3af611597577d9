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

A local run's job id is a pid, and pids are reused: it is signalled only while the local backend
proves the process under it is still that run's own, and that its command line names this run
directory. A local cancel returns once every process of the run has ended: what ignores the
SIGTERM is SIGKILLed after a grace (:func:`default_kill_wait`, as Slurm's ``KillWait``).

``hpc-ddp cancel``, :meth:`hpc_ddp.Job.cancel` and :meth:`hpc_ddp.Sweep.cancel` all cancel
through :func:`cancel_targets`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.api.targets import (
    find_array_task,
    point_task,
    resolve_targets,
    sweep_task_of,
)
from hpc_ddp.backends.base import Cancel, Outcome
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.jobs import is_job_ref
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.errors import TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE
from hpc_ddp.rundir.manifest import read_manifest


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
class CancelResult:
    """What cancelling one target came to: one object of ``hpc-ddp cancel --json``."""

    run_dir: Path
    """The run, sweep or sweep task directory."""
    backend: BackendName
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
    backends: Registry | None,
    kill_wait_s: float | None = None,
) -> Iterator[CancelResult]:
    """Cancel every target (run, sweep or sweep task directories, job ids, ``ARRAYJOB_TASK``),
    yielding what each came to as it is done; a cancelled job is never requeued by hpc-ddp.

    Every target is resolved, and every job id checked, before the first is cancelled: a
    wrong target raises (:class:`TargetError`, :class:`RunDirError`) and nothing is cancelled.
    ``runs_dir`` is where job ids are looked up. Each run's backend cancels it
    (:meth:`~hpc_ddp.backends.base.Backend.cancel`, of ``backends``; None: the real ones): a
    local run is waited for until every process of it has ended, SIGKILLed after
    ``kill_wait_s`` (default :func:`default_kill_wait`, as Slurm's ``KillWait``).
    """
    registry = registry_of(backends)
    check_targets(targets)
    plans = [plan for t in targets for plan in plan_cancel(t, runs_dir)]
    for plan in plans:
        if plan.what == "sweep":  # a local sweep's controller, which starts its points
            result = registry.sweeps(plan.backend).cancel(plan.where)
        else:
            result = registry.backend(plan.backend).cancel(plan, kill_wait_s=kill_wait_s)
        yield CancelResult(plan.where, plan.backend, plan.jobs, result.outcome, result.message)


def default_kill_wait() -> float:
    """How long a cancel of a local run gives its processes after the SIGTERM before it
    SIGKILLs those left (``cancel --kill-wait``'s default): the local backend's, as Slurm's
    ``KillWait``."""
    wait = Registry().kill_wait_s("local")
    assert wait is not None  # the local backend's own processes: it always has one
    return wait


def plan_cancel(target: str, runs_dir: Path) -> list[Cancel]:
    """What ``target`` cancels; raises (before anything is cancelled) if any id is wrong."""
    path = Path(target)
    task = sweep_task_of(path)  # a task's directory, or the path of one not started yet
    if task is not None and (path / MANIFEST_FILE).exists():  # a local sweep's point: a run
        manifest = read_manifest(path)
        return [Cancel(path, path / MANIFEST_FILE, (manifest.job_id or "",), "job", "local")]
    if task is not None or (not path.is_dir() and "_" in target):
        found = point_task(*task) if task is not None else find_array_task(target, runs_dir)
        where = path if task is not None else found.sweep_dir / "tasks" / str(found.point)
        return [Cancel(where, found.source, (found.ref,), "array task")]
    plans = []
    for run_dir in resolve_targets([target], runs_dir):
        manifest = read_manifest(run_dir)
        jobs = Registry().backend(manifest).cancel_ids(run_dir, manifest)  # each checked
        # A sweep no job array runs is run by a sweep controller (a Slurm sweep has arrays).
        sweep = (run_dir / "tasks").is_dir() and not manifest.array_jobs
        what = "job array" if manifest.array_jobs else "sweep" if sweep else "job"
        plans.append(Cancel(run_dir, run_dir / MANIFEST_FILE, tuple(jobs), what, manifest.backend))
    return plans
