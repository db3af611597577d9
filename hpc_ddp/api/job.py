"""One run from Python: submit it, resume it, watch it, read its metrics and logs, cancel it.

::

    import hpc_ddp

    job = hpc_ddp.submit("jobs/quickstart.yaml", {"train.lr": 0.1})
    status = job.wait()          # RunFailedError (with the reason lines) unless it completed
    rows = job.metrics()         # metrics.jsonl, each step once

A :class:`Job` is its run directory, its job id and its backend, nothing more: everything else
is read from the run directory and from Slurm when asked, so ``Job.from_run_dir(path)`` in a
new process (a notebook restarted, another login node) is the same job. The ``submit`` and
``resume`` verbs are :func:`plan_submit` / :func:`plan_resume` (what ``--dry-run`` shows) and
:func:`launch` here; every verb's errors are the same :class:`~hpc_ddp.errors.HpcDdpError`\\ s,
with the same hints. Nothing here imports torch, torchvision or submitit on a login node (a
local run's processes import what they need).

Every function takes ``backends=``, the :class:`~hpc_ddp.backends.registry.Registry` its runs'
backends come from (None: the real ones, Slurm's commands on PATH); tests pass
``Registry(FakeSlurm().client())`` (:class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`), as
``hpc_ddp.cli.main.main(argv, backends=)`` does. The public functions also take ``slurm=``, a
Slurm client alone: the older, deprecated spelling of ``backends=Registry(slurm)``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_ddp.api.arguments import Overrides, override_args, path_arg
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import ConfigError, RunFailedError, TargetError
from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.submission.submit import Launched, Prepared

if TYPE_CHECKING:
    from hpc_ddp.api.cancel import CancelResult
    from hpc_ddp.api.status import RunStatus, SweepStatus
    from hpc_ddp.backends.base import Backend
    from hpc_ddp.backends.catalog import BackendName
    from hpc_ddp.backends.registry import SlurmClient
    from hpc_ddp.config.leadtime import LeadTime
    from hpc_ddp.lemons.record import Exclusion
    from hpc_ddp.submission.resume import ResumePlan

log = logging.getLogger(__name__)

# Reading runs back (api.status, api.targets, api.cancel, api.logs, the manifest) and resuming
# them are imported where they are used: a submit, on a login node, pays for none of it.

BackendChoice = str
"""``auto`` or a backend's name (:func:`hpc_ddp.backends.catalog.backend_names`): where a
run's processes go; ``auto``: the first backend whose login command is on PATH (``sbatch``:
Slurm), else processes of this machine."""

PYTHON_CONFIG = "<JobConfig from Python>"
"""What a run submitted from a :class:`JobConfig` object records as its config's source; a
relative ``slurm.template`` is then looked up from the working directory."""


# --- the job ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A submitted run: its directory, its current job id and its backend.

    Rebuild one anywhere from the run directory alone with :meth:`from_run_dir`. The methods
    read the run directory and ask Slurm each time; none of them caches.
    """

    run_dir: Path
    job_id: str
    """The Slurm job id (a local run: its controller's pid; a sweep task: ``ARRAYJOB_TASK``;
    empty for a sweep point never submitted)."""
    backend: BackendName
    """``slurm`` or ``local``."""
    index: int | None = None
    """The sweep point, for a task of a :class:`~hpc_ddp.api.sweep.Sweep`."""
    backends: Registry = field(default_factory=Registry, compare=False, repr=False)
    """The backends its methods ask (default: the real ones)."""
    launched: Launched | None = field(default=None, compare=False, repr=False)
    """The launch record when this process started the job (a local run's processes among
    it); None for a job rebuilt from its run directory."""

    @classmethod
    def from_run_dir(
        cls,
        path: str | Path,
        *,
        backends: Registry | None = None,
        slurm: SlurmClient | None = None,
    ) -> Job:
        """The job of a run directory (or of a sweep task's, ``SWEEP_DIR/tasks/N``), read from
        its files: no pickles, nothing kept from the process that submitted it. ``backends``
        (or, deprecated, ``slurm``): what its methods ask.

        A path that is no run directory is a :class:`~hpc_ddp.errors.TargetError` (a sweep's:
        use :meth:`hpc_ddp.Sweep.from_dir`).
        """
        from hpc_ddp.api.targets import point_task, require_dir, sweep_task_of
        from hpc_ddp.rundir.manifest import read_manifest

        registry = registry_of(backends, slurm)
        path = Path(path)
        # A sweep task that has not started has no directory yet: its Job says it is pending.
        task = None if (path / MANIFEST_FILE).exists() else sweep_task_of(path)
        if task is not None:
            return cls(path, point_task(*task).ref, "slurm", index=task[1], backends=registry)
        require_dir(str(path))
        if (path / "tasks").is_dir() and (path / MANIFEST_FILE).exists():
            raise TargetError(
                f"{path} is a sweep directory, not one run. HINT: hpc_ddp.Sweep.from_dir"
                f"({str(path)!r}), or one of its tasks: Job.from_run_dir('{path}/tasks/N')."
            )
        manifest = read_manifest(path)  # no manifest.json: a RunDirError with its hint
        return cls(path, manifest.job_id or "", manifest.backend, backends=registry)

    @property
    def paths(self) -> RunPaths:
        """What is where in the run directory (logs, checkpoints, ``metrics.jsonl``, ...)."""
        return RunPaths(self.run_dir)

    def status(self) -> RunStatus:
        """Where the run stands, as ``hpc-ddp status RUN_DIR`` shows it (a sweep task: its row
        of the sweep's table, ``state`` ``finished``, ``failed``, ``running`` ...)."""
        from hpc_ddp.api.status import RunStatus, collect_status

        [found] = collect_status([str(self.run_dir)], self.run_dir.parent, self.backends)
        return found if isinstance(found, RunStatus) else _task_status(found)

    def wait(
        self, timeout: float | None = None, *, check: bool = True, poll_s: float | None = None
    ) -> RunStatus:
        """Wait until the run has ended, and return its status.

        A run that did not complete (FAILED, CANCELLED, TIMEOUT, INCOMPLETE, ...) raises
        :class:`~hpc_ddp.errors.RunFailedError` carrying the status and the reason lines
        ``status`` prints, unless ``check`` is False. Past ``timeout`` seconds a
        :class:`~hpc_ddp.errors.WaitTimeoutError`; the job goes on. The looks start 0.5 s apart
        and back off to one every 15 s (``poll_s`` fixes the pause instead). A requeued job is
        waited for through its requeues.
        """
        from hpc_ddp.api.status import wait_until_ended

        done = wait_until_ended(
            self.status, timeout=timeout, what=str(self.run_dir), poll_s=poll_s,
            between=self._reap, settled=self._exited,
        )  # fmt: skip
        if check and not done.succeeded:
            raise run_failed(done)
        return done

    def _reap(self) -> None:
        """Collect a local controller this process started once it has exited (else it would
        linger as a zombie until this process ends)."""
        local = None if self.launched is None else self.launched.local
        if local is not None:
            local.handle.done()

    def _exited(self) -> bool:
        """True unless a local run's controller or a rank still runs: its ledger may say
        finished a moment before its processes have exited, and the wait waits for those."""
        return self.backends.backend(self.backend).settled(self.run_dir, self.job_id)

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` that count, in order: a step logged again after a
        resume is there once, from the attempt that counts (as ``status`` and ``results`` read
        it); a torn last line is left out. [] before the first row."""
        from hpc_ddp.sweep.results import read_metrics

        return read_metrics(self.paths.metrics)

    def logs(
        self, *, rank: int = 0, stream: Literal["err", "out"] = "err", batch: bool = False
    ) -> str:
        """A log's text as it is now: ``rank``'s stderr (hpc-ddp's progress and tracebacks),
        its stdout (``stream="out"``: what the script printed), or the batch script's
        (``batch``)."""
        from hpc_ddp.api.logs import read_log

        return read_log(self.paths, rank=rank, stream=stream, batch=batch)

    def cancel(self) -> CancelResult:
        """Cancel the job as ``hpc-ddp cancel RUN_DIR`` does; ``.outcome`` says what came of it
        (``cancelled``, ``already_finished``, ``unknown`` to Slurm, ``not_this_run``: the job
        id names a job of another directory, and nothing was signalled; or ``still_running``: a
        local run's process outlived SIGTERM and SIGKILL). A local run is waited for until
        every process of it has ended (SIGKILL after ``KILL_WAIT_S``, as Slurm's KillWait)."""
        from hpc_ddp.api.cancel import cancel_targets

        [result] = cancel_targets(
            [str(self.run_dir)], runs_dir=self.run_dir.parent, backends=self.backends
        )
        return result

    def resume(
        self, overrides: Overrides = (), *, force: bool = False, elastic: bool = False
    ) -> Job:
        """:func:`resume` this run (its new job, in the same run directory)."""
        return resume(self.run_dir, overrides, force=force, elastic=elastic, backends=self.backends)


def _task_status(entry: SweepStatus) -> RunStatus:
    """A sweep task's status: its row of the sweep's table, in a :class:`RunStatus`."""
    from hpc_ddp.api.status import RunStatus

    task: Mapping[str, Any] = (
        entry.tasks[0] if entry.tasks else {"index": entry.task, "state": "unknown"}
    )
    run = str(task.get("run_dir") or Path(entry.sweep, "tasks", str(entry.task)))
    cause = task.get("last_cause")
    return RunStatus(
        run=run, job=task.get("job_id"), backend="slurm", state=str(task["state"]), nodes=None,
        elapsed_s=None, attempts=task.get("attempts"), causes=(cause,) if cause else (),
        ckpt_step=None, loss=task.get("loss"), failed_rank=None, note=None,
    )  # fmt: skip


def run_failed(status: RunStatus) -> RunFailedError:
    """The error for a run waited on that did not complete: its state and reason lines."""
    why = "".join(f"\n  {line}" for line in status.reasons)
    return RunFailedError(
        f"{status.run} ended {status.state}{why or ' (no reason recorded)'}. HINT: "
        f"`hpc-ddp status {status.run} --attempts` and `hpc-ddp logs {status.run}` say more; "
        "hpc_ddp.resume(run_dir) goes on from its newest checkpoint.",
        status=status,
        reasons=status.reasons,
    )


# --- submitting ---------------------------------------------------------------------------------


def plan_submit(
    config: str | Path | JobConfig,
    overrides: Overrides = (),
    *,
    backend: BackendChoice = "auto",
    runs_dir: str | Path | None = None,
    site: str | Path | None = None,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
    invocation: Sequence[str] | None = None,
    for_test_only: bool = False,
) -> Prepared:
    """Everything :func:`submit` would write and run, checked, and nothing written or run:
    ``.script`` and ``.sbatch_argv`` (Slurm), ``.paths.root`` (where the run would go),
    ``.cfg`` (the resolved config). What ``hpc-ddp submit --dry-run`` shows.

    ``config`` is a job file (layered over the site profile: ``site``, else
    ``$HPC_DDP_SITE``, else ``$XDG_CONFIG_HOME/hpc-ddp/site.yaml``) or a :class:`JobConfig`
    (taken as it is). ``backend`` ``auto`` is Slurm when ``sbatch`` is on PATH, else local
    processes. ``runs_dir``: else ``$HPC_DDP_RUNS_DIR``, else ``./runs``. ``invocation`` is
    the command recorded in the script's header. ``for_test_only``: the plan is for
    :func:`sbatch_test_only` (which asks Slurm, so a local backend is refused). ``backends``
    (or, deprecated, ``slurm``) plans it and is asked nothing: planning is pure.
    """
    from hpc_ddp.backends.catalog import is_scheduler
    from hpc_ddp.config.preflight import preflight_job
    from hpc_ddp.submission.submit import choose_backend, prepare, runs_dir_from

    runs_dir = path_arg("runs_dir", runs_dir)  # checked first: nothing is read before
    args = override_args(overrides)
    cfg, config_path = _job_config(config, args, site)
    preflight_job(cfg, str(config_path))  # what would fail on the nodes, checked from here
    chosen = choose_backend(backend)
    if for_test_only and not is_scheduler(chosen):
        raise ConfigError("--test-only asks Slurm; HINT: use --backend slurm on a Slurm cluster.")
    shown = str(config) if not isinstance(config, JobConfig) else PYTHON_CONFIG
    planned_runs = runs_dir_from(None if runs_dir is None else str(runs_dir), os.environ)
    if cfg.command is not None:
        warn_of_leftovers(planned_runs, Path.cwd())
    face = registry_of(backends, slurm).backend(chosen)
    return prepare(
        cfg,
        backend=face,
        lemons=_lemons(cfg, face),
        grace=_grace(cfg, face),
        config_path=config_path,
        runs_dir=planned_runs,
        python=sys.executable,
        invocation=invocation or ["hpc_ddp.submit", shown, *args],
    )


def _lemons(cfg: JobConfig, face: Backend) -> Exclusion | None:
    """The lemon nodes this submission leaves out (:mod:`hpc_ddp.lemons`)."""
    import time

    from hpc_ddp.submission.exclusion import lemon_exclusion

    return lemon_exclusion(cfg, face, os.environ, time.time())


def _grace(cfg: JobConfig, face: Backend) -> str | None:
    """The warning of a preemption grace time too short for this user's measured stop."""
    import time

    from hpc_ddp.submission.leadtime import check_grace

    return check_grace(cfg, face, os.environ, time.time())


def warn_of_leftovers(runs_dir: Path, workdir: Path) -> None:
    """Warn when earlier runs' programs left files in ``workdir``, where a ``command`` runs: a
    program that loads a relative snapshot at start would continue that run, not start
    afresh (:mod:`hpc_ddp.rundir.workdir_files`)."""
    from hpc_ddp.rundir.workdir_files import leftovers

    found = leftovers(runs_dir, workdir)
    if not found:
        return
    shown = ", ".join(f"{f.name} (run {f.run_dir.name})" for f in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    log.warning(
        "command: this run starts in %s, where earlier runs' programs left %s%s: a program "
        "that loads such a file at start (a relative snapshot path) continues that run instead "
        "of starting afresh. HINT: move or delete them, or have the program keep its files in "
        "its own run directory ($HPC_DDP_RUN_DIR).",
        workdir,
        shown,
        more,
    )


def _job_config(
    config: str | Path | JobConfig, overrides: Sequence[str], site: str | Path | None
) -> tuple[JobConfig, Path]:
    """The job's config, with the overrides, and the path its source is known by."""
    from hpc_ddp.config.load import (
        apply_overrides,
        find_site_profile,
        job_config_from_dict,
        job_config_to_dict,
        load_job_config,
    )

    if isinstance(config, JobConfig):
        if not overrides:
            return config, Path(PYTHON_CONFIG)
        data = apply_overrides(job_config_to_dict(config), overrides)
        return job_config_from_dict(data, f"{PYTHON_CONFIG} (with overrides)"), Path(PYTHON_CONFIG)
    path = Path(path_arg("config", config) or "")
    profile = find_site_profile(path_arg("site", site), os.environ, Path.home())
    return load_job_config(path, overrides, site_profile=profile), path


def launch(
    planned: Prepared | ResumePlan,
    *,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
) -> Job:
    """Start a planned submission (:func:`plan_submit`) or resume (:func:`plan_resume`) and
    return its job: the run directory is written (a new one is claimed atomically, never one
    another submission holds) and the job started on its backend (of ``backends``, or,
    deprecated, ``slurm``'s) and recorded."""
    registry = registry_of(backends, slurm)
    if isinstance(planned, Prepared):
        from hpc_ddp.submission.submit import launch as launch_prepared

        for line in planned.lemons.lines() if planned.lemons is not None else ():
            log.warning("%s", line)
        if planned.lead is not None:
            log.info("%s", planned.lead.describe())
        if planned.grace is not None:
            log.warning("%s", planned.grace)

        launched = launch_prepared(_on(planned, registry))
    else:
        from hpc_ddp.submission.resume import resume as resume_planned

        planned = dataclasses.replace(planned, prepared=_on(planned.prepared, registry))
        lemons = planned.prepared.lemons
        for line in lemons.lines() if lemons is not None else ():
            log.warning("%s", line)
        launched = resume_planned(planned, registry)
    backend = launched.prepared.backend
    return Job(launched.paths.root, launched.job_id, backend, backends=registry, launched=launched)


def sbatch_test_only(prepared: Prepared, *, backends: Registry | None = None) -> str:
    """``sbatch --test-only`` for a planned submission: Slurm's word on whether and when it
    would start. Nothing is submitted (the run directory sbatch reads is removed again)."""
    from hpc_ddp.submission.submit import test_only as ask

    return ask(_on(prepared, registry_of(backends)))


def _on(prepared: Prepared, backends: Registry) -> Prepared:
    """``prepared`` started through ``backends``' backend (the one a launch is given)."""
    return dataclasses.replace(prepared, face=backends.backend(prepared.backend))


def follow(job: Job) -> int:
    """What ``--wait`` does after a submit or resume this process started: print the job's
    state as it changes until the run has ended; its exit code (0 when it completed)."""
    from hpc_ddp.submission.wait import wait_for  # the run's state: not needed to submit it

    assert job.launched is not None, "follow() a job this process started"
    return wait_for(job.launched, job.backends)


def dry_run_json(planned: Prepared | ResumePlan) -> dict[str, object]:
    """``submit --dry-run --json`` (and ``resume``'s, which adds where the run stands): the
    backend's plan (:class:`~hpc_ddp.backends.base.SubmitPlan`), the script it would write
    and the command it would run, else its plan in words (schema ``hpc-ddp.submit/1``)."""
    from hpc_ddp.output import SUBMIT, document

    if isinstance(planned, Prepared):
        plan = planned.plan
        shown: dict[str, object] = {
            "schema": SUBMIT,
            "dry_run": True,
            "backend": planned.backend,
            "run_dir": str(planned.paths.root),
            "command": list(plan.command),
        }
        if plan.script is None:  # nothing rendered: the plan in words
            shown["plan"] = plan.summary.removeprefix("# ")
        else:
            shown["script"] = plan.script
        if planned.lemons is not None and planned.lemons.lemons:
            shown["lemons"] = planned.lemons.to_dict()
        if planned.lead is not None:
            shown["lead_time"] = _lead_json(planned.lead)
        if planned.grace is not None:
            shown["grace_warning"] = planned.grace
        return shown
    prepared = planned.prepared
    shown = {
        "dry_run": True,
        "backend": prepared.backend,
        "run_dir": str(planned.run_dir),
        "state": planned.state,
        "attempts": planned.attempts,
        "checkpoint_step": planned.checkpoint_step,
        "changes": list(planned.changes),
    }
    launch_plan = prepared.plan
    if launch_plan.script is None:  # nothing rendered: the plan in words
        shown["plan"] = launch_plan.summary.removeprefix("# ")
    else:
        shown.update(command=list(launch_plan.command), script=launch_plan.script)
    if prepared.lemons is not None and prepared.lemons.lemons:
        shown["lemons"] = prepared.lemons.to_dict()
    return document(SUBMIT, shown)


def _lead_json(lead: LeadTime) -> dict[str, object]:
    """What ``requeue.lead_time: auto`` chose, for ``--json``."""
    return {
        "seconds": lead.seconds,
        "source": lead.source,
        "saves": lead.saves,
        "slowest_s": lead.slowest_s,
        "bound": lead.bound,
    }


def submit(
    config: str | Path | JobConfig,
    overrides: Overrides = (),
    *,
    backend: BackendChoice = "auto",
    runs_dir: str | Path | None = None,
    site: str | Path | None = None,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
) -> Job:
    """Submit a job, as ``hpc-ddp submit CONFIG KEY=VALUE ...`` does, and return it.

    ``config``: a job file (``jobs/quickstart.yaml``) or a :class:`JobConfig`; ``overrides``:
    ``{"train.lr": 0.1}`` or ``["train.lr=0.1"]``. ``backend``: ``auto`` (Slurm when
    ``sbatch`` is on PATH, else local processes), ``slurm`` or ``local``. ``runs_dir``: where
    the run directory goes (else ``$HPC_DDP_RUNS_DIR``, else ``./runs``). ``site``: the site
    profile (else ``$HPC_DDP_SITE``, else ``$XDG_CONFIG_HOME/hpc-ddp/site.yaml``).
    ``backends``: the :class:`~hpc_ddp.backends.registry.Registry` to submit through (default:
    the real backends); ``slurm``, a Slurm client alone, is its deprecated older spelling.

    A bad config is a :class:`~hpc_ddp.errors.ConfigError` naming the key, with a hint, and
    nothing is written; a refused submission a :class:`~hpc_ddp.errors.SubmissionError`.
    """
    registry = registry_of(backends, slurm)
    prepared = plan_submit(
        config, overrides, backend=backend, runs_dir=runs_dir, site=site, backends=registry
    )
    return launch(prepared, backends=registry)


# --- resuming -----------------------------------------------------------------------------------


def plan_resume(
    run_dir: str | Path,
    overrides: Overrides = (),
    *,
    force: bool = False,
    elastic: bool = False,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
    invocation: Sequence[str] | None = None,
) -> ResumePlan:
    """Check that a run may be resumed now and prepare its job again, in its run directory;
    nothing is written or submitted (``hpc-ddp resume --dry-run``). The plan says where the
    run stands (``.state``, ``.attempts``), the checkpoint it would go on from
    (``.checkpoint_step``) and what the overrides change (``.changes``)."""
    from hpc_ddp.submission.resume import plan_resume as plan

    args = override_args(overrides)
    shown = str(run_dir)
    return plan(
        Path(run_dir),
        tuple(args),
        registry_of(backends, slurm),
        force=force,
        elastic=elastic,
        invocation=invocation or ["hpc_ddp.resume", shown, *args],
    )


def resume(
    run_dir: str | Path,
    overrides: Overrides = (),
    *,
    force: bool = False,
    elastic: bool = False,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
) -> Job:
    """Submit a stopped run's job again, in its run directory, to go on from its newest good
    checkpoint (as ``hpc-ddp resume RUN_DIR KEY=VALUE ...`` does); returns the new job.
    ``elastic``: at another world size, with the same global batch (``--elastic``).

    For a run that crashed, was cancelled, ran out of requeues or was lost with its node. A
    run still queued or running is refused (:class:`~hpc_ddp.errors.TargetError`: two jobs
    must never share a run directory); a finished one, or one whose state Slurm could not
    confirm, needs ``force`` (e.g. ``{"train.max_steps": 2000}, force=True`` trains further).
    Overrides apply over the run's resolved config; its name cannot change. ``backends`` (or,
    deprecated, ``slurm``) as for :func:`submit`.
    """
    registry = registry_of(backends, slurm)
    plan = plan_resume(run_dir, overrides, force=force, elastic=elastic, backends=registry)
    return launch(plan, backends=registry)
