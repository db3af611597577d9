"""The ledger's ``checkpoint`` line keeps W (``durable_s``) and the auto interval in force, and
ledgers written before they were kept still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpc_ddp.rundir.attempt import AutoInterval
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.ledger_events import LaunchId, checkpoint_event, launch_event, start_event

JOB: dict[str, Any] = {"job_id": "42", "job_ref": "42"}
KEY = LaunchId("42", "42", 0)
AUTO = AutoInterval(95.25, 381, 0.25, 28800.0, "prior", 12.0)


def _ledger(path: Path, *lines: str) -> None:
    head = [
        launch_event(launch_id=KEY, nodes="n1", alloc_nodes=1, excluded=[],
                     world_size=2, from_step=None, now=1.0),
        start_event(attempt=0, launch_id=KEY, nodelist="n1", world_size=2, resumed_from_step=None,
                    checkpoint=None, now=2.0),
    ]  # fmt: skip
    path.write_text("".join([*head, *lines]))


def test_w_and_the_auto_interval_round_trip_through_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _ledger(
        path,
        checkpoint_event(launch_id=KEY, step=10, stall_s=0.25, durable_s=1.5,
                         auto=AUTO, now=3.0),
        checkpoint_event(launch_id=KEY, step=20, stall_s=0.5, durable_s=2.0,
                         now=4.0),
    )  # fmt: skip
    [attempt] = read_ledger(path)
    first, second = attempt.saves
    assert (first.step, first.stall_s, first.durable_s, first.auto) == (10, 0.25, 1.5, AUTO)
    assert (second.durable_s, second.auto) == (2.0, None)


def test_a_ledger_from_before_w_was_kept_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    old = {"event": "checkpoint", **JOB, "restart": 0, "launch": 0, "time": 3.0, "step": 10,
           "stall_s": 0.012}  # fmt: skip
    _ledger(path, json.dumps(old) + "\n")
    [attempt] = read_ledger(path)
    [save] = attempt.saves
    assert (save.step, save.stall_s, save.durable_s, save.auto) == (10, 0.012, None, None)


def test_a_damaged_auto_part_is_read_as_none_and_the_save_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    line = json.loads(checkpoint_event(launch_id=KEY, step=10, stall_s=0.25,
                                       durable_s=1.0, auto=AUTO, now=3.0))  # fmt: skip
    broken = [
        {**line, "auto": {**line["auto"], "interval_steps": 0}},
        {**line, "step": 11, "auto": {**line["auto"], "mtbf_s": "soon"}},
        {**line, "step": 12, "auto": [1, 2]},
    ]
    _ledger(path, *(json.dumps(b) + "\n" for b in broken))
    [attempt] = read_ledger(path)
    assert [(s.step, s.auto) for s in attempt.saves] == [(10, None), (11, None), (12, None)]
