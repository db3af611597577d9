"""Rank 0 first (``Session.main_first``, ``local_main_first``): real gloo ranks, started the way
torchrun starts them, for the order, rank 0's failure and death, and a stop during the wait;
the waiting logic's bound and messages with a store of plain values."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.errors import PeerError
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.runtime.handoff import Turn, leader_first
from tests.helpers.launch import HELPERS, run_ranks, start_ranks

pytestmark = pytest.mark.torch

MAIN_FIRST = str(HELPERS / "main_first.py")
FULL = "".join(f"piece {i}\n" for i in range(5))


def _results(outs: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    for code, _, err in outs:
        assert code == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outs]


def test_rank_0_prepares_first_and_every_other_rank_reads_it_after(tmp_path: Path) -> None:
    """Four ranks on two (pretended) nodes: nobody enters the block before its leader left
    it, so everybody reads the whole file, never a part of it."""
    results = _results(run_ranks([MAIN_FIRST, str(tmp_path), "order"], 4, per_node=2))
    by_rank = {r["rank"]: r for r in results}
    leader_left = by_rank[0]["main"]["left"]
    for r in results:
        assert r["main"]["read"] == FULL
        assert r["local"]["read"] == FULL
        if r["rank"] != 0:
            assert r["main"]["entered"] >= leader_left
    for node_leader, other in ((0, 1), (2, 3)):
        assert by_rank[other]["local"]["entered"] >= by_rank[node_leader]["local"]["left"]
    assert sorted(p.name for p in tmp_path.glob("node-*.txt")) == ["node-0.txt", "node-1.txt"]


def test_rank_0_may_take_longer_than_the_collective_timeout(tmp_path: Path) -> None:
    """The others wait outside any collective: rank 0's block outlasts ``dist.timeout_s`` (a
    tutorial's barrier would time out there) and the group still works afterwards."""
    results = _results(run_ranks([MAIN_FIRST, str(tmp_path), "slow"], 2, timeout=90))
    assert [r["from_rank_0"] for r in results] == [7, 7]


def test_rank_0_failing_in_the_block_fails_every_rank_with_its_reason(tmp_path: Path) -> None:
    began = time.monotonic()
    outs = run_ranks([MAIN_FIRST, str(tmp_path), "raise"], 2, timeout=90)
    (code0, _, err0), (code1, _, err1) = outs
    assert code0 != 0
    assert "ValueError: disk full while caching the dataset" in err0
    assert code1 != 0, err1[-2000:]
    assert "PeerError: rank 1 did not run its main_first block: rank 0 failed in it: " in err1
    assert "ValueError: disk full while caching the dataset" in err1
    assert time.monotonic() - began < 60  # told, not timed out (the block's bound is 120 s)


def test_rank_0_dying_in_the_block_fails_the_others_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    (code0, _, _), (code1, _, err1) = run_ranks([MAIN_FIRST, str(tmp_path), "die"], 2, timeout=90)
    assert code0 == -signal.SIGKILL
    assert code1 != 0
    assert "lost the connection to rank 0's store" in err1, err1[-2000:]
    assert time.monotonic() - began < 60


def test_a_stop_signal_during_the_wait_stops_every_rank_at_the_next_agreement(
    tmp_path: Path,
) -> None:
    """SIGTERM reaches rank 1 while it waits for rank 0's block: it is only recorded, nothing
    hangs, and both ranks stop together at the first agreement that is read: the one launched
    after step 1, read after step 2 (the step loop reads each agreement one boundary later, so
    a GPU never waits for it); the attempt recorded once."""
    ranks = start_ranks([MAIN_FIRST, str(tmp_path), "stop"], 2)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "waiting-1").exists():
            assert time.monotonic() < deadline, "rank 1 never reached the block"
            assert all(p.poll() is None for p in ranks.procs)
            time.sleep(0.05)
        time.sleep(0.3)  # inside the wait by now
        ranks.procs[1].send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert ranks.procs[1].poll() is None, "the signal killed the waiting rank"
        go = time.time()
        (tmp_path / "go").write_text("")
        results = _results(ranks.wait(60))
    finally:
        ranks.kill()
    for r in results:
        assert r["left"] >= go
        assert (r["stopped_at"], r["signal"], r["code"]) == (2, int(signal.SIGTERM), 0)
    [attempt] = read_ledger(tmp_path / "ledger.jsonl")
    assert (attempt.cause, attempt.steps_done) == (EndCause.CANCELLED, 2)


def test_the_built_in_trainer_stops_every_rank_with_rank_0s_dataset_error(
    tmp_path: Path,
) -> None:
    train = {"dataset": "imagefolder", "data_root": str(tmp_path / "nope"), "max_steps": 5}
    argv = [str(HELPERS / "train_run.py"), str(tmp_path / "run"), json.dumps(train)]
    outs = run_ranks(argv, 2, timeout=90)
    assert outs[0][0] != 0
    assert "has no train/ directory" in outs[0][2]
    assert outs[1][0] != 0
    # Rank 1 learns it from rank 0's word in the store, or from the crash rank 0's watchdog
    # declared, whichever comes first; either way it names rank 0's error.
    assert "ConfigError" in outs[1][2]
    assert "has no train/ directory" in outs[1][2]


# --- the wait itself, with a store of plain values --------------------------------------------


class DictStore:
    """The three store calls the wait makes, over a dict (``fail``: the connection broke)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.fail = False

    def check(self, keys: list[str]) -> bool:
        if self.fail:
            raise RuntimeError("Connection reset by peer\nmore lines")
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()


def _turn(leader: bool, timeout_s: float = 5.0) -> Turn:
    return Turn("k/1", leader, "rank 0", 0 if leader else 3, timeout_s)


def test_the_leader_posts_done_or_its_error_and_still_raises() -> None:
    store = DictStore()
    with leader_first(store, _turn(True)):
        pass
    assert json.loads(store.values["k/1"]) == {"done": True}
    store = DictStore()
    with pytest.raises(KeyError), leader_first(store, _turn(True)):
        raise KeyError("no such shard")
    assert json.loads(store.values["k/1"]) == {"error": "KeyError: 'no such shard'"}


def test_a_waiter_runs_the_block_only_after_done_and_raises_the_leaders_error() -> None:
    store = DictStore()
    ran: list[float] = []
    slept: list[float] = []

    def sleep(s: float) -> None:  # the leader finishes during the third pause
        slept.append(s)
        if len(slept) == 3:
            store.set("k/1", json.dumps({"done": True}))

    with leader_first(store, _turn(False), sleep=sleep):
        ran.append(time.monotonic())
    assert len(ran) == 1
    assert len(slept) == 3
    assert slept == sorted(slept)  # backing off
    store.set("k/1", json.dumps({"error": "ConfigError: bad root. HINT: stage it."}))
    with pytest.raises(PeerError) as info, leader_first(store, _turn(False)):
        ran.append(0.0)
    assert len(ran) == 1
    assert str(info.value) == (
        "rank 3 did not run its main_first block: rank 0 failed in it: ConfigError: bad root. "
        "HINT: stage it."
    )
    store.set("k/1", json.dumps({"error": "ValueError: boom"}))
    boom = r"ValueError: boom HINT: its traceback is in its own"
    with pytest.raises(PeerError, match=boom), leader_first(store, _turn(False)):
        pass


def test_a_waiter_gives_up_at_its_bound_or_when_the_store_is_gone() -> None:
    slept: list[float] = []
    began = time.monotonic()
    bound = r"waited 0.3 s for rank 0 .* HINT: .*timeout_s"
    with (
        pytest.raises(PeerError, match=bound),
        leader_first(DictStore(), _turn(False, 0.3), sleep=slept.append),
    ):
        pass
    # the fake sleep returns at once: the bound is real time, so it polled until 0.3 s passed
    assert time.monotonic() - began >= 0.3
    assert slept
    store = DictStore()
    store.fail = True
    gone = r"RuntimeError: Connection reset by peer\): rank 0 died"
    with pytest.raises(PeerError, match=gone), leader_first(store, _turn(False)):
        pass


def test_alone_there_is_nothing_to_wait_for() -> None:
    with leader_first(None, _turn(False, 0.0)):
        ran = True
    assert ran
