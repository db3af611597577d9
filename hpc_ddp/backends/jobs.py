"""The words every backend answers in about jobs: ids, states, queue rows, accounting (pure).

The login side (:mod:`hpc_ddp.state`, :mod:`hpc_ddp.submission`, :mod:`hpc_ddp.sweep`) reads
these types whichever backend a run went to (:class:`hpc_ddp.backends.base.Backend`'s
``states`` and ``accounting``); each backend maps its scheduler's own output to them (Slurm's
parsers: :mod:`hpc_ddp.backends.slurm.jobstate`). The states are Slurm's words, the first
backend's: ``status`` and ``--json`` show them, so another backend maps its states to these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum

from hpc_ddp.frozen import dataclass

JOB_REF = re.compile(r"[1-9][0-9]*(?:_(?:0|[1-9][0-9]*))?")
"""A job id as hpc-ddp stores and sends it: a job or array job (``123``; a local run's is its
controller's pid), or one task of an array (``123_4``). Nothing else is ever passed to a
scheduler's commands: ``--me``, ``1,2,3`` or ``123_[1-9]`` in a damaged manifest would widen
the command to other jobs."""


def is_job_ref(text: object) -> bool:
    """True for a string in :data:`JOB_REF`'s form."""
    return isinstance(text, str) and JOB_REF.fullmatch(text) is not None


class JobState(str, Enum):
    """A job's state, in Slurm's words (``squeue``, ``sacct``, ``scontrol``): the words every
    backend answers in, and ``status`` shows."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    SUSPENDED = "SUSPENDED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    RESIZING = "RESIZING"
    CONFIGURING = "CONFIGURING"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        """The job will not run again unless someone requeues it by hand."""
        return self in _FINISHED


_FINISHED = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
     JobState.PREEMPTED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.BOOT_FAIL,
     JobState.DEADLINE, JobState.REVOKED}
)  # fmt: skip


@dataclass(frozen=True)
class JobInfo:
    """What a scheduler's queue holds of a job (one row of squeue): a job, or one task (or
    pending range) of an array job."""

    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    """Task index, or ``[2-19%2]`` for the array's still-pending range."""
    state: JobState
    reason: str
    nodes: str
    elapsed_s: int | None
    restart_count: int
    command: str = ""
    """The batch script's path as Slurm holds it (``""`` when unknown or ``--wrap``)."""

    @property
    def ref(self) -> str:
        """How Slurm names it: ``123``, ``120_3`` or ``120_[4-9%2]``."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


@dataclass(frozen=True)
class AccountingRecord:
    """What a scheduler's accounting keeps of an ended job (one line of sacct): a job, an array
    task or a step (``123.batch``, ``123.0``).

    One job id may have several lines (``sacct -D``): one per run of a requeued job (the earlier
    ones ``REQUEUED``, ``PREEMPTED`` or ``NODE_FAIL``), and one per job where the cluster's ids
    started again (a controller that lost its state). The record keyed by the id is the newest
    (:func:`hpc_ddp.backends.slurm.jobstate.parse_sacct`); :attr:`earlier` holds the others."""

    job_id: str
    state: JobState
    raw_state: str
    """sacct's text, e.g. ``CANCELLED by 1000``."""
    exit_code: str
    elapsed_s: int | None
    submitted: str = ""
    """sacct's ``Submit`` (``2026-11-24T06:04:02``, the cluster's local time); a requeued
    run's is when it was queued again."""
    submit_line: str = ""
    """sacct's ``SubmitLine``: the ``sbatch`` command line, the script's path last."""
    earlier: tuple[AccountingRecord, ...] = ()
    """The other lines of this job id, newest first."""

    def submitted_with(self, scripts: Sequence[str]) -> AccountingRecord | None:
        """The newest line of this job id (this one or an earlier one) whose ``sbatch`` ran one
        of ``scripts`` (absolute paths), or None: a job id the cluster gave again names another
        job, and sacct's newest line for it may be that job's. A line without a command line
        (an older Slurm's) may be anyone's and counts as a match."""
        for record in (self, *self.earlier):
            line = record.submit_line
            if not line or any(line == s or line.endswith(f" {s}") for s in scripts):
                return record
        return None
