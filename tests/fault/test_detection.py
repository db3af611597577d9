"""The supervisor's fault detection: a rank killed while its node does not answer is a lost
node at once, not a crash (the real node loss is in ``test_faults_e2e.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.fault.blame import FaultRecord, StaleWatch, TaskEnd
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
