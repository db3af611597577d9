"""One launch as the supervisor watches it, and how a faulted launch's step is ended.

:class:`Step` is a running launch's processes (an srun step, or local rank processes).
:class:`LaunchWatch` is what the supervisor saw of one launch: its fault, and how far the
end of its step has come. After a fault, :meth:`LaunchWatch.end_step` is called once a poll
until it says the supervisor is done waiting:

1. every task is woken (SIGCONT: a frozen rank must run to act on anything) and asked for its
   stacks (:data:`~hpc_ddp.fault.watchdog.DUMP_SIGNAL`);
2. after :data:`DUMP_GRACE_S`, or as soon as no rank is left, the step is killed, unless a
   survivor is writing the step every rank completed (:mod:`hpc_ddp.fault.rescue`), or one
   armed for it has yet to take the fault up;
3. the supervisor stops waiting once every rank is accounted for, once only ranks silent with a
   lost node are left, or after :data:`STEP_GRACE_S`: the step is then abandoned (srun may wait
   for Slurm to settle a lost node; the job's end reaps it), and :attr:`LaunchWatch.silent`
   names the ranks never accounted for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.config.model import FaultConfig
from hpc_ddp.fault.blame import RESCUE_PHASE, Beat, FaultRecord
from hpc_ddp.fault.detection import SILENT_GRACE_BEATS

DUMP_GRACE_S = 2.0
"""After a fault: how long the ranks have to write their stacks and leave by themselves."""
KILL_SETTLE_S = 1.0
"""Once every rank is accounted for and the step was told to end: how long srun may take to
return before the next launch starts beside it (``--overlap``)."""
RESCUE_TAKEN_UP_S = 10.0
"""After a fault: how long a rank armed for the survivor's save (its beat says so), and not
blamed, has to take the fault up (phase ``rescue``) or leave before the step is ended under it.
Its watchdog does so at its next beat (half a second), later only on a loaded machine: a step
ended first would end the one rank that can save the step every rank completed."""
STEP_GRACE_S = 10.0
"""Then: how long srun may take to end the step once told to, before the supervisor stops
waiting for it (a lost node's tasks are never reported; Slurm settles them later)."""


class Step(Protocol):
    """The processes of one running launch (an srun step, or local rank processes)."""

    def poll(self) -> int | None:
        """The launch's exit status once every process is gone (srun's), else None."""
        ...

    def task_ends(self) -> Sequence[TaskEnd]:
        """Tasks that ended badly so far, in the order they were seen."""
        ...

    def node_failures(self) -> list[tuple[str, str]]:
        """(node, evidence) of nodes lost under the step, so far."""
        ...

    def refused(self) -> str | None:
        """Why the step could not start at all (no task ran), if so."""
        ...

    def node_answers(self, node: str) -> bool | None:
        """Whether ``node`` answers now, asked of it directly (False: it is lost; None: not
        known)."""
        ...

    def signal(self, name: str, beats: Mapping[int, Beat | None]) -> None:
        """Send signal ``name`` (``CONT``, ``URG``) to every task; never blocks for long."""
        ...

    def kill(self, beats: Mapping[int, Beat | None]) -> None:
        """End every task now (in the background: a lost node may keep Slurm busy)."""
        ...

    def forward(self, signum: int) -> None:
        """Pass a stop signal the supervisor got on to the ranks (local), or not (Slurm
        signals its steps itself)."""
        ...

    def abandon(self) -> None:
        """Stop waiting for a step that cannot end (a lost node); reaped at exit."""
        ...


def _on(beats: Mapping[int, Beat | None], rank: int, nodes: set[str]) -> bool:
    """Rank ``rank`` ran on one of ``nodes`` (by its beat)."""
    beat = beats.get(rank)
    return beat is not None and beat.node in nodes


@dataclass
class LaunchWatch:
    """What the supervisor saw of one launch (see the module docstring)."""

    fault: FaultRecord | None = None
    fault_at: float | None = None
    signalled: bool = False
    killed_at: float | None = None
    silent: list[int] = field(default_factory=list)
    code: int | None = None

    def end_step(
        self,
        step: Step,
        beats: Mapping[int, Beat | None],
        ends: Sequence[TaskEnd],
        now: float,
        *,
        world: int,
        cfg: FaultConfig,
    ) -> bool:
        """After a fault: wake and dump, end the step, and say when to stop waiting for it
        (True: the step is abandoned, :attr:`silent` set)."""
        if not self.signalled:
            # A frozen rank must be woken to act on anything, its stack dump included.
            step.signal("CONT", beats)
            step.signal("URG", beats)
            self.signalled = True
        assert self.fault_at is not None
        waited = now - self.fault_at
        lost = {n for n, _ in step.node_failures()}
        if self.fault is not None and self.fault.kind == "node_fail":
            lost |= set(self.fault.nodes)
        left = _unaccounted(world, beats, ends, lost)
        # A survivor writing the step every rank completed (fault/rescue) is let finish, and
        # one armed for it is let take the fault up first.
        blamed = set(self.fault.ranks) if self.fault is not None else set()
        rescuing = waited < cfg.checkpoint_timeout_s and any(
            b is not None
            and not b.exited
            and (
                b.phase == RESCUE_PHASE
                or (b.rescues and r not in blamed and waited < RESCUE_TAKEN_UP_S)
            )
            for r, b in beats.items()
            if r in left
        )
        if (waited >= DUMP_GRACE_S or not left) and self.killed_at is None and not rescuing:
            step.kill(beats)  # every rank that could write its stacks has
            self.killed_at = now
        if not self._done_waiting(world, left, waited, now, cfg.beat_s):
            return False
        self.silent = [r for r in range(world) if r in left or _on(beats, r, lost)]
        step.abandon()
        return True

    def _done_waiting(
        self, world: int, left: Sequence[int], waited: float, now: float, beat_s: float
    ) -> bool:
        """Whether to stop waiting for srun: every rank is accounted for (srun may still wait
        for Slurm to settle a lost node), only silent ranks are left (gone with a node nobody
        reported yet), or srun took too long."""
        if self.killed_at is None:
            return False
        if not left:
            return now - self.killed_at >= KILL_SETTLE_S
        return waited >= DUMP_GRACE_S + STEP_GRACE_S or _only_silent_left(
            world, left, waited, beat_s
        )


def _unaccounted(
    world: int, beats: Mapping[int, Beat | None], ends: Sequence[TaskEnd], lost: set[str]
) -> list[int]:
    """Ranks neither known gone (their last beat, srun's word of a death by signal, their
    node lost) nor accounted for: still running, frozen, or silent with a lost node."""
    dead = {e.rank for e in ends if e.exit_code is None}
    return [
        r
        for r in range(world)
        if r not in dead
        and not _on(beats, r, lost)
        and not ((b := beats.get(r)) is not None and b.exited)
    ]


def _only_silent_left(world: int, left: Sequence[int], waited: float, beat_s: float) -> bool:
    """Every rank has left but some that went silent (gone with a lost node): srun may wait
    for Slurm to notice the node (SlurmdTimeout); the supervisor need not."""
    gone = len(left) < world
    return gone and bool(left) and waited >= DUMP_GRACE_S + SILENT_GRACE_BEATS * beat_s
