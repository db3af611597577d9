"""The supervisor's fault detection: a rank killed while its node does not answer is a lost
node at once, not a crash (the real node loss is in ``test_faults_e2e.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.config.model import FaultConfig
from hpc_ddp.fault.blame import ALIVE, RESCUE_PHASE, Beat, FaultRecord, StaleWatch
from hpc_ddp.fault.detection import Detection
from hpc_ddp.fault.supervisor import prepare_launch
from hpc_ddp.rundir.layout import RunPaths


def _find(tmp_path: Path, end: TaskEnd, answers: dict[str, bool | None]) -> FaultRecord | None:
    launch = RunPaths(tmp_path).launch("42.0.0")
    prepare_launch(launch, 2)
    found = Detection(launch, 2, FaultConfig(), time.time, answers=answers.get).find(
        lost=[], new_ends=[end], ends=[end], beats={}, notes={}, quiet=StaleWatch(),
        mono=time.monotonic(), waited=1.0,
    )  # fmt: skip
    return found


def test_a_rank_killed_with_a_silent_node_is_that_nodes_loss(tmp_path: Path) -> None:
    record = _find(tmp_path, TaskEnd(1, "n2", "Killed"), {"n2": False})
    assert record is not None
    assert (record.kind, record.nodes, record.ranks, record.node_level) == (
        "node_fail",
        ("n2",),
        (1,),
        True,
    )
    assert "n2's slurmd does not answer" in record.why


def test_a_rank_killed_on_a_node_that_answers_is_the_ranks_crash(tmp_path: Path) -> None:
    for answer in (True, None):  # None: the launcher cannot tell, so no node is blamed
        record = _find(tmp_path / str(answer), TaskEnd(1, "n2", "Killed"), {"n2": answer})
        assert record is not None
        assert (record.kind, record.node_level) == ("task_failed", False)


def test_an_exit_status_never_asks_the_node(tmp_path: Path) -> None:
    asked: list[str] = []

    def answers(node: str) -> bool:
        asked.append(node)
        return False

    launch = RunPaths(tmp_path).launch("42.0.0")
    prepare_launch(launch, 2)
    end = TaskEnd(1, "n2", "Exited with exit code 1", exit_code=1)
    record = Detection(launch, 2, FaultConfig(), time.time, answers=answers).fault_from([], [end])
    assert record is not None
    assert record.kind == "task_failed"
    assert asked == []  # the program's own exit says nothing of its node


def test_a_rank_quiet_in_its_start_up_is_a_hang_only_after_startup_stale_s(tmp_path: Path) -> None:
    launch = RunPaths(tmp_path).launch("42.0.0")
    prepare_launch(launch, 2)
    fault = FaultConfig(stale_s=4.0, startup_stale_s=30.0)
    detection = Detection(launch, 2, fault, time.time, answers=lambda node: True)
    quiet = StaleWatch()
    beats = {
        0: Beat(rank=0, node="n1", pid=10, seq=2, time=0.0, state=ALIVE),
        1: Beat(rank=1, node="n2", pid=11, seq=2, time=0.0),  # still importing, say
    }
    for r, b in beats.items():
        quiet.observe(r, Beat(rank=r, node=b.node, pid=b.pid, seq=1, time=0.0), 0.0)
        quiet.observe(r, b, 1.0)

    def beats_again(mono: float) -> None:  # rank 0 trains on
        beats[0] = Beat(rank=0, node="n1", pid=10, seq=int(mono), time=0.0, state=ALIVE)
        quiet.observe(0, beats[0], mono)

    def find(mono: float) -> FaultRecord | None:
        return detection.find(
            lost=[], new_ends=[], ends=[], beats=beats, notes={}, quiet=quiet, mono=mono,
            waited=mono,
        )  # fmt: skip

    beats_again(9.0)
    assert find(10.0) is None  # 9 s quiet while starting: under startup_stale_s
    beats_again(31.0)
    record = find(31.5)
    assert record is not None
    assert (record.kind, record.ranks) == ("hang", (1,))


LOST = "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:9365: Connection reset by peer"


def _rescuing_and_silent(
    tmp_path: Path, answers: dict[str, bool | None], *, saving: bool = True
) -> tuple[Detection, dict[int, Beat | None], StaleWatch]:
    """Rank 0 is saving the last step, or (``saving`` False) waits for the fault with the lost
    connection in its beat; rank 1 has not beaten for 2 s."""
    launch = RunPaths(tmp_path).launch("42.0.0")
    prepare_launch(launch, 2)
    detection = Detection(launch, 2, FaultConfig(), time.time, answers=answers.get)
    quiet = StaleWatch()
    survivor = (
        {"phase": RESCUE_PHASE} if saving else {"phase": "step", "error": LOST}
    )  # fmt: skip
    beats: dict[int, Beat | None] = {
        0: Beat(rank=0, node="n1", pid=10, seq=5, time=0.0, state=ALIVE, **survivor),  # type: ignore[arg-type]
        1: Beat(rank=1, node="n2", pid=11, seq=4, time=0.0, state=ALIVE),
    }
    for r, b in beats.items():
        assert b is not None
        quiet.observe(r, Beat(rank=r, node=b.node, pid=b.pid, seq=1, time=0.0, state=ALIVE), -1)
        quiet.observe(r, b, 0.0 if r == 1 else 2.0)  # rank 1's last beat change: at 0.0
    return detection, beats, quiet


def test_a_silent_rank_whose_node_refuses_while_its_peer_rescues_is_a_lost_node_at_once(
    tmp_path: Path,
) -> None:
    """Not after fault.stale_s (4 s): the survivor's rescue says it lost the peer, and the
    peer's node does not answer."""
    for saving in (True, False):
        detection, beats, quiet = _rescuing_and_silent(
            tmp_path / str(saving), {"n2": False}, saving=saving
        )
        record = detection.find(
            lost=[], new_ends=[], ends=[], beats=beats, notes={}, quiet=quiet, mono=2.0,
            waited=30.0,
        )  # fmt: skip
        assert record is not None
        assert (record.kind, record.ranks, record.nodes) == ("node_fail", (1,), ("n2",))
        assert "does not answer" in record.why


def test_a_silent_rank_on_a_node_that_answers_waits_for_srun_or_stale_s(tmp_path: Path) -> None:
    """A killed rank's word from srun may be late: with its node answering, the silence is
    no node loss (and no hang before stale_s)."""
    for answer in (True, None):
        detection, beats, quiet = _rescuing_and_silent(tmp_path / str(answer), {"n2": answer})
        found = detection.find(
            lost=[], new_ends=[], ends=[], beats=beats, notes={}, quiet=quiet, mono=2.0,
            waited=30.0,
        )  # fmt: skip
        assert found is None
