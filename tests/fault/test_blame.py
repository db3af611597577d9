"""Beats, fault records and blame (pure): who a fault points to, from every kind of evidence.

The cases are the ones seen on the dev cluster (and in the design's measurements): a frozen
rank, a rank killed outright while its survivor complains of a reset connection, a node lost
with its step daemon, srun naming the survivor first, a Python exception, a rank behind the
others, and all ranks stuck alike.
"""

from __future__ import annotations

import pytest

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.exitcodes import FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE
from hpc_ddp.fault.blame import (
    ALIVE,
    BEAT_BYTES,
    EXITED,
    FAULT_KINDS,
    Beat,
    FaultRecord,
    StaleWatch,
    assign_blame,
    encode_beat,
    encode_fault,
    fault_cause,
    parse_beat,
    parse_fault,
)
from hpc_ddp.rundir.endcause import EndCause

RESET = (
    "RuntimeError: [../gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:23973: "
    "Connection reset by peer"
)


def beat(rank: int, node: str, **kw: object) -> Beat:
    fields: dict[str, object] = {"pid": 100 + rank, "seq": 5, "time": 10.0, "step": 150}
    fields.update(kw)
    return Beat(rank=rank, node=node, **fields)  # type: ignore[arg-type]


def exited(rank: int, node: str, code: int, error: str | None = None) -> Beat:
    return beat(rank, node, state=EXITED, code=code, error=error)


# --- the record formats --------------------------------------------------------------------


def test_a_beat_round_trips_at_a_fixed_size_with_its_fault() -> None:
    record = FaultRecord("hang", "rank 0 on n1", 12.5, (1,), ("n2",), "heartbeat stopped", False)
    b = beat(1, "n2", fault=record, error="x" * 5000, slurm_step="3")
    data = encode_beat(b)
    assert len(data) == BEAT_BYTES
    assert data.endswith(b"\n")
    back = parse_beat(data)
    assert back is not None
    assert (back.rank, back.node, back.step, back.slurm_step, back.fault) == (
        1, "n2", 150, "3", record,
    )  # fmt: skip
    assert back.error is not None
    assert len(back.error) < 1000


@pytest.mark.parametrize(
    "data",
    [b"", b" " * BEAT_BYTES, b'{"v": 1, "rank": 0', b'{"v": 2, "rank": 0}', b"\xff\xfe", b"[1]"],
)
def test_a_torn_empty_or_foreign_beat_is_no_news(data: bytes) -> None:
    assert parse_beat(data) is None


def test_a_fault_record_round_trips_and_an_unknown_kind_is_none() -> None:
    record = FaultRecord("crash", "rank 1 on n2", 3.0, (1,), ("n2",), "ValueError: x", False, 2.0)
    assert parse_fault(encode_fault(record)) == record
    assert parse_fault(encode_fault(record).replace(b'"crash"', b'"boom"')) is None
    assert parse_fault(b"") is None  # being written: not yet a record


def test_stale_counts_only_peers_seen_beating_by_the_observers_own_clock() -> None:
    watch = StaleWatch()
    old = beat(1, "n2", seq=7)  # left by an earlier launch: never changes
    watch.observe(1, old, now=100.0)
    watch.observe(1, old, now=200.0)
    assert watch.stale([1], now=200.0, stale_s=10) == []  # never seen alive: start-up's job
    watch.observe(1, beat(1, "n2", seq=8), now=201.0)
    watch.observe(1, None, now=205.0)  # an unreadable read is no news, not a change
    watch.observe(1, beat(1, "n2", seq=8), now=210.0)
    assert watch.quiet_for(1, now=210.0) == 9.0  # unchanged since 201
    assert watch.stale([1], now=210.0, stale_s=10) == []
    assert watch.stale([1], now=211.0, stale_s=10) == [1]
    watch.observe(1, beat(1, "n2", seq=9), now=212.0)
    assert watch.stale([1], now=212.0, stale_s=10) == []


def test_a_peer_still_starting_may_be_quiet_for_startup_stale_s_and_then_only_stale_s() -> None:
    # import torch held a busy machine's GIL for 4 s (the beat thread with it): not a hang
    watch = StaleWatch()
    watch.observe(1, beat(1, "n2", seq=1), now=100.0)
    watch.observe(1, beat(1, "n2", seq=2), now=101.0)  # starting (the default state)
    assert watch.stale([1], now=106.0, stale_s=4, startup_stale_s=30) == []
    assert watch.stale([1], now=131.0, stale_s=4, startup_stale_s=30) == [1]
    assert watch.stale([1], now=106.0, stale_s=4) == [1]  # no start-up allowance asked for
    watch.observe(1, beat(1, "n2", seq=3, state=ALIVE), now=140.0)  # its first steps
    assert watch.stale([1], now=144.0, stale_s=4, startup_stale_s=30) == [1]
    assert watch.stale([1], now=143.0, stale_s=4, startup_stale_s=30) == []
    assert watch.limit(1, stale_s=40, startup_stale_s=30) == 40  # the longer one applies


# --- blame ---------------------------------------------------------------------------------


def test_a_frozen_rank_is_the_hang_not_the_peer_that_waited_for_it() -> None:
    beats = {0: beat(0, "n1", step=151), 1: beat(1, "n2", step=150)}
    found = assign_blame(2, beats, silent=[1], now=20.0)
    assert found.cause is EndCause.HANG
    assert (found.blame.ranks, found.blame.nodes) == ((1,), ("n2",))


def test_a_killed_rank_is_blamed_and_its_survivors_reset_connection_is_not() -> None:
    """srun names the survivor first (it reported its exit first): its own words show it only
    lost a peer, so the rank srun saw killed is the one."""
    beats = {0: exited(0, "n1", 1, RESET), 1: beat(1, "n2")}
    ends = [
        TaskEnd(0, "n1", "Exited with exit code 1", 1),
        TaskEnd(1, "n2", "Killed", None),
    ]
    found = assign_blame(2, beats, task_ends=ends, now=20.0)
    assert found.cause is EndCause.CRASH
    assert (found.blame.ranks, found.blame.nodes, found.blame.evidence) == (
        (1,), ("n2",), "Killed (srun)",
    )  # fmt: skip
    assert not found.blame.node_level  # a task killed on a live node: not the node's fault


def test_ranks_that_left_for_a_declared_fault_are_never_the_culprit() -> None:
    beats = {0: exited(0, "n1", FAULT_EXIT_CODE), 1: exited(1, "n2", 1, "ValueError: bad batch")}
    ends = [
        TaskEnd(0, "n1", f"Exited with exit code {FAULT_EXIT_CODE}", FAULT_EXIT_CODE),
        TaskEnd(1, "n2", "Exited with exit code 1", 1),
    ]
    found = assign_blame(2, beats, task_ends=ends, now=20.0)
    assert found.blame.ranks == (1,)
    assert found.blame.evidence == "ValueError: bad batch (Exited with exit code 1)"
    peer = exited(0, "n1", PEER_FAULT_EXIT_CODE)
    assert peer.lost_a_peer


def test_a_lost_node_is_its_own_cause_and_beats_any_other_evidence() -> None:
    beats = {0: exited(0, "n1", 1, RESET), 1: beat(1, "n2")}
    fault = FaultRecord("task_failed", "supervisor", 5.0, (0,), ("n1",), "x", False)
    found = assign_blame(
        2,
        beats,
        task_ends=[TaskEnd(0, "n1", "Exited with exit code 1", 1)],
        node_failures=[("n2", "srun: Node failure")],
        fault=fault,
        now=30.0,
    )
    assert found.cause is EndCause.NODE_FAIL
    assert (found.blame.ranks, found.blame.nodes, found.blame.node_level) == ((1,), ("n2",), True)


def test_a_rank_still_silent_after_the_step_ended_was_lost_with_its_node() -> None:
    beats = {0: exited(0, "n1", 1, RESET), 1: beat(1, "n2")}
    ends = [TaskEnd(0, "n1", "Exited with exit code 1", 1)]
    live = assign_blame(2, beats, silent=[1], task_ends=ends, now=9.0)
    settled = assign_blame(2, beats, silent=[1], task_ends=ends, settled=True, now=9.0)
    assert (live.cause, settled.cause) == (EndCause.HANG, EndCause.NODE_FAIL)
    assert settled.blame.ranks == (1,)
    assert settled.blame.node_level


def test_the_fault_record_speaks_first_unless_its_culprit_only_lost_a_peer() -> None:
    beats = {0: beat(0, "n1"), 1: beat(1, "n2")}
    crash = FaultRecord("crash", "rank 1 on n2", 5.0, (1,), ("n2",), "ValueError: x", False)
    assert assign_blame(2, beats, fault=crash, now=9.0).blame.ranks == (1,)
    peer = FaultRecord("crash", "rank 0 on n1", 5.0, (0,), ("n1",), RESET, False)
    ends = [TaskEnd(1, "n2", "Segmentation fault", None)]
    found = assign_blame(2, beats, fault=peer, task_ends=ends, now=9.0)
    assert found.blame.ranks == (1,)  # srun's word wins over a survivor's complaint
    hw = FaultRecord(
        "crash",
        "rank 1 on n2",
        5.0,
        (1,),
        ("n2",),
        "CUDA error: uncorrectable ECC error encountered",
        False,
    )
    assert assign_blame(2, beats, fault=hw, now=9.0).blame.node_level


KIND_CAUSES = {
    "hang": EndCause.HANG,
    "startup": EndCause.HANG,
    "crash": EndCause.CRASH,
    "task_failed": EndCause.CRASH,
    "node_fail": EndCause.NODE_FAIL,
    "early_exit": EndCause.CRASH,
}


@pytest.mark.parametrize(("kind", "cause"), list(KIND_CAUSES.items()))
def test_every_fault_kind_has_one_cause_for_the_supervisor_and_the_rank(
    kind: str, cause: EndCause
) -> None:
    """One map: the supervisor's verdict on a fault record and a rank's own end for it (the
    session's) never disagree on what a kind is."""
    assert set(FAULT_KINDS) == set(KIND_CAUSES)
    assert fault_cause(kind) is cause
    record = FaultRecord(kind, "supervisor", 5.0, (1,), ("n2",), "it went", False)
    beats = {0: beat(0, "n1"), 1: beat(1, "n2")}
    assert assign_blame(2, beats, fault=record, now=9.0).cause is cause
    assert fault_cause("from_a_newer_hpc_ddp") is EndCause.CRASH


def test_a_rank_behind_the_others_is_the_hang_and_all_alike_name_every_rank() -> None:
    behind = {0: beat(0, "n1", step=151), 1: beat(1, "n2", step=150), 2: beat(2, "n3", step=151)}
    found = assign_blame(3, behind, now=9.0)
    assert (found.cause, found.blame.ranks) == (EndCause.HANG, (1,))
    assert found.blame.evidence.startswith("behind the others")
    alike = {0: beat(0, "n1"), 1: beat(1, "n2")}
    found = assign_blame(2, alike, now=9.0)
    assert (found.cause, found.blame.ranks, found.blame.nodes) == (
        EndCause.HANG, (0, 1), ("n1", "n2"),
    )  # fmt: skip
    assert "no rank stands out" in found.blame.evidence


def test_an_exit_note_round_trips_at_a_fixed_size() -> None:
    from hpc_ddp.fault.blame import ExitNote, encode_exit_note, parse_exit_note

    note = ExitNote(1, "n2", 4242, 100.0, 30, 100, None)
    data = encode_exit_note(note)
    assert len(data) == BEAT_BYTES
    assert parse_exit_note(data) == note
    assert note.left_early
    assert not note.lost_a_peer
    long = ExitNote(1, "n2", 1, 1.0, 3, None, "PeerError: " + "x" * 5000)
    back = parse_exit_note(encode_exit_note(long))
    assert back is not None
    assert back.lost_a_peer
    assert not back.left_early
    assert parse_exit_note(b" " * (BEAT_BYTES - 1) + b"\n") is None  # made, not written yet


def test_a_rank_that_left_its_loop_early_is_named_unless_every_rank_did() -> None:
    from hpc_ddp.fault.blame import ExitNote, left_early

    def note(rank: int, step: int = 30, total: int | None = 100) -> ExitNote:
        return ExitNote(rank, f"n{rank + 1}", 1, 1.0, step, total, None)

    running = {0: beat(0, "n1", step=30), 1: beat(1, "n2", step=30)}
    assert left_early(2, running, {0: None, 1: note(1)}) == ((1,), (0,))
    # An early stop every rank agreed on, or a loop run to its end, leaves nobody behind.
    assert left_early(2, running, {0: note(0), 1: note(1)}) == ((), ())
    assert left_early(2, running, {0: None, 1: note(1, step=100)}) == ((), ())
    assert left_early(2, running, {0: None, 1: None}) == ((), ())
    # A peer that ended cleanly ran its own loop to the end; one that ended with an error
    # (it lost the rank that left) was left behind.
    done = {0: exited(0, "n1", 0), 1: beat(1, "n2")}
    assert left_early(2, done, {0: None, 1: note(1)}) == ((), ())
    lost = {0: exited(0, "n1", 1, RESET), 1: beat(1, "n2")}
    assert left_early(2, lost, {0: None, 1: note(1)}) == ((1,), (0,))


def test_among_ranks_stuck_in_one_step_the_one_waiting_for_its_data_is_the_hang() -> None:
    """Rank 1 waits for its batch (its data source hangs) while rank 0, which has its batch,
    waits for rank 1 in the step's all-reduce: both are at the same step, but rank 1 holds the
    other up. All waiting for data, or none, and no rank stands out."""
    stuck = {0: beat(0, "n1"), 1: beat(1, "n2", data_wait=True)}
    found = assign_blame(2, stuck, now=9.0)
    assert (found.cause, found.blame.ranks, found.blame.nodes) == (EndCause.HANG, (1,), ("n2",))
    assert found.blame.evidence.startswith("stuck waiting for its data at step 150")
    for alike in (False, True):
        both = {0: beat(0, "n1", data_wait=alike), 1: beat(1, "n2", data_wait=alike)}
        assert assign_blame(2, both, now=9.0).blame.ranks == (0, 1)
    assert parse_beat(encode_beat(stuck[1])) == stuck[1]  # the beat carries it
