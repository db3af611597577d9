"""How a sweep's points run on each backend: the sweep layer's face of a backend.

On Slurm a sweep is job arrays (:mod:`hpc_ddp.sweep.submit`, ``arrays.json``); on the local
backend a sweep controller on this machine starts each point as a local run
(:mod:`hpc_ddp.sweep.local`). The backends' own faces (:mod:`hpc_ddp.backends.base`) sit below
the sweep layer and know no sweep, so what differs between the two is here, as methods of a
:class:`SweepRunner`, and :func:`runner_for` picks the one a sweep directory's manifest names.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hpc_ddp.backends.arrays import current_refs, format_index_ranges, read_arrays
from hpc_ddp.errors import TargetError
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.rundir.manifest import Backend as BackendName
from hpc_ddp.rundir.manifest import read_manifest

if TYPE_CHECKING:
    from hpc_ddp.backends.arrays import PreparedArray
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.rundir.ledger import Attempt
    from hpc_ddp.state.task import TaskState
    from hpc_ddp.sweep.spec import SweepSpec
    from hpc_ddp.sweep.submit import Resubmission

TaskWord = tuple["TaskState", "str | None", "list[Attempt] | None"]
"""One point's state, its current job id, and its ledger when it was read for the state."""


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
        client: SlurmClient,
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
        client: SlurmClient,
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
        client: SlurmClient,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """Start the failed and cancelled points again (``dry_run``: only say which)."""
        ...

    def busy(self, sweep_dir: Path, live: dict[int, str]) -> TargetError:
        """The refusal of a resubmit with nothing failed while points run (``live``: point ->
        what runs it)."""
        ...


class ArraySweeps:
    """A Slurm sweep: job arrays, one task per point, recorded in ``arrays.json``."""

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
        client: SlurmClient,
        now: datetime,
    ) -> tuple[list[PreparedArray], str]:
        """The arrays, split at Slurm's ``MaxArraySize`` (its default when Slurm cannot be
        asked, which the note says)."""
        from hpc_ddp.backends.slurm.array_sweep import SLURM_DEFAULT_MAX_ARRAY_SIZE
        from hpc_ddp.backends.slurm.backend import SlurmBackend
        from hpc_ddp.errors import SlurmError
        from hpc_ddp.sweep.submit import prepare_sweep

        try:
            max_array_size, note = SlurmBackend(client).max_array_size(), ""
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
            client=client,
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
        client: SlurmClient,
    ) -> tuple[Path, tuple[str, ...]]:
        """One job array per sweep (or as few as ``MaxArraySize`` allows), submitted."""
        from hpc_ddp.sweep.submit import submit_sweep

        submission = submit_sweep(
            spec,
            sweep_file=sweep_file,
            runs_dir=runs_dir,
            python=sys.executable,
            invocation=invocation,
            client=client,
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
        from hpc_ddp.sweep.results import array_task_words

        return array_task_words(sweep_dir, points, live, accounting)

    def resubmit(
        self,
        sweep_dir: Path,
        *,
        client: SlurmClient,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """One new array (or as few as ``MaxArraySize`` allows) over exactly those points."""
        from hpc_ddp.sweep.submit import resubmit_arrays

        return resubmit_arrays(sweep_dir, client, python, invocation, dry_run, now)

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


class ControllerSweeps:
    """A local sweep: a sweep controller starts each point as a local run, some at once."""

    @property
    def backend(self) -> BackendName:
        """``local``."""
        return "local"

    def at_once(self, spec: SweepSpec) -> int | None:
        """The controller's limit: ``max_parallel``, or its default."""
        from hpc_ddp.sweep.local import local_parallel

        return local_parallel(spec.max_parallel)

    def plan(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        sweep_dir: Path,
        invocation: Sequence[str],
        client: SlurmClient,
        now: datetime,
    ) -> tuple[list[PreparedArray], str]:
        """Nothing rendered: the controller starts each point as a local run."""
        del spec, sweep_file, sweep_dir, invocation, client, now
        return [], ""

    def start(
        self,
        spec: SweepSpec,
        *,
        sweep_file: Path,
        runs_dir: Path,
        invocation: Sequence[str],
        client: SlurmClient,
    ) -> tuple[Path, tuple[str, ...]]:
        """A detached sweep controller on this machine, started over every point."""
        from hpc_ddp.sweep.submit import submit_local_sweep

        del client  # nothing goes to Slurm
        sweep_dir = submit_local_sweep(
            spec, sweep_file=sweep_file, runs_dir=runs_dir, invocation=invocation
        )
        return sweep_dir, ()

    def task_jobs(self, sweep_dir: Path, points: Sequence[int]) -> dict[int, str]:
        """The local run's job id of each point started so far."""
        out = {}
        for i in points:
            task = RunPaths(sweep_dir).task(i).root
            if (task / MANIFEST_FILE).exists():
                out[i] = read_manifest(task).job_id or ""
        return out

    def settled(self, sweep_dir: Path) -> bool:
        """True once the controller has exited: every point may read ended a moment before it
        has reaped the last one."""
        from hpc_ddp.sweep.local import controller_alive

        return not controller_alive(sweep_dir)

    def task_words(
        self,
        sweep_dir: Path,
        points: Sequence[int],
        live: Mapping[str, JobInfo] | None,
        accounting: Mapping[str, AccountingRecord] | None,
    ) -> list[TaskWord]:
        """Each point judged as a local run, or by what the controller will do with it."""
        from hpc_ddp.sweep.results import local_task_words

        del live, accounting  # no queue holds a local sweep's points
        return [(*word, None) for word in local_task_words(sweep_dir, points)]

    def resubmit(
        self,
        sweep_dir: Path,
        *,
        client: SlurmClient,
        python: str,
        invocation: Sequence[str],
        dry_run: bool,
        now: datetime | None,
    ) -> Resubmission:
        """A new sweep controller over those points, unless the old one still runs."""
        from hpc_ddp.sweep.submit import resubmit_local

        del client, python, invocation, now  # nothing is rendered or submitted to Slurm
        return resubmit_local(sweep_dir, dry_run)

    def busy(self, sweep_dir: Path, live: dict[int, str]) -> TargetError:
        """Its controller still runs: it may yet start its points."""
        return TargetError(
            f"nothing resubmitted: the local sweep controller of {sweep_dir} still runs (points "
            f"{format_index_ranges(live)} are running or waiting for it); two processes must "
            f"never start one point. HINT: `hpc-ddp status {sweep_dir}` follows it; resubmit "
            f"once it has ended, or `hpc-ddp cancel {sweep_dir}` first."
        )


_RUNNERS: dict[BackendName, Callable[[], SweepRunner]] = {
    "slurm": ArraySweeps,
    "local": ControllerSweeps,
}


def runner_named(backend: BackendName) -> SweepRunner:
    """The runner of a new sweep on ``backend``."""
    return _RUNNERS[backend]()


def runner_for(sweep_dir: Path) -> SweepRunner:
    """The runner of the backend a sweep directory's manifest names; a sweep directory without
    a manifest reads as Slurm's, as it always did."""
    if not (sweep_dir / MANIFEST_FILE).exists():
        return ArraySweeps()
    return runner_named(read_manifest(sweep_dir).backend)
