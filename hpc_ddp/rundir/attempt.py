"""An attempt of a run, as its ledger tells it: when it started and ended, why, what it saved
and resumed from, whom its fault points to (:class:`Blame`), its survivor's save
(:class:`Rescue`) and its stop's save (:class:`StopSave`, :class:`LostStop`). Pure values:
:func:`hpc_ddp.rundir.ledger.read_ledger` folds the events into them."""

from __future__ import annotations

from dataclasses import dataclass

from hpc_ddp.config.elastic import Resize
from hpc_ddp.rundir.endcause import EndCause


@dataclass(frozen=True)
class Blame:
    """Whom a fault points to, and on what evidence (the supervisor's or a watchdog's word)."""

    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    evidence: str
    node_level: bool = False
    """The evidence speaks against the node itself (it was lost, or a hardware error)."""
    detected_at: float | None = None
    """When the fault was seen (a watchdog's declaration, srun's first word of it)."""
    last_progress_at: float | None = None
    """The last time the blamed ranks were seen making progress (a step, a phase change)."""

    def describe(self) -> str:
        """``rank 1 on n2: heartbeat stopped 10.1 s ago``."""
        who = ", ".join(f"rank {r}" for r in self.ranks) or "no rank"
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        return f"{who}{where}: {self.evidence}"


@dataclass(frozen=True)
class Save:
    """One checkpoint saved by rank 0 (a ``checkpoint`` event)."""

    time: float
    step: int
    stall_s: float
    """How long training waited for it (snapshot, gather, the previous write)."""
    durable_s: float | None = None
    """From asking for it until it was durable (W); None in ledgers from before it was kept."""
    auto: AutoInterval | None = None
    """The interval in force under ``train.checkpoint_every: auto`` (None: a fixed one)."""


@dataclass(frozen=True)
class AutoInterval:
    """The interval ``train.checkpoint_every: auto`` chose, and its inputs (see
    :mod:`hpc_ddp.checkpoint.interval`)."""

    interval_s: float
    interval_steps: int
    step_s: float
    """The measured seconds per step that turned the interval into steps."""
    mtbf_s: float
    mtbf_from: str
    """``prior``, ``run``, ``history`` or ``run+history``."""
    restart_s: float


@dataclass(frozen=True)
class Rescue:
    """A survivor's save after the launch's fault (a ``rescue`` event): the checkpoint of the
    last step every rank completed, or why there is none."""

    rank: int
    step: int | None
    checkpoint: str | None
    """The checkpoint that holds ``step`` (written by the rescue, or saved already)."""
    why: str | None
    """Why the rescue wrote nothing (None: it wrote ``checkpoint``)."""
    took_s: float

    @property
    def words(self) -> str:
        """``rank 0 saved step-00000022.pt (step 22) in 0.04 s`` or why not."""
        if self.checkpoint is not None and self.why is not None:
            return f"{self.why} ({self.checkpoint})"
        if self.checkpoint is not None:
            took = f"{self.took_s:.2f} s"
            return f"rank {self.rank} saved {self.checkpoint} (step {self.step}) in {took}"
        return f"no survivor's save: {self.why}"


@dataclass(frozen=True)
class StopSave:
    """An agreed stop's save begun by rank 0 (a ``stop_save`` event): the step it saves."""

    time: float
    step: int
    lead_s: int | None
    """The warning the job was given (``requeue.lead_time``), for the words of a loss."""


@dataclass(frozen=True)
class LostStop:
    """A stop whose save was not durable before the kill (a ``stop_save_lost`` event, or
    found in the ledger by :func:`~hpc_ddp.rundir.ledger.lost_stop`): the steps from
    ``saved_step`` to ``step`` are trained again."""

    step: int
    """The step the stop was saving."""
    saved_step: int | None
    """The newest step durable before it (None: none; the run starts over)."""
    stop_at: float
    lead_s: int | None
    recorded: bool = False
    """A ``stop_save_lost`` line says so (False: found only now)."""

    @property
    def lost_steps(self) -> int:
        """The steps trained again."""
        return self.step - (self.saved_step or 0)

    def describe(self) -> str:
        """``the stop's save of step 40 was not durable before the kill (lead time 120 s):
        steps 20-40 are trained again. HINT: ...``."""
        lead = f"requeue.lead_time {self.lead_s} s" if self.lead_s is not None else "its warning"
        since = "the start" if self.saved_step is None else f"step {self.saved_step}"
        return (
            f"the stop's save of step {self.step} was not durable before the kill ({lead}, or "
            f"a preemption's GraceTime): {self.lost_steps} step(s) since {since} are trained "
            "again. HINT: raise requeue.lead_time, or set requeue.lead_time: auto (sized from "
            "your measured saves); under preemption ask for a partition or QOS with a longer "
            "GraceTime"
        )


@dataclass(frozen=True)
class Attempt:
    """One attempt folded from its ledger events."""

    attempt: int
    """The attempt's number in the run, from 0: its place among all the run's attempts (every
    job's, requeues and resumes alike), as :func:`~hpc_ddp.rundir.ledger.read_ledger` found them."""
    started: float
    ended: float | None
    """``None``: still running, or died without writing its end (killed, node lost)."""
    cause: EndCause | None
    steps_done: int | None
    """Global optimizer step reached when it ended."""
    checkpoint: str | None
    """The last checkpoint known: the one saved at the end, else the one resumed from."""
    nodelist: str
    job_ref: str | None
    resumed_from_step: int | None
    job_id: str | None = None
    world_size: int | None = None
    resumed_from: str | None = None
    """The checkpoint this attempt started from."""
    requeue_requested: bool | None = None
    message: str | None = None
    restart: int | None = None
    """``SLURM_RESTART_COUNT`` of the attempt within its job (what the requeue budget counts);
    in a ledger from before run-wide numbering, the number the event was written with."""
    launch: int = 0
    """Which launch of its Slurm attempt (in-job restarts count 1, 2, ...)."""
    launched_at: float | None = None
    """When the supervisor started its launch (start-up runs from here to ``started``)."""
    alloc_nodes: int | None = None
    """Nodes the allocation held while it ran (spares included), for node-seconds."""
    from_step: int | None = None
    """The newest checkpoint's step on disk when its launch started (None: none)."""
    checkpoint_step: int | None = None
    """The newest checkpoint's step on disk when its launch ended."""
    blame: Blame | None = None
    """Whom the fault that ended it points to (the supervisor's word), if one did."""
    next: str | None = None
    """What came next: ``restart``, ``requeue`` or ``stop``, as the supervisor said; an
    attempt that asked for its requeue, or that Slurm requeued (a later restart of its job
    follows it), is ``requeue`` even where the supervisor saw its launch end cleanly
    (``stop``). None: no supervisor ran it."""
    saves: tuple[Save, ...] = ()
    """The checkpoints rank 0 saved in it."""
    trained: bool = True
    """False for a launch whose ranks never started training (the supervisor alone wrote it):
    its whole span was start-up."""
    launch_ended: float | None = None
    """When the supervisor was done with its launch (the step ended, the fault recorded)."""
    grad_accum: int | None = None
    """Micro-batches each rank accumulated per optimizer step (None: not recorded)."""
    resize: Resize | None = None
    """Set when it went on from a checkpoint of another world size (an elastic resume):
    how steps were made before and now, and that it is sample-exact, not bit-exact."""
    rescue: Rescue | None = None
    """The survivor's save after its fault (None: none was tried)."""
    witnesses: tuple[str, ...] = ()
    """What ranks that only lost a peer said of its end (``"witness": true`` ends: "rank 0 on
    n1: ... Connection reset by peer"): the fault's witnesses, never its blame."""
    stop_save: StopSave | None = None
    """The save of an agreed stop, begun (None: no stop saved in it)."""
    lost: LostStop | None = None
    """Its stop's save that the kill beat, as a later reader recorded it."""

    @property
    def stall_s(self) -> float:
        """Seconds training waited for its checkpoints."""
        return sum(s.stall_s for s in self.saves)

    @property
    def is_open(self) -> bool:
        """True while no end has been recorded."""
        return self.ended is None

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end (None while open)."""
        return None if self.ended is None else self.ended - self.started
