"""The local backend's login face: runs go to ``nodes x tasks_per_node`` processes of this
machine, the same runtime in the same run directory as on a Slurm task.

:class:`LocalBackend` answers for them as :class:`~hpc_ddp.backends.base.Backend`: the plan and
its checks (:mod:`~hpc_ddp.backends.local.plan`), the start (a detached controller:
:mod:`~hpc_ddp.backends.local.controller`), the cancel (:mod:`~hpc_ddp.backends.local.stop`),
and what their processes, proven against what they recorded
(:mod:`~hpc_ddp.backends.local.process`), and their tasks' results
(:mod:`~hpc_ddp.backends.local.outcome`) say of them. No queue holds a local job.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.base import (
    Cancel,
    Cancelled,
    Grace,
    PlanRequest,
    Started,
    SubmitPlan,
    Word,
)
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.local.controller import submit_local
from hpc_ddp.backends.local.outcome import local_failure
from hpc_ddp.backends.local.plan import check_local_job, describe_local_plan
from hpc_ddp.backends.local.process import (
    KILL_WAIT_S,
    live_controller,
    live_ranks,
    local_alive,
    unmark_cancelled,
    was_cancelled,
)
from hpc_ddp.backends.local.stop import stop_local
from hpc_ddp.backends.ranklogs import rank_error, rank_logs
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest

if TYPE_CHECKING:
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo


class LocalBackend:
    """Runs go to processes of this machine (:class:`~hpc_ddp.backends.base.Backend`): no
    queue holds them; their processes, proven against what they recorded, say what they do."""

    @property
    def name(self) -> BackendName:
        """``local``."""
        return "local"

    @property
    def ledger_since_submit(self) -> bool:
        """True: a resumed local job starts only once its old ranks are provably gone."""
        return True

    def plan(self, cfg: JobConfig, paths: RunPaths, request: PlanRequest) -> SubmitPlan:
        """No script: submitit's controller starts the processes. Checks that this machine
        can run them (a dry run says so too, rather than show a job that cannot start)."""
        check_local_job(cfg)
        command = (sys.executable, "-m", "submitit.local._local", str(paths.root / "submitit"))
        return SubmitPlan(None, command, describe_local_plan(cfg, paths.root), request)

    def moved(self, plan: SubmitPlan, cfg: JobConfig, paths: RunPaths) -> SubmitPlan:
        """The plan for ``paths``: nothing was rendered, so it is made again."""
        return self.plan(cfg, paths, plan.request)

    def check(self, cfg: JobConfig) -> None:
        """:func:`check_local_job`."""
        check_local_job(cfg)

    def start(self, cfg: JobConfig, paths: RunPaths) -> Started:
        """:func:`submit_local`, after the checks, with an earlier cancel's mark cleared."""
        check_local_job(cfg)
        unmark_cancelled(paths.root)  # a resumed run's earlier cancel is not this one's
        log = paths.rank_log(0, "err")
        # Rank 0's progress goes to its stderr (logging), as on Slurm; a resumed run appends.
        follow_from = log.stat().st_size if log.exists() else 0
        try:
            job = submit_local(cfg, paths)
        except OSError as exc:  # e.g. its submitit folder cannot be made: nothing started
            raise RunDirError(
                f"{paths.root}: the local job could not start: {exc}. HINT: the run "
                "directory must be writable, with no file where it keeps its sub-directories "
                "(submitit/, logs/); fix that and submit (or resume) again."
            ) from None
        command = ("submitit-local", job.job_id)
        return Started(job.job_id, command, handle=job, follow_from=follow_from)

    def test_only(self, paths: RunPaths) -> str:
        """Refused: only Slurm answers whether a job would start."""
        del paths
        raise ConfigError("--test-only asks Slurm; HINT: use --backend slurm on a Slurm cluster.")

    def job_refs(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """None: a local job id is its controller's pid, which no scheduler knows."""
        del run_dir, manifest
        return []

    def states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """None: no queue holds a local job (:meth:`word` says what its processes do)."""
        del job_ids
        return {}

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord] | None:
        """Nothing to account for ({}, not None: no record is missing): no scheduler ran it."""
        del job_ids
        return {}

    def cancel_ids(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """The controller's pid (checked against the run's records by the cancel itself)."""
        del run_dir
        return [manifest.job_id or ""]

    def cancel(self, plan: Cancel, *, kill_wait_s: float | None = None) -> Cancelled:
        """:func:`stop_local`: returns once every process of the run has ended (SIGKILLed
        after ``kill_wait_s``, default :data:`KILL_WAIT_S`, as Slurm's ``KillWait``)."""
        wait = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
        done = stop_local(plan.where, plan.jobs[0], kill_wait_s=wait)
        return Cancelled(done.outcome, done.message)

    def word(self, run_dir: Path, job_id: str) -> Word:
        """Running while its controller or any of its rank processes is (each proven against
        its record, never a bare pid), cancelled once a person cancelled it and everything has
        stopped; and a note for ranks left orphaned."""
        controller = live_controller(run_dir, job_id)
        ranks = live_ranks(run_dir)
        if controller is None and ranks:
            listed = ", ".join(str(r) for r in sorted(ranks))
            orphans = f"the local controller has exited, but rank {listed} still run: "
            return Word(True, False, orphans + f"`hpc-ddp cancel {run_dir}` stops them")
        if controller is not None:
            return Word(True, False)
        return Word(False, was_cancelled(run_dir))

    def settled(self, run_dir: Path, job_id: str) -> bool:
        """True once neither its controller nor a rank runs: its ledger may say finished a
        moment before its processes have exited."""
        return not local_alive(run_dir, job_id)

    def partition_nodes(self, partition: str | None) -> tuple[str, list[str]] | None:
        """None: a local run has this machine alone, no node to leave out."""
        del partition
        return None

    def preemption_grace(self, partition: str | None, qos: str | None) -> Grace | None:
        """None: nothing preempts a local run."""
        del partition, qos
        return None

    def startup_failure(self, run_dir: Path, job_id: str | None) -> str | None:
        """What its tasks reported in their result files (exactly, per rank), else the lowest
        rank whose ``rank-N.err`` ends in an error (no launcher of its own writes a log)."""
        found = local_failure(run_dir, job_id) if job_id else None
        if found:
            return found
        try:
            return rank_error(rank_logs(RunPaths(run_dir).logs))
        except OSError:
            return None

    def running(self, run_dir: Path, job_id: str | None, source: str) -> tuple[bool, str]:
        """(True, ``local job 123 is running``) while its controller or a rank runs."""
        del source
        alive = local_alive(run_dir, job_id)
        return alive, f"local job {job_id} is running" if alive else ""
