"""The evidence of a fault and whom it points to: heartbeats, fault records, task ends. Pure.

Every rank's watchdog rewrites one small record, its *beat*, in place once per ``fault.beat_s``
(:mod:`hpc_ddp.fault.watchdog`): who it is (rank, node, pid), that it is alive (``seq``
goes up), how far it got (step, phase) and, once it leaves, how (``state: exited`` with its
exit code and error). The first rank (or the supervisor) to declare a fault claims the launch's
*fault record* and copies it into its beat, so that every other rank sees it at its next beat.
:func:`assign_blame` weighs all of it, strongest evidence first, and names the rank(s) and
node(s) to blame:

1. a node srun or Slurm says failed;
2. the launch's fault record (a watchdog's ``hang`` or ``startup``, a rank's own ``crash``, the
   supervisor's ``task_failed``), unless its culprit only lost a peer;
3. ranks that went silent without an exit record: frozen or cut off while the step ran, gone
   with their node once the step has ended (``settled``);
4. tasks that ended badly (srun's ``task N: Killed``, a local ``waitpid``), skipping those that
   only lost a peer (a "connection reset" is the survivor's complaint, not the fault) or left
   because a fault was declared;
5. live ranks behind the others (the lowest step);
6. otherwise every live rank: no rank stands out (all stuck in the same step).

Nothing here needs a collective or a survivor's exception, so it works the same under NCCL,
where the survivors of a dead peer do not raise but block until the watchdog ends them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.exitcodes import FAULT_EXIT_CODE, OWN_OUTCOMES, PEER_FAULT_EXIT_CODE
from hpc_ddp.rundir.attempt import Blame
from hpc_ddp.rundir.endcause import EndCause

BEAT_BYTES = 1024
"""Every beat is exactly this long (JSON padded with spaces, then a newline), rewritten in
place and never truncated, so a reader never sees an empty file or a shorter record's tail."""

STARTING, ALIVE, FAULT, EXITED = "starting", "alive", "fault", "exited"
"""A beat's ``state``: before the first step, training, declared a fault, gone."""

RESCUE_PHASE = "rescue"
"""A beat's ``phase`` while its rank writes the survivor's save (:mod:`hpc_ddp.fault.rescue`)
after a fault: the supervisor lets it finish, up to ``fault.checkpoint_timeout_s``."""

FAULT_KINDS: Mapping[str, EndCause] = MappingProxyType(
    {
        "hang": EndCause.HANG,
        "startup": EndCause.HANG,
        "crash": EndCause.CRASH,
        "task_failed": EndCause.CRASH,
        "node_fail": EndCause.NODE_FAIL,
        "early_exit": EndCause.CRASH,
    }
)
"""The kinds of fault a record may name, each with the end cause it gives its attempt, in the
supervisor's ``launch_end`` and in a rank's own end alike (:func:`fault_cause`): a rank stopped
beating or overran its phase (``hang``), start-up overran (``startup``), a rank raised
(``crash``), srun or ``waitpid`` saw a task end badly (``task_failed``), a node was lost
(``node_fail``), a rank left its training loop before its end while its peers trained on
(``early_exit``)."""

PEER_ERROR = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|Connection refused|"
    r"Timed out waiting|Socket Timeout|remote process exited|"
    r"NCCL communicator was aborted|DistNetworkError|PeerError",
    re.IGNORECASE,
)
"""What a survivor says when a peer died or hung: its own end is the peer's fault, not its own."""

HARDWARE_ERROR = re.compile(
    r"CUDA error: (?:an illegal memory access|uncorrectable ECC|unspecified launch failure|"
    r"misaligned address|device-side assert)|ECC error|Xid|NCCL .*unhandled system error|"
    r"CUBLAS_STATUS_EXECUTION_FAILED|Input/output error",
    re.IGNORECASE,
)
"""Errors that speak against the node itself (its GPU, memory or disk), not the program."""


@dataclass(frozen=True)
class FaultRecord:
    """A fault declared in one launch: ``fault.json`` (the first claim wins), and in beats."""

    kind: str
    by: str
    """Who declared it: ``rank 0 on n1``, ``supervisor``."""
    time: float
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    why: str
    node_level: bool = False
    last_progress: float | None = None
    """When the blamed ranks last made progress (a step, a phase change), if known."""

    def for_program(self, per_task: int) -> FaultRecord:
        """This record in the numbering of a program that runs ``per_task`` ranks in each task
        (torchrun's workers, task ``t`` holding ranks ``t * per_task ...``): every rank of a
        blamed task is blamed, as torchrun ends them all when one fails."""
        if per_task == 1:
            return self
        ranks = tuple(t * per_task + local for t in self.ranks for local in range(per_task))
        return replace(self, ranks=ranks)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON values."""
        data = asdict(self)
        data["ranks"], data["nodes"] = list(self.ranks), list(self.nodes)
        return data


def task_place(given: str | None, rank: int, world: int) -> tuple[int, int] | None:
    """(task, tasks) of the parent task running program rank ``rank`` of ``world``, from its
    ``RANK/WORLD`` (:data:`~hpc_ddp.rundir.layout.TASK_PLACE_ENV`; none given: the rank is the
    task). None when the program's ranks are not the tasks' in order, ``world // tasks`` to
    each (torchrun's workers under a rendezvous that numbered the nodes otherwise): its faults
    cannot be mapped, so it has no survivor's save, and the restart goes on from the newest
    checkpoint."""
    if not given:
        return rank, world
    try:
        task, tasks = (int(x) for x in given.split("/"))
    except ValueError:
        return None
    if tasks < 1 or world % tasks or rank // (world // tasks) != task:
        return None
    return task, tasks


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat record (see the module docstring)."""

    rank: int
    node: str
    pid: int
    seq: int
    time: float
    step: int = 0
    phase: str = "startup"
    since: float = 0.0
    """When ``phase`` began (this rank's clock)."""
    launch_steps: int = 0
    """Steps completed in this launch."""
    state: str = STARTING
    code: int | None = None
    """Exit status, once ``state`` is ``exited``."""
    error: str | None = None
    """The exception it left with (its last line), once ``exited``."""
    frozen_s: float | None = None
    """Set when the watchdog found its own loop had not run for longer than ``stale_s``: this
    process itself was stopped (SIGSTOP, swapped out, the GIL held in a C call)."""
    slurm_step: str | None = None
    """``SLURM_STEP_ID`` of the task (the supervisor signals the step by it)."""
    fault: FaultRecord | None = None
    data_wait: bool = False
    """Its main thread waits for its next batch from hpc-ddp's loader (``s.loader``): a rank
    stuck there holds up the others, which wait for it in the step's collectives."""
    rescues: bool = False
    """A survivor's save is armed in this rank (:mod:`hpc_ddp.fault.rescue`): after a fault
    not its own, it takes the fault up at its next beat and either writes the last step every
    rank completed (phase ``rescue``) or leaves."""

    @property
    def exited(self) -> bool:
        """True once the rank has said it is leaving (its last word)."""
        return self.state == EXITED

    @property
    def lost_a_peer(self) -> bool:
        """The rank left only because of someone else's fault: a declared one, or a peer's
        lost connection (its own exception is the complaint, not the cause)."""
        if self.code in (FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE):
            return True
        return bool(self.error) and PEER_ERROR.search(self.error or "") is not None


def encode_beat(beat: Beat) -> bytes:
    """The record as exactly :data:`BEAT_BYTES` bytes (long texts are cut to fit)."""
    data = asdict(beat)
    if beat.fault is not None:
        data["fault"] = beat.fault.to_dict()
    data["v"] = 1
    for cut in (None, 400, 120, 0):
        if cut is not None:
            data["error"] = (beat.error or "")[:cut] or None
            if data["fault"] is not None:
                data["fault"]["why"] = str(data["fault"]["why"])[:cut]
        text = json.dumps(data, separators=(",", ":")).encode()
        if len(text) < BEAT_BYTES:
            return text.ljust(BEAT_BYTES - 1) + b"\n"
    raise ValueError(f"a beat of rank {beat.rank} does not fit in {BEAT_BYTES} bytes")


def parse_beat(data: bytes) -> Beat | None:
    """A beat read back; None for an empty, torn or foreign record ("no news")."""
    try:
        raw = json.loads(data.decode("utf-8", errors="strict").strip() or "null")
        if not isinstance(raw, dict) or raw.pop("v", None) != 1:
            return None
        fault = raw.pop("fault", None)
        beat = Beat(**raw)
        return replace(beat, fault=None if fault is None else fault_from_dict(fault))
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def encode_fault(record: FaultRecord) -> bytes:
    """``fault.json``'s text."""
    return json.dumps(record.to_dict(), sort_keys=True).encode() + b"\n"


def parse_fault(data: bytes) -> FaultRecord | None:
    """``fault.json`` read back; None while it is being written (empty) or when damaged."""
    try:
        raw = json.loads(data.decode("utf-8") or "null")
        return None if not isinstance(raw, dict) else fault_from_dict(raw)
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def fault_from_dict(raw: Mapping[str, Any]) -> FaultRecord:
    """A :class:`FaultRecord` from its JSON form; TypeError/ValueError when it is not one."""
    kind = str(raw["kind"])
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}")
    last = raw.get("last_progress")
    return FaultRecord(
        kind=kind,
        by=str(raw["by"]),
        time=float(raw["time"]),
        ranks=tuple(int(r) for r in raw["ranks"]),
        nodes=tuple(str(n) for n in raw["nodes"]),
        why=str(raw["why"]),
        node_level=bool(raw.get("node_level")),
        last_progress=None if last is None else float(last),
    )


@dataclass(frozen=True)
class ExitNote:
    """A rank's session's word on how it left (``rank-<r>.exit``, next to its beat).

    Written by the session itself (in the rank's own process, or in a ``command:`` child whose
    parent beats for it), at the moment it knows: when its ``steps`` loop is left before its
    end (a ``break``, a ``sys.exit(0)``), and when it ends with an error. A loop that runs to
    its end writes none, so a normal end of training is never taken for one.
    """

    rank: int
    node: str
    pid: int
    time: float
    step: int
    total: int | None = None
    """The end of the loop it left (``steps(total=...)``); None: no loop left early."""
    error: str | None = None
    """The exception it ended with (its first line), if it did."""

    @property
    def left_early(self) -> bool:
        """It left its training loop before the loop's end, without an error."""
        return self.total is not None and self.error is None and self.step < self.total

    @property
    def lost_a_peer(self) -> bool:
        """Its error is a survivor's complaint about a peer (a lost connection, a wait given
        up), not a fault of its own."""
        return bool(self.error) and PEER_ERROR.search(self.error or "") is not None


EARLY_EXIT_GRACE_S = 5.0
"""How long the other ranks have to leave their training loops too once one rank left its
loop before the end (an early stop every rank agreed on leaves them all within a step), before
the one that left is a fault (at least three beats)."""


def encode_exit_note(note: ExitNote) -> bytes:
    """The note as exactly :data:`BEAT_BYTES` bytes, like a beat (long errors are cut)."""
    data = asdict(note)
    data["v"] = 1
    for cut in (None, 400, 0):
        if cut is not None:
            data["error"] = (note.error or "")[:cut] or None
        text = json.dumps(data, separators=(",", ":")).encode()
        if len(text) < BEAT_BYTES:
            return text.ljust(BEAT_BYTES - 1) + b"\n"
    raise ValueError(f"an exit note of rank {note.rank} does not fit in {BEAT_BYTES} bytes")


def parse_exit_note(data: bytes) -> ExitNote | None:
    """A note read back; None for an empty (none written yet), torn or foreign record."""
    try:
        raw = json.loads(data.decode("utf-8", errors="strict").strip() or "null")
        if not isinstance(raw, dict) or raw.pop("v", None) != 1:
            return None
        return ExitNote(**raw)
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def left_early(
    world: int, beats: Mapping[int, Beat | None], notes: Mapping[int, ExitNote | None]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the ranks that left their training loop before its end, the ranks that went on
    without them): those still running, or gone with an error; () and () when none left early.

    Ranks that all leave their loops together (an early stop every rank agreed on) leave no
    one behind. A rank that ended cleanly without a note ran its loop to the end.
    """
    left = tuple(r for r in range(world) if (n := notes.get(r)) is not None and n.left_early)
    if not left:
        return (), ()
    behind = tuple(
        r
        for r in range(world)
        if r not in left and not ((b := beats.get(r)) is not None and b.exited and b.code == 0)
    )
    return (left, behind) if behind else ((), ())


def early_exit_why(
    left: Sequence[int], behind: Sequence[int], notes: Mapping[int, ExitNote | None]
) -> str:
    """``left its training loop at step 30 of 100 while rank 0 trained on``."""
    note = notes.get(left[0])
    where = f" at step {note.step} of {note.total}" if note is not None else ""
    who = ", ".join(f"rank {r}" for r in behind)
    return (
        f"left its training loop{where} (a break or exit before the loop's end) while {who} "
        "trained on"
    )


class StaleWatch:
    """Which peers stopped beating, by this observer's own monotonic clock (pure).

    A peer counts as beating once its ``seq`` has changed while watched: a record left by an
    earlier launch (or a file made before the peer started) never does, and is covered by the
    start-up deadline instead. Times are the observer's (``now`` passed in), so the clocks of
    other nodes never matter.

    A peer whose last beat says it is still starting is given ``startup_stale_s`` rather than
    ``stale_s``: start-up holds the GIL inside C for seconds at a time (an extension's
    ``dlopen`` from a shared file system, CUDA's initialisation), which stops the beat thread
    of a rank that is not hung. A busy 2-core machine showed ``import torch`` doing so for 4 s.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float, bool]] = {}
        self._starting: dict[int, bool] = {}

    def observe(self, rank: int, beat: Beat | None, now: float) -> None:
        """Note what rank ``rank``'s beat says at ``now`` (None: unreadable, no news)."""
        if beat is None:
            return
        self._starting[rank] = beat.state == STARTING
        seq, since, alive = self._seen.get(rank, (beat.seq, now, False))
        if beat.seq != seq:
            self._seen[rank] = (beat.seq, now, True)
        elif rank not in self._seen:
            self._seen[rank] = (seq, since, alive)

    def quiet_for(self, rank: int, now: float) -> float | None:
        """Seconds since ``rank``'s beat last changed; None until it has changed once."""
        seq_since = self._seen.get(rank)
        if seq_since is None or not seq_since[2]:
            return None
        return now - seq_since[1]

    def stale(
        self, ranks: Sequence[int], now: float, stale_s: float, startup_stale_s: float = 0.0
    ) -> list[int]:
        """The ranks among ``ranks`` that have beaten and then been quiet for ``stale_s`` (for
        ``startup_stale_s``, if longer, while their last beat said they were starting)."""
        quiet = {r: self.quiet_for(r, now) for r in ranks}
        return [
            r
            for r, q in quiet.items()
            if q is not None and q >= self.limit(r, stale_s, startup_stale_s)
        ]

    def limit(self, rank: int, stale_s: float, startup_stale_s: float) -> float:
        """How long ``rank`` may be quiet: ``stale_s``, or ``startup_stale_s`` while starting."""
        return max(stale_s, startup_stale_s) if self._starting.get(rank, False) else stale_s


@dataclass(frozen=True)
class Finding:
    """What :func:`assign_blame` concluded: the cause and whom it points to."""

    cause: EndCause
    blame: Blame


def _nodes(
    ranks: Sequence[int], beats: Mapping[int, Beat | None], ends: Sequence[TaskEnd]
) -> tuple[str, ...]:
    named = {e.rank: e.node for e in ends}
    found = []
    for r in ranks:
        beat = beats.get(r)
        node = beat.node if beat is not None else named.get(r, "?")
        if node not in found:
            found.append(node)
    return tuple(found)


def _progress(ranks: Sequence[int], beats: Mapping[int, Beat | None]) -> float | None:
    times = [b.since for r in ranks if (b := beats.get(r)) is not None and b.since]
    return max(times) if times else None


def _task_end_is_secondary(end: TaskEnd, beat: Beat | None) -> bool:
    """The task only left because of someone else's fault (or ended on purpose)."""
    if end.exit_code is not None and end.exit_code in OWN_OUTCOMES:
        return True
    if end.exit_code in (FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE):
        return True
    return beat is not None and beat.exited and beat.lost_a_peer


def fault_cause(kind: str) -> EndCause:
    """The end cause of a fault of ``kind`` (:data:`FAULT_KINDS`); a kind this hpc-ddp does
    not know (a newer one wrote the record) is a crash."""
    return FAULT_KINDS.get(kind, EndCause.CRASH)


def _fault_finding(
    fault: FaultRecord, beats: Mapping[int, Beat | None], now: float
) -> Finding | None:
    """Step 2: the launch's fault record, unless its culprit only lost a peer."""
    if fault.kind == "crash" and PEER_ERROR.search(fault.why):
        return None
    cause = fault_cause(fault.kind)
    node_level = fault.node_level or bool(HARDWARE_ERROR.search(fault.why))
    blame = Blame(
        fault.ranks,
        fault.nodes or _nodes(fault.ranks, beats, ()),
        fault.why,
        node_level,
        fault.time,
        fault.last_progress,
    )
    return Finding(cause, blame)


def assign_blame(
    world: int,
    beats: Mapping[int, Beat | None],
    *,
    silent: Sequence[int] = (),
    task_ends: Sequence[TaskEnd] = (),
    node_failures: Sequence[tuple[str, str]] = (),
    fault: FaultRecord | None = None,
    settled: bool = False,
    now: float,
) -> Finding:
    """Name the rank(s) and node(s) to blame for a launch's fault (see the module docstring).

    ``beats``: every rank's last beat (None: unreadable or never written); ``silent``: ranks the
    caller saw stop beating; ``task_ends``: tasks that ended badly, in the order they were seen;
    ``node_failures``: (node, evidence) Slurm or srun gave; ``fault``: the launch's fault
    record; ``settled``: the step has ended and frozen processes were woken (SIGCONT), so a rank
    still silent is gone with its node, not merely stopped.
    """
    if node_failures:
        lost = list(dict.fromkeys(n for n, _ in node_failures))
        ranks = tuple(r for r in range(world) if (b := beats.get(r)) is not None and b.node in lost)
        ranks = ranks or tuple(e.rank for e in task_ends if e.node in lost)
        evidence = "; ".join(dict.fromkeys(why for _, why in node_failures))
        blame = Blame(ranks, tuple(lost), evidence, True, now, _progress(ranks, beats))
        return Finding(EndCause.NODE_FAIL, blame)
    if fault is not None and (found := _fault_finding(fault, beats, now)) is not None:
        return found
    quiet = [r for r in silent if not ((b := beats.get(r)) is not None and b.exited)]
    if quiet:
        nodes = _nodes(quiet, beats, task_ends)
        last = _progress(quiet, beats)
        if settled:
            why = (
                "went silent without a word (no exit record, no task end from its node): "
                "killed outright with its node, or the node was lost"
            )
            return Finding(EndCause.NODE_FAIL, Blame(tuple(quiet), nodes, why, True, now, last))
        why = "heartbeat stopped (frozen, killed, or cut off from the run directory)"
        return Finding(EndCause.HANG, Blame(tuple(quiet), nodes, why, False, now, last))
    primary = [e for e in task_ends if not _task_end_is_secondary(e, beats.get(e.rank))]
    if primary:
        first = primary[0]
        beat = beats.get(first.rank)
        said = beat.error if beat is not None and beat.exited and beat.error else None
        why = f"{first.reason} ({first.said_by})" if said is None else f"{said} ({first.reason})"
        node_level = HARDWARE_ERROR.search(why) is not None
        blame = Blame(
            (first.rank,), (first.node,), why, node_level, now, _progress([first.rank], beats)
        )
        return Finding(EndCause.CRASH, blame)
    return _stuck(world, beats, task_ends, now)


def _stuck(
    world: int, beats: Mapping[int, Beat | None], task_ends: Sequence[TaskEnd], now: float
) -> Finding:
    """Steps 5 and 6: the live ranks behind the others, else all of them."""
    live = {r: b for r in range(world) if (b := beats.get(r)) is not None and not b.exited}
    if live:
        low = min(b.step for b in live.values())
        behind = tuple(r for r, b in live.items() if b.step == low)
        if len(behind) < len(live):
            why = f"behind the others: at step {low} while they went on"
            blame = Blame(
                behind, _nodes(behind, beats, ()), why, False, now, _progress(behind, beats)
            )
            return Finding(EndCause.HANG, blame)
        waiting = tuple(r for r in behind if live[r].data_wait)
        if waiting and len(waiting) < len(behind):
            why = (
                f"stuck waiting for its data at step {low}, while the others waited for it in "
                "the step's collectives"
            )
            blame = Blame(
                waiting, _nodes(waiting, beats, ()), why, False, now, _progress(waiting, beats)
            )
            return Finding(EndCause.HANG, blame)
        ranks = tuple(sorted(live))
        why = (
            f"no rank stands out: all stuck at step {low} (each rank's log says where its main "
            "thread stood)"
        )
        return Finding(EndCause.HANG, Blame(ranks, _nodes(ranks, beats, ()), why, False, now, None))
    if task_ends:
        first = task_ends[0]
        why = f"{first.reason} ({first.said_by}); every rank that ended blamed a lost peer"
        return Finding(EndCause.CRASH, Blame((first.rank,), (first.node,), why, False, now, None))
    why = "the step ended with no word from any rank"
    return Finding(EndCause.CRASH, Blame((), (), why, False, now, None))
