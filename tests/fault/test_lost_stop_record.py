"""The next attempt records the stop its predecessor lost: the ranks died with the save."""

from __future__ import annotations

from pathlib import Path

from hpc_ddp.rundir.ledger import read_ledger
from tests.fault.test_requeue import coordinator


def test_the_next_attempt_records_a_stop_whose_save_the_kill_beat(tmp_path: Path) -> None:
    first = coordinator(tmp_path, None)
    first.begin(resumed_from_step=None, checkpoint=None)
    first.record_checkpoint(20, 0.1, durable_s=1.0)
    first.record_stop_save(40)  # ... and the kill comes before its checkpoint line
    second = coordinator(tmp_path, None, restart_count=1)
    second.begin(resumed_from_step=20, checkpoint="step-00000020.pt")
    lost_then, now = read_ledger(tmp_path / "ledger.jsonl")
    assert lost_then.lost is not None
    assert lost_then.lost.recorded
    assert (lost_then.lost.step, lost_then.lost.saved_step, lost_then.lost.lead_s) == (40, 20, 120)
    assert now.lost is None
    assert now.resumed_from_step == 20
    third = coordinator(tmp_path, None, restart_count=2)
    third.begin(resumed_from_step=20, checkpoint="step-00000020.pt")
    assert (tmp_path / "ledger.jsonl").read_text().count("stop_save_lost") == 1  # once


def test_a_stop_whose_save_landed_is_not_recorded(tmp_path: Path) -> None:
    first = coordinator(tmp_path, None)
    first.begin(resumed_from_step=None, checkpoint=None)
    first.record_stop_save(40)
    first.record_checkpoint(40, 0.1, durable_s=1.0)
    coordinator(tmp_path, None, restart_count=1).begin(resumed_from_step=40, checkpoint="x")
    assert "stop_save_lost" not in (tmp_path / "ledger.jsonl").read_text()
