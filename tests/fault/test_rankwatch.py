"""A ``command:`` child's place in its launch: torchrun's workers map the launch's faults (whose
numbering is the tasks') onto their own ranks, so the right worker makes the survivor's save."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, cast

import pytest

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.exitcodes import PEER_FAULT_EXIT_CODE
from hpc_ddp.fault.blame import FaultRecord, task_place
from hpc_ddp.fault.listener import FaultListener
from hpc_ddp.fault.rescue import writer_rank
from hpc_ddp.fault.watchdog import Identity, claim_fault
from hpc_ddp.rundir.layout import LaunchPaths


@pytest.mark.parametrize(
    ("given", "rank", "world", "place"),
    [
        (None, 3, 4, (3, 4)),  # one rank per task: the rank is the task
        ("1/2", 2, 4, (1, 2)),  # torchrun: 2 workers per node, node 1 holds ranks 2 and 3
        ("1/2", 3, 4, (1, 2)),
        ("0/2", 2, 4, None),  # a rendezvous that numbered the nodes otherwise: unmappable
        ("1/3", 2, 4, None),  # 4 ranks do not split into 3 tasks
        ("x/2", 0, 4, None),
    ],
)
def test_a_task_place_is_kept_only_where_the_ranks_follow_the_tasks(
    given: str | None, rank: int, world: int, place: tuple[int, int] | None
) -> None:
    assert task_place(given, rank, world) == place


def test_a_blamed_task_blames_every_worker_it_held_and_the_next_node_writes() -> None:
    record = FaultRecord("crash", "supervisor", 1.0, (0,), ("n1",), "worker 1 was killed")
    assert record.for_program(1) is record
    mapped = record.for_program(2)
    assert mapped.ranks == (0, 1)
    assert writer_rank(4, mapped.ranks) == 2  # node 1's first worker, not node 0's second
    assert writer_rank(4, record.ranks) == 1  # what an unmapped record would have picked


def test_the_listener_hands_its_session_the_record_in_the_programs_ranks(tmp_path: Path) -> None:
    launch = LaunchPaths(tmp_path / "launch")
    launch.root.mkdir()
    cfg = FaultConfig(beat_s=0.05, stale_s=1.0)
    seen: list[FaultRecord] = []
    codes: list[int] = []
    ended = threading.Event()

    def exit_(code: int) -> None:  # os._exit's stand-in: the listener's thread then ends
        codes.append(code)
        ended.set()

    listener = FaultListener(
        cfg, launch, Identity(1, 2, "n2"), supervised=False, per_task=2,
        exit=cast("Callable[[int], NoReturn]", exit_),
    )  # fmt: skip

    def on_fault(record: FaultRecord) -> bool:
        seen.append(record)
        return True  # this process saved: it ends

    listener.start(on_fault)
    assert launch.rescue_note(1).exists()  # the parent task 1 waits for this child's save
    time.sleep(0.1)
    claim_fault(launch.fault, FaultRecord("crash", "supervisor", time.time(), (0,), ("n1",), "x"))
    assert ended.wait(5)
    assert [r.ranks for r in seen] == [(0, 1)]
    assert codes == [PEER_FAULT_EXIT_CODE]
