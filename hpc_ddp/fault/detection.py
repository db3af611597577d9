"""The supervisor's fault detection: the fault a launch has, found from what its ranks and its
launcher say (as :mod:`hpc_ddp.fault.blame` then says whom it points to).

The supervisor (:mod:`hpc_ddp.fault.supervisor`) asks a :class:`Detection` once a poll, while no
fault is known, in this order (:meth:`Detection.find`):

1. a fault a rank's watchdog claimed, a node srun lost, a task that ended badly on its own
   account (:meth:`~Detection.fault_from`);
2. ranks gone silent with their node, or quiet for ``fault.stale_s`` (:meth:`~Detection.silence`);
3. ranks that never beat within ``fault.startup_timeout_s`` (:meth:`~Detection.never_started`);
4. a rank that left its training loop early while its peers went on
   (:meth:`~Detection.early_exit`);
5. a rank gone complaining of a peer that still runs (:meth:`~Detection.complaint`).

Each fault found is claimed in the launch's fault record (the first claim wins: a rank's own
may have come first, and is then the one returned).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.config.model import FaultConfig
from hpc_ddp.exitcodes import OWN_OUTCOMES
from hpc_ddp.fault.blame import (
    EARLY_EXIT_GRACE_S,
    RESCUE_PHASE,
    Beat,
    ExitNote,
    FaultRecord,
    StaleWatch,
    early_exit_why,
    left_early,
)
from hpc_ddp.fault.watchdog import claim_fault, read_beats, read_exit_notes, read_fault
from hpc_ddp.rundir.layout import LaunchPaths

SILENT_GRACE_BEATS = 3
"""A rank that has not beaten for this many beats once its peers are gone is silent."""
COMPLAINT_GRACE_BEATS = SILENT_GRACE_BEATS + 2
"""After a rank left complaining of a peer (a lost connection, a wait it gave up), how many
beats the supervisor waits for word of the peer's own end (srun's, a beat, silence) before it
blames the peers that still run: the ones that rank waited for."""


def _complains(beat: Beat | None, note: ExitNote | None) -> bool:
    """The rank left with a survivor's complaint about a peer (by its beat, or its session's
    exit note when a ``command:`` child ran the session): not a fault of its own."""
    if beat is not None and beat.exited and beat.lost_a_peer:
        return True
    return note is not None and note.lost_a_peer


class Detection:
    """Fault detection over one launch of ``world`` ranks (see the module docstring)."""

    def __init__(
        self,
        launch: LaunchPaths,
        world: int,
        fault: FaultConfig,
        clock: Callable[[], float],
        *,
        answers: Callable[[str], bool | None] | None = None,
    ) -> None:
        self.launch = launch
        self.world = world
        self.fault = fault
        self._clock = clock
        self._answers = answers
        """Asks a node directly whether it answers (the launcher's ``node_answers``)."""
        self.left_seen: float | None = None
        """When (monotonic) a rank was first seen to have left its loop while others went on."""
        self.complaint_seen: float | None = None
        """When (monotonic) a rank was first seen gone complaining of a peer."""

    def find(
        self,
        *,
        lost: Sequence[tuple[str, str]],
        new_ends: Sequence[TaskEnd],
        ends: Sequence[TaskEnd],
        beats: Mapping[int, Beat | None],
        notes: Mapping[int, ExitNote | None],
        quiet: StaleWatch,
        mono: float,
        waited: float,
    ) -> FaultRecord | None:
        """The fault the launch has now, if any, looked for in the module docstring's order.
        ``lost``: nodes the launcher saw lost; ``new_ends``: the task ends not seen at the last
        poll, of ``ends``, all so far; ``mono``: now, by the monotonic clock; ``waited``: since
        the launch started, by it."""
        return (
            self.fault_from(lost, new_ends)
            or self.silence(beats, quiet, mono, ends)
            or self.never_started(beats, waited)
            or self.early_exit(beats, notes, mono)
            or self.complaint(beats, notes, ends, quiet, mono)
        )

    def after_exit(self) -> FaultRecord | None:
        """Every process of the launch is gone without a fault found: one that left its loop
        early left the others nothing to train with, however they ended."""
        beats = read_beats(self.launch, self.world)
        notes = read_exit_notes(self.launch, self.world)
        return self.early_exit(beats, notes, None)

    def never_started(self, beats: Mapping[int, Beat | None], waited: float) -> FaultRecord | None:
        """Ranks that never beat within ``fault.startup_timeout_s`` (stuck before Python ran,
        or srun waiting for resources that never come): a backstop, a launch needs them all."""
        if waited < self.fault.startup_timeout_s:
            return None
        missing = tuple(r for r in range(self.world) if beats.get(r) is None)
        if not missing:
            return None
        why = (
            f"never started within fault.startup_timeout_s={self.fault.startup_timeout_s} s "
            "(no heartbeat: stuck before its watchdog ran, or its task never launched)"
        )
        record = FaultRecord("startup", "supervisor", self._clock(), missing, (), why, False)
        return self._claim(record)

    def silence(
        self,
        beats: Mapping[int, Beat | None],
        quiet: StaleWatch,
        mono: float,
        ends: Sequence[TaskEnd],
    ) -> FaultRecord | None:
        """Ranks that stopped beating with nobody left to see it: silent while their peers
        lost the connection to them (and no word of their end came from their node: gone with
        it), or quiet for ``fault.stale_s`` (``fault.startup_stale_s`` while starting: a backstop
        for the ranks' own watchdogs)."""
        fault = self.fault
        reported = {e.rank for e in ends}
        exited = {r for r, b in beats.items() if b is not None and b.exited}
        candidates = [r for r in range(self.world) if r not in exited | reported]
        now = self._clock()
        peers_lost = any(b is not None and b.exited and b.lost_a_peer for b in beats.values())
        # A survivor that lost its peer (its beat has the lost connection) or saves the last
        # step (fault/rescue) leaves only after the save: then the silent ranks' node must
        # also refuse a connection, as a killed rank's word from srun may simply be late.
        rescuing = any(
            b is not None and not b.exited and (b.phase == RESCUE_PHASE or b.lost_a_peer)
            for b in beats.values()
        )
        gone = quiet.stale(candidates, mono, SILENT_GRACE_BEATS * fault.beat_s)
        nodes = tuple(dict.fromkeys(b.node for r in gone if (b := beats.get(r)) is not None))
        probed = gone and not peers_lost and rescuing
        if probed:
            peers_lost = bool(nodes) and all(self._node_lost(n) for n in nodes)
        if peers_lost and gone:
            why = (
                "went silent while its peers lost their connection to it, and its node "
                + ("does not answer" if probed else "never reported its end")
                + ": gone with its node"
            )
            last = max((b.since for r in gone if (b := beats.get(r)) is not None), default=None)
            record = FaultRecord(
                "node_fail", "supervisor", now, tuple(gone), nodes, why, True, last
            )
            return self._claim(record)
        stale = quiet.stale(candidates, mono, fault.stale_s, fault.startup_stale_s)
        if not stale:
            return None
        nodes = tuple(dict.fromkeys(b.node for r in stale if (b := beats.get(r)) is not None))
        age = max(quiet.quiet_for(r, mono) or 0.0 for r in stale)
        last = max((b.since for r in stale if (b := beats.get(r)) is not None), default=None)
        why = f"heartbeat stopped {age:.1f} s ago (seen by the supervisor)"
        record = FaultRecord("hang", "supervisor", now, tuple(stale), nodes, why, False, last)
        return self._claim(record)

    def fault_from(
        self, lost: Sequence[tuple[str, str]], new_ends: Sequence[TaskEnd]
    ) -> FaultRecord | None:
        """A fault this launch now has: a rank's claim, a node srun lost (``lost``: the
        launcher's (node, evidence) so far), a task that ended badly on its own account (not a
        survivor's lost connection, not a declared fault)."""
        claimed = read_fault(self.launch.fault)
        if claimed is not None:
            return claimed
        now = self._clock()
        if lost:
            node, why = lost[0]
            record = FaultRecord("node_fail", "supervisor", now, (), (node,), why, True)
            return self._claim(record)
        if not new_ends:
            return None
        beats = read_beats(self.launch, self.world)
        notes = read_exit_notes(self.launch, self.world)
        for end in new_ends:
            if end.exit_code in OWN_OUTCOMES:
                continue
            beat = beats.get(end.rank)
            note = notes.get(end.rank)
            if _complains(beat, note):
                continue  # a survivor's word: see complaint
            said = beat.error if beat is not None and beat.error else None
            said = said or (note.error if note is not None else None)
            why = end.reason if not said else f"{said} ({end.reason})"
            if end.exit_code is None and self._node_lost(end.node):
                # Killed with its node: a lost node at once, before Slurm notices it, so the
                # next launch never goes back there.
                on_node = tuple(
                    r for r, b in beats.items() if b is not None and b.node == end.node
                ) or (end.rank,)
                why = f"{why}, and {end.node}'s slurmd does not answer: the node is lost"
                record = FaultRecord(
                    "node_fail", "supervisor", now, on_node, (end.node,), why, True,
                    beat.since if beat is not None else None,
                )  # fmt: skip
                return self._claim(record)
            record = FaultRecord(
                "task_failed", "supervisor", now, (end.rank,), (end.node,), why, False,
                beat.since if beat is not None else None,
            )  # fmt: skip
            return self._claim(record)
        return None

    def _node_lost(self, node: str) -> bool:
        """Whether ``node`` is known not to answer (never for the local machine, or when the
        launcher cannot tell)."""
        return bool(node) and self._answers is not None and self._answers(node) is False

    def early_exit(
        self,
        beats: Mapping[int, Beat | None],
        notes: Mapping[int, ExitNote | None],
        mono: float | None,
    ) -> FaultRecord | None:
        """A rank that left its training loop before its end (its exit note says so) while
        its peers went on: a fault of that rank, found at once rather than after
        ``dist.timeout_s`` (the others wait for it in their next collective). ``mono``: now,
        by the monotonic clock; None once every process is gone (no grace left to give)."""
        left, behind = left_early(self.world, beats, notes)
        if not left:
            self.left_seen = None
            return None
        if mono is not None:
            if self.left_seen is None:
                self.left_seen = mono
            grace = max(EARLY_EXIT_GRACE_S, SILENT_GRACE_BEATS * self.fault.beat_s)
            running = [r for r in behind if not ((b := beats.get(r)) is not None and b.exited)]
            if running and mono - self.left_seen < grace:
                return None
        nodes = tuple(dict.fromkeys(n.node for r in left if (n := notes.get(r)) is not None))
        last = max((n.time for r in left if (n := notes.get(r)) is not None), default=None)
        why = early_exit_why(left, behind, notes)
        now = self._clock()
        record = FaultRecord("early_exit", "supervisor", now, left, nodes, why, False, last)
        return self._claim(record)

    def complaint(
        self,
        beats: Mapping[int, Beat | None],
        notes: Mapping[int, ExitNote | None],
        ends: Sequence[TaskEnd],
        quiet: StaleWatch,
        mono: float,
    ) -> FaultRecord | None:
        """A rank gone complaining of a peer (it gave up waiting for rank 0's checkpoint
        write, its connection was reset), and no word of any peer's own end for
        :data:`COMPLAINT_GRACE_BEATS` beats: the peers still running are the ones it waited
        for (hung, or stuck in work of their own), not the rank that complained."""
        ended = {e.rank for e in ends}
        gone = [
            r
            for r in range(self.world)
            if _complains(beats.get(r), notes.get(r))
            and (r in ended or ((b := beats.get(r)) is not None and b.exited))
        ]
        if not gone:
            self.complaint_seen = None
            return None
        if self.complaint_seen is None:
            self.complaint_seen = mono
        beat_s = self.fault.beat_s
        if mono - self.complaint_seen < COMPLAINT_GRACE_BEATS * beat_s:
            return None
        # Still beating (a silent rank is silence's: gone with its node), not gone itself.
        live = tuple(
            r
            for r in range(self.world)
            if r not in ended
            and (b := beats.get(r)) is not None
            and not b.exited
            and (q := quiet.quiet_for(r, mono)) is not None
            and q < SILENT_GRACE_BEATS * beat_s
        )
        if not live:
            return None
        first = gone[0]
        beat, note = beats.get(first), notes.get(first)
        said = (beat.error if beat is not None and beat.error else None) or (
            note.error if note is not None else None
        )
        said = (said or "no word").split(" HINT:")[0][:300]
        waited = mono - self.complaint_seen
        where = [
            f"in its {b.phase} phase at step {b.step}"
            for r in live
            if (b := beats.get(r)) is not None and b.phase not in ("command", "step")
        ]
        why = (
            f"still running {waited:.0f} s after rank {first} gave up on it"
            f"{' (' + where[0] + ')' if where else ''}: rank {first}: {said}"
        )
        nodes = tuple(dict.fromkeys(b.node for r in live if (b := beats.get(r)) is not None))
        last = max((b.since for r in live if (b := beats.get(r)) is not None), default=None)
        record = FaultRecord("hang", "supervisor", self._clock(), live, nodes, why, False, last)
        return self._claim(record)

    def _claim(self, record: FaultRecord) -> FaultRecord | None:
        """``record``, if it is the launch's first fault claimed; else the claim before it."""
        return record if claim_fault(self.launch.fault, record) else read_fault(self.launch.fault)
