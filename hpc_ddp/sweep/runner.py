"""How a sweep's points run on a backend: the face each backend's sweep runner shows.

On Slurm a sweep is job arrays (:mod:`hpc_ddp.backends.slurm.sweeps`, ``arrays.json``); on the
local backend a sweep controller on this machine starts each point as a local run
(:mod:`hpc_ddp.backends.local.sweeps`). The backends' login faces
(:mod:`hpc_ddp.backends.base`) sit below the sweep layer and know no sweep, so what differs is
a :class:`SweepRunner`, which each backend implements beside its own code, above this layer;
the registry (:class:`hpc_ddp.backends.registry.Registry`) picks the one a sweep's manifest
names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hpc_ddp.backends.arrays import ArrayRecord, PreparedArray
    from hpc_ddp.backends.base import Cancelled
    from hpc_ddp.backends.catalog import BackendName
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
    from hpc_ddp.errors import TargetError
    from hpc_ddp.rundir.attempt import Attempt
    from hpc_ddp.state.task import TaskState
    from hpc_ddp.sweep.spec import SweepSpec

TaskWord = tuple["TaskState", "str | None", "list[Attempt] | None"]
"""One point's state, its current job id, and its ledger when it was read for the state."""


@dataclass(frozen=True)
class Resubmission:
    """What ``--resubmit-failed`` found and did (``records`` empty for a dry run)."""

    points: list[int]
    arrays: list[PreparedArray]
    records: list[ArrayRecord]
    live: dict[int, str] = field(default_factory=dict)
    """Points whose array task is queued or running now, and that task (``ARRAYJOB_TASK``, or
    the pending range holding it): never submitted again while it is."""


class SweepRunner(Protocol):
    """What the login side does differently for a sweep of each backend."""

    @property
    def backend(self) -> BackendName:
        """The backend's name, as the sweep's manifest records it."""
        ...

    def at_once(self, spec: SweepSpec) -> int | None:
        """How many points of ``spec`` would run at once (None: no limit)."""
        ...

    def plan(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        sweep_dir: Path,
        invocation: Sequence[str],
        now: datetime,
    ) -> tuple[list[PreparedArray], str]:
        """What a new sweep of ``spec`` in ``sweep_dir`` would submit (a dry run, nothing
        written; the scripts stamped ``now``): the rendered arrays (none when no array runs
        it) and a note to print."""
        ...

    def start(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        runs_dir: Path,
        invocation: Sequence[str],
    ) -> tuple[Path, tuple[str, ...]]:
        """Write a new sweep directory for ``spec`` under ``runs_dir`` and start its points:
        the directory and the array jobs submitted (none when no array runs it). An
        :class:`OSError` when the directory cannot be written."""
        ...

    def task_jobs(self, sweep_dir: Path, points: Sequence[int]) -> dict[int, str]:
        """Each point's current job id (an array task ``ARRAYJOB_TASK``, a local run's pid);
        a point never started has none."""
        ...

    def settled(self, sweep_dir: Path) -> bool:
        """Nothing of the sweep still runs that may yet start or reap a point."""
        ...

    def task_words(
        self,
        sweep_dir: Path,
        points: Sequence[int],
        live: Mapping[str, JobInfo] | None,
        accounting: Mapping[str, AccountingRecord] | None,
    ) -> list[TaskWord]:
        """Each point's state and job (``live``: squeue's rows of the sweep's arrays, None
        when Slurm could not be asked; ``accounting``: sacct's records)."""
        ...

    def resubmit(
        self,
        sweep_dir: Path,
        *,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """Start the failed and cancelled points again (``dry_run``: only say which), each
        going on from its checkpoint in its own directory; two jobs never run one point."""
        ...

    def cancel(self, sweep_dir: Path) -> Cancelled:
        """Stop what starts the sweep's points besides its jobs (a local sweep's controller),
        and wait until it has stopped; the jobs themselves are cancelled by the backend."""
        ...

    def busy(self, sweep_dir: Path, live: dict[int, str]) -> TargetError:
        """The refusal of a resubmit with nothing failed while points run (``live``: point ->
        what runs it)."""
        ...
