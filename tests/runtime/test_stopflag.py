"""The stop flag: handlers only record; all ranks agree on one stop at the same step."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from hpc_ddp.runtime.stopflag import AgreementCadence, StopFlag, decode, encode
from tests.helpers.launch import HELPERS, start_ranks

pytestmark = pytest.mark.torch

USR2, TERM, INT = int(signal.SIGUSR2), int(signal.SIGTERM), int(signal.SIGINT)


@pytest.mark.parametrize(
    ("seen", "agreed"),
    [
        ([], None),
        ([USR2], USR2),
        ([USR2, TERM], TERM),  # Slurm ending the job beats the time-limit warning
        ([TERM, USR2], TERM),
        ([INT, USR2], INT),
        ([TERM, INT], TERM),
        ([int(signal.SIGUSR1)], int(signal.SIGUSR1)),
    ],
)
def test_the_most_final_signal_wins(seen: list[int], agreed: int | None) -> None:
    """The MAX all-reduce over encoded values picks the same winner as this local max."""
    assert decode(max((encode(s) for s in seen), default=0)) == agreed


def test_handlers_record_only_and_are_restored() -> None:
    calls: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        del frame
        calls.append(signum)

    old = signal.signal(signal.SIGUSR2, previous)
    try:
        flag = StopFlag([USR2, TERM]).install()
        assert flag.received is None
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.received == USR2
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, the process lives on
        assert flag.received == TERM
        os.kill(os.getpid(), signal.SIGUSR2)  # a later, weaker signal does not demote it
        assert flag.received == TERM
        assert calls == []  # the previous handler is not chained
        assert flag.agree() == TERM  # no process group: the local answer
        flag.close()
        assert signal.getsignal(signal.SIGUSR2) is previous
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [USR2]
    finally:
        signal.signal(signal.SIGUSR2, old)


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.1)  # the handler runs at the next bytecode boundary, surely by now


def test_second_sigint_interrupts() -> None:
    with StopFlag([INT]) as flag:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.received == INT
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)


def test_request_from_code_is_agreed_and_kept() -> None:
    flag = StopFlag([])
    assert flag.agree() is None
    flag.request(USR2)
    assert flag.agree() == USR2
    assert flag.agreed == USR2


def _run_pair(
    tmp_path: Path, send: Callable[[list[int]], None], *mode: str
) -> list[dict[str, Any]]:
    ranks = start_ranks([str(HELPERS / "stop_agree.py"), str(tmp_path), *mode], 2)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"rank-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "ranks never got going"
            assert all(p.poll() is None for p in ranks.procs), ranks.wait(5)
            time.sleep(0.02)
        send([p.pid for p in ranks.procs])
        results = ranks.wait(30)
    finally:
        ranks.kill()
    for code, _, err in results:
        assert code == 0, err[-3000:]
    return [json.loads(out) for _, out, _ in results]


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.13])
def test_signal_to_one_rank_stops_both_at_the_same_step(tmp_path: Path, delay: float) -> None:
    """A real SIGUSR2 to rank 1 only (often while rank 0 is blocked in an all-reduce)."""

    def send(pids: list[int]) -> None:
        time.sleep(delay + random.uniform(0, 0.01))
        os.kill(pids[1], signal.SIGUSR2)

    r0, r1 = _run_pair(tmp_path, send)
    assert r0["step"] == r1["step"] >= 20
    assert r0["signal"] == r1["signal"] == USR2


def test_different_signals_on_two_ranks_agree_on_term(tmp_path: Path) -> None:
    def send(pids: list[int]) -> None:
        os.kill(pids[0], signal.SIGUSR2)
        os.kill(pids[1], signal.SIGTERM)

    r0, r1 = _run_pair(tmp_path, send)
    assert r0["step"] == r1["step"]
    assert r0["signal"] == r1["signal"] == TERM


def test_with_the_cadence_ranks_agree_at_the_same_sparse_steps(tmp_path: Path) -> None:
    """~2 ms steps: the ranks agree about every 0.1 s, at the same steps, and still stop
    together at one of them."""

    def send(pids: list[int]) -> None:
        time.sleep(0.5)
        os.kill(pids[1], signal.SIGUSR2)

    r0, r1 = _run_pair(tmp_path, send, "cadence")
    assert r0["agreed_at"] == r1["agreed_at"]
    assert r0["step"] == r1["step"] == r0["agreed_at"][-1]
    assert r0["signal"] == r1["signal"] == USR2
    gaps = [b - a for a, b in itertools.pairwise(r0["agreed_at"])]
    assert max(gaps) > 5  # sparse: far fewer all-reduces than steps
    assert len(r0["agreed_at"]) < r0["step"] / 5


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.5])
def test_read_one_agreement_later_ranks_still_stop_at_the_same_step(
    tmp_path: Path, delay: float
) -> None:
    """The step loop's way: each agreement is launched at one boundary and read at the next
    (so a GPU never waits for it); the ranks still agree at the same steps and stop together,
    one agreement after the signal at most."""

    def send(pids: list[int]) -> None:
        time.sleep(delay)
        os.kill(pids[1], signal.SIGUSR2)

    r0, r1 = _run_pair(tmp_path, send, "lagged")
    assert r0["agreed_at"] == r1["agreed_at"]
    assert r0["step"] == r1["step"] == r0["agreed_at"][-1]
    assert r0["signal"] == r1["signal"] == USR2
    # Sparse (not every step), though a stop 12 steps after the first 20 leaves the cadence's
    # first, dense agreements a large share on a loaded machine (7 of 32 seen).
    assert len(r0["agreed_at"]) < r0["step"] / 2


def test_an_agreement_in_flight_is_read_later() -> None:
    """Without a process group the launch carries this rank's record until it is collected;
    a signal recorded after the launch waits for the next agreement."""
    flag = StopFlag([])
    flag.launch(every=5)
    flag.request(signal.SIGUSR2)
    assert flag.in_flight
    assert flag.collect() is None  # launched before the request
    assert (flag.every, flag.in_flight) == (5, False)
    flag.launch()
    assert flag.collect() == USR2
    flag.launch()  # nothing more is launched once a stop is agreed
    assert not flag.in_flight


@pytest.mark.parametrize(
    ("per_step_s", "expected"),
    [(1.0, 1), (0.1, 1), (0.04, 2), (0.01, 10), (0.00005, 1000), (1e-9, 1000)],
)
def test_the_cadence_proposes_a_tenth_of_a_second_of_steps(
    per_step_s: float, expected: int
) -> None:
    cadence = AgreementCadence()
    assert cadence.due(1)
    assert cadence.propose(1, now=100.0) == 1  # nothing measured yet
    cadence.agreed(1, 1, now=100.0)
    assert not cadence.due(1)
    assert cadence.due(2)
    assert cadence.propose(11, now=100.0 + 10 * per_step_s) == expected


def test_the_cadence_follows_the_common_interval_and_a_pin() -> None:
    cadence = AgreementCadence()
    cadence.agreed(10, 7, now=0.0)  # the ranks' smallest proposal, from the all-reduce
    assert [s for s in range(10, 30) if cadence.due(s)] == list(range(17, 30))
    pinned = AgreementCadence(fixed=1)
    pinned.agreed(10, 1, now=0.0)
    assert pinned.propose(11, now=0.0001) == 1
    assert pinned.due(11)


def test_one_process_agrees_on_its_own_proposal() -> None:
    flag = StopFlag([])
    assert flag.agree(every=40) is None
    assert flag.every == 40


def test_collective_device_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from hpc_ddp.runtime.procgroup import collective_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collective_device("nccl") == torch.device("cuda", 3)
    assert collective_device("gloo") == torch.device("cpu")


def test_agree_without_a_device_puts_its_tensor_where_the_backend_wants_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under NCCL a CPU tensor fails ("No backend type associated with device type cpu"), so
    ``agree()`` with no device asks the group's backend. A one-rank gloo group stands in for
    NCCL (``get_backend`` says nccl) and 'meta' for the rank's GPU."""
    from datetime import timedelta

    import torch
    import torch.distributed as tdist

    from hpc_ddp.runtime import stopflag

    store = tdist.HashStore()  # type: ignore[attr-defined]  # public; stubs omit it
    tdist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=5)
    )
    asked: list[str] = []
    placed: list[torch.device] = []

    def device_for(backend: str) -> torch.device:
        asked.append(backend)
        return torch.device("meta")

    monkeypatch.setattr(tdist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(stopflag, "collective_device", device_for)

    class Done:
        def wait(self) -> None:
            pass

    def all_reduce(t: torch.Tensor, **kw: object) -> Done:
        placed.append(t.device)
        return Done()

    monkeypatch.setattr(tdist, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: [0, -1])
    try:
        assert StopFlag([]).agree() is None
        StopFlag([]).agree("cpu")  # an explicit device is used as given
    finally:
        monkeypatch.undo()
        tdist.destroy_process_group()
    assert asked == ["nccl"]
    assert placed == [torch.device("meta"), torch.device("cpu")]
