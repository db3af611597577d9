"""A backend, where a run's job goes, in its two faces (as submitit's ``core`` and torchx's
``Scheduler``): one package per backend implements both.

* The login face, :class:`Backend`: what ``submit``, ``resume``, ``status``, ``cancel`` and
  ``logs`` ask of the place a run's job goes: the plan (the dry run, pure), the start, what the
  backend says of a job, the cancel. :mod:`hpc_ddp.backends.slurm.backend` (a batch script
  through ``sbatch``) and :mod:`hpc_ddp.backends.local.backend` (processes of this machine)
  implement it. Beside it, what the backend's own logs say of a job's end (:class:`Postmortem`:
  srun's words in the batch log) and, for a job this process started and holds on this
  machine, its wait and its stop (:class:`Held`: a local run). Login code that works with any
  backend is handed :class:`Backends`, which picks each by name
  (:class:`hpc_ddp.backends.registry.Registry`: every backend, and the CLI's and the API's one
  injection point).
* The node face, :class:`Launcher`: how the supervisor starts each launch (one set of ranks)
  inside the allocation it holds: :class:`hpc_ddp.backends.slurm.step.SrunLauncher` (srun
  steps), :class:`hpc_ddp.backends.local.launcher.LocalLauncher` (local processes).

Only types live here, so both sides import it: the login side never reaches the node side
through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from hpc_ddp.config.model import JobConfig
from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir.layout import Checkpoint, RunPaths

if TYPE_CHECKING:  # types only: loading this module loads no reader of files, nor Slurm's parsers
    from hpc_ddp.backends.catalog import BackendName
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
    from hpc_ddp.rundir.manifest import Manifest

# --- the login face ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """What a plan is made from besides the config and the run directory."""

    python: str
    """The interpreter the job's tasks run hpc-ddp with."""
    config_path: Path
    """The job file (its directory holds a relative ``slurm.template``)."""
    invocation: str
    """The command that asked for the run, as one line (shown in a batch script's header)."""
    generated_at: str
    """When the plan was made (ISO 8601)."""
    exclude: tuple[str, ...] = ()
    """Nodes to ask Slurm to leave out (``--exclude``): the lemon record's
    (:mod:`hpc_ddp.lemons`), where the partition keeps enough others."""


@dataclass(frozen=True)
class SubmitPlan:
    """What a start would write and run: made without running or writing anything (the dry
    run shows it)."""

    script: str | None
    """The batch script to write at ``RUN_DIR/job.sbatch``; None where none is run."""
    command: tuple[str, ...]
    """The command a start runs (``sbatch --parsable RUN_DIR/job.sbatch``)."""
    summary: str
    """The dry run's line: ``# backend: slurm; would run: ...``."""
    request: PlanRequest
    template: str | None = None
    """The batch template's text, read once (None: the default one, or no script)."""


@dataclass(frozen=True)
class Started:
    """A job a backend started."""

    job_id: str
    command: tuple[str, ...]
    """What the manifest records as the command that started it."""
    handle: Any = None
    """The backend's own handle on a job this process started
    (:class:`hpc_ddp.backends.local.controller.LocalJob`); None where there is none."""
    follow_from: int = 0
    """Where rank 0's log ended before the start (``--wait`` follows it from there)."""


@dataclass(frozen=True)
class Word:
    """What a backend that holds a job on this machine says of it (no scheduler to ask)."""

    running: bool
    """Its processes still run."""
    cancelled: bool
    """A person cancelled it (and it has ended)."""
    note: str | None = None
    """What the status row should say besides (ranks left running without a controller)."""


@dataclass(frozen=True)
class Cancel:
    """What one target cancels: job ids read from ``source`` (a local run: its controller's
    pid), on the backend ``backend``."""

    where: Path
    """The run, sweep or sweep task directory (for the message)."""
    source: Path
    """The file the job ids were read from: ``manifest.json`` or a sweep's ``arrays.json``."""
    jobs: tuple[str, ...]
    what: str = "job"
    """``job``, ``job array``, ``array task``, or ``sweep`` (a local sweep's controller)."""
    backend: BackendName = "slurm"

    @property
    def home(self) -> Path:
        """The directory whose script the jobs must run: the run's, or the sweep's (which
        holds the record, ``arrays.json`` or ``manifest.json``)."""
        return self.source.parent


Outcome = Literal["cancelled", "already_finished", "unknown", "not_this_run", "still_running"]
"""What cancelling one target came to (``cancel --json``'s ``outcome``)."""


@dataclass(frozen=True)
class Cancelled:
    """What was done for one target, and a line saying it."""

    outcome: Outcome
    message: str


@dataclass(frozen=True)
class Grace:
    """How long a preempted job has from its stop signal to its kill: the scheduler's grace
    time (a partition's, or a QOS's) and then its kill wait."""

    grace_s: int
    kill_wait_s: int
    source: str
    """Whose grace time it is (``partition low``, ``QOS normal``)."""

    @property
    def total_s(self) -> int:
        """From the stop signal to the kill."""
        return self.grace_s + self.kill_wait_s


class Backend(Protocol):
    """The login face of a backend: what the login side asks of where a run's job goes."""

    @property
    def name(self) -> BackendName:
        """The backend's name, as the manifest records it."""
        ...

    @property
    def ledger_since_submit(self) -> bool:
        """The current job's ledger entries are those written since its submission (a new
        job starts only once the earlier job's ranks have provably ended), rather than those
        that name its job id (on Slurm a rank may write its end after Slurm has called the job
        ended, so a job's entries are told by its id)."""
        ...

    def plan(self, cfg: JobConfig, paths: RunPaths, request: PlanRequest) -> SubmitPlan:
        """What a start of ``cfg`` in ``paths`` would write and run; runs and writes nothing
        (raises :class:`~hpc_ddp.errors.ConfigError` for a job this backend cannot run)."""
        ...

    def moved(self, plan: SubmitPlan, cfg: JobConfig, paths: RunPaths) -> SubmitPlan:
        """``plan`` for another run directory (a name another submit took first)."""
        ...

    def check(self, cfg: JobConfig) -> None:
        """Refuse (:class:`~hpc_ddp.errors.ConfigError`) a job this backend cannot run."""
        ...

    def start(self, cfg: JobConfig, paths: RunPaths) -> Started:
        """Start the written run in ``paths``; returns once it is queued or started."""
        ...

    def test_only(self, paths: RunPaths) -> str:
        """The backend's word on whether and when the written run would start; starts
        nothing."""
        ...

    def job_refs(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """The ids a scheduler knows the run's jobs by (raises
        :class:`~hpc_ddp.errors.RunDirError` for a recorded one that is none); [] where no
        scheduler holds them."""
        ...

    def states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """The scheduler's rows of the jobs it still holds, keyed by job id."""
        ...

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord] | None:
        """The scheduler's records of ended jobs it no longer holds; None without any."""
        ...

    def cancel_ids(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """The ids a cancel of the run acts on, each checked (raises
        :class:`~hpc_ddp.errors.RunDirError`, before anything is cancelled, for one that is
        none, or when there is none)."""
        ...

    def cancel(self, plan: Cancel, *, kill_wait_s: float | None = None) -> Cancelled:
        """Cancel the jobs of ``plan``, never one that is not the run's; a cancelled job is
        never requeued by hpc-ddp. ``kill_wait_s``: how long a job that runs here gets after
        the stop signal before it is killed (None: the backend's own default)."""
        ...

    def word(self, run_dir: Path, job_id: str) -> Word | None:
        """What the backend says of the run's job by itself; None where a scheduler holds it,
        whose word for many runs at once is asked by the status view."""
        ...

    def settled(self, run_dir: Path, job_id: str) -> bool:
        """Nothing of an ended job still runs (a local run's ledger may say finished a moment
        before its processes exit); a scheduler's ended state says so by itself."""
        ...

    def startup_failure(self, run_dir: Path, job_id: str | None) -> str | None:
        """Why a job ended without a word in its ledger, as far as the backend can tell."""
        ...

    def partition_nodes(self, partition: str | None) -> tuple[str, list[str]] | None:
        """(the partition, its nodes) a job of ``partition`` (None: the default one) may run
        on, which a submission may leave lemons out of (:mod:`hpc_ddp.lemons`); None where
        nodes cannot be left out (local runs). Raises :class:`~hpc_ddp.errors.BackendError`
        when it cannot be asked."""
        ...

    def preemption_grace(self, partition: str | None, qos: str | None) -> Grace | None:
        """How long a preempted job of ``partition`` (None: the default one) and ``qos`` has
        between its stop signal and its kill; None where its jobs are never preempted (local
        runs, a partition no other preempts). Raises :class:`~hpc_ddp.errors.BackendError`
        when it cannot be asked."""
        ...

    def running(self, run_dir: Path, job_id: str | None, source: str) -> tuple[bool | None, str]:
        """Whether the run's job is queued or running: (True, what it is doing), (False, "")
        once it has ended, (None, "") when that cannot be told. ``source`` names the file the
        job id was read from (for the error when it is no job id)."""
        ...


# --- what a backend's own logs say of a job's end ---------------------------------------------


class FailedTask(Protocol):
    """One task (global rank) a backend's launcher saw fail (srun: ``n2: task 1: Killed``)."""

    @property
    def rank(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def reason(self) -> str:
        """The launcher's words: ``Killed``, ``Exited with exit code 1`` ..."""
        ...

    def describe(self) -> str:
        """``rank 1 on n2: Killed``."""
        ...


class Postmortem(Protocol):
    """What a backend's own logs say of how a job ended, beside its ledger and its ranks' logs
    (Slurm: srun's words in the batch script's log). A rank killed outright writes nothing, and
    its peers' complaints name the wrong rank: the launcher saw it die."""

    def failed_rank(self, logs_dir: Path) -> FailedTask | None:
        """The task the launcher saw fail first in the job's last failure, from the logs of the
        run whose ``logs/`` is ``logs_dir``; None when it saw none (or keeps no log of its own)."""
        ...

    def no_log(self, logs_dir: Path) -> str | None:
        """What to say of a job that failed before any attempt and left no log in
        ``logs_dir`` at all (``the batch script left no log ...``); None once it wrote one, or
        where the backend writes no log of its own."""
        ...


# --- a job this process started and holds -----------------------------------------------------


class TaskOutcome(Protocol):
    """How one task (global rank) of a held job ended."""

    @property
    def rank(self) -> int: ...
    @property
    def ok(self) -> bool: ...
    @property
    def detail(self) -> str:
        """``exit code 0``, ``ConfigError: ...``, or why the task left no result."""
        ...


class Waited(Protocol):
    """A held job waited on to its end: every task's outcome."""

    @property
    def outcomes(self) -> Sequence[TaskOutcome]: ...

    def describe(self, state: str) -> str:
        """One line: the run's ``state`` (the verdict ``status`` gives it) and, for a failure,
        the rank to blame."""
        ...


class Forced(Protocol):
    """What a forced stop of a held job killed, and what it lost."""

    @property
    def ranks(self) -> Sequence[int]:
        """The rank processes killed."""
        ...

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The newest whole checkpoint on disk: the run goes on from there."""
        ...

    def lost(self) -> str:
        """What was lost, in words: the steps since :attr:`checkpoint`."""
        ...


class Held(Protocol):
    """A job this process started and holds, whose processes are this machine's (a local run:
    :attr:`Started.handle`): waited on and stopped here, not through a scheduler."""

    @property
    def started(self) -> float:
        """When it was started (``time.time()``): its attempt's ledger entries come later."""
        ...

    def ended(self) -> bool:
        """True once every process of it has exited."""
        ...

    def wait(
        self,
        *,
        follow: Path | None = None,
        follow_from: int = 0,
        on_poll: Callable[[], None] | None = None,
    ) -> Waited:
        """Wait until it has ended, copying ``follow`` (a log) to stderr from byte
        ``follow_from`` on; ``on_poll`` runs between polls."""
        ...

    def stop(self) -> None:
        """Ask it to stop as a cancel does (the ranks agree on a step, rank 0 saves); returns
        at once."""
        ...

    def force(self) -> Forced:
        """Stop it at once: noted as cancelled by a person, every process of it killed, the
        attempt's end recorded."""
        ...


class Backends(Protocol):
    """Every backend, by name: what login code that works with any backend is handed (the
    registry, :class:`hpc_ddp.backends.registry.Registry`, is one; tests pass one whose Slurm
    backend runs over :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`)."""

    def backend(self, which: Manifest | BackendName) -> Backend:
        """The backend a run's manifest names (or the one named ``which``)."""
        ...

    def postmortem(self, which: Manifest | BackendName) -> Postmortem:
        """What the logs of that backend's jobs say of their end."""
        ...

    def held(self, which: BackendName, handle: object, run_dir: Path, job_id: str) -> Held:
        """The job ``job_id`` of ``run_dir`` that this process started on the backend
        ``which`` and holds (``handle``: its :attr:`Started.handle`)."""
        ...


# --- the node face ----------------------------------------------------------------------------


class LaunchShape(Protocol):
    """What a launcher reads of one launch's plan (:class:`hpc_ddp.fault.supervisor.Plan`)."""

    @property
    def nodes(self) -> int: ...
    @property
    def tasks_per_node(self) -> int: ...
    @property
    def exclude(self) -> tuple[str, ...]: ...
    @property
    def overlap(self) -> bool: ...


@dataclass(frozen=True)
class TaskEnd:
    """One task of a launch that ended badly, as its launcher saw it: srun's ``task N: REASON``
    line, or a local ``waitpid``; the fault model weighs it (:mod:`hpc_ddp.fault.blame`)."""

    rank: int
    node: str
    reason: str
    """``Killed``, ``Exited with exit code 1``, ``Segmentation fault``..."""
    exit_code: int | None = None
    """The exit status, when it exited (None: killed by a signal)."""
    said_by: str = "srun"
    """Who reported it, as a blame quotes it (``Killed (srun)``): srun, or the local launcher."""


StepT_co = TypeVar("StepT_co", covariant=True)
"""The launcher's running launch (the supervisor's :class:`~hpc_ddp.fault.launch_watch.Step`)."""


class Launcher(Protocol[StepT_co]):
    """Starts launches and knows the allocation they run in."""

    def start(self, plan: LaunchShape, env: Mapping[str, str]) -> StepT_co:
        """Start ``plan`` with ``env`` added to each task's environment."""
        ...

    def nodes(self) -> tuple[str, ...]:
        """The allocation's nodes now (a node Slurm removed after a failure is gone)."""
        ...

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """Of ``nodes``, those Slurm holds down or not responding, with their state."""
        ...

    def requeue(self, exclude: Sequence[str]) -> str | None:
        """Ask Slurm to requeue the job, avoiding ``exclude``; None, or why it failed."""
        ...
