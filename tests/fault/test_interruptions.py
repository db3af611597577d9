"""Which ledger ends count as interruptions for the auto interval's M, and the user's history
of them (hpc_ddp.fault.interruptions)."""

from __future__ import annotations

import json

from hpc_ddp.checkpoint.interval import Exposure
from hpc_ddp.fault.interruptions import (
    HISTORY_WINDOW_S,
    HistoryEntry,
    exposure,
    history_exposure,
    lost_state,
    parse_history,
    render_history,
)
from hpc_ddp.rundir.attempt import Attempt, Rescue, Save
from hpc_ddp.rundir.endcause import EndCause


def _attempt(
    cause: EndCause | None,
    *,
    started: float = 0.0,
    ended: float | None = 100.0,
    steps: int | None = 50,
    checkpoint: str | None = None,
    rescue: Rescue | None = None,
    saves: tuple[Save, ...] = (),
) -> Attempt:
    return Attempt(
        attempt=0, started=started, ended=ended, cause=cause, steps_done=steps,
        checkpoint=checkpoint, nodelist="n1", job_ref="1", resumed_from_step=None,
        rescue=rescue, saves=saves,
    )  # fmt: skip


SAVED = Rescue(rank=0, step=50, checkpoint="step-00000050.pt", why=None, took_s=0.1)
SHARDED = Rescue(rank=0, step=None, checkpoint=None, why="the shards are gone", took_s=0.0)


def test_only_ends_that_lost_the_state_on_every_rank_count() -> None:
    # A whole allocation lost: no end written, and another attempt came after it.
    assert lost_state(_attempt(None, ended=None), followed=True)
    assert not lost_state(_attempt(None, ended=None), followed=False)  # still running
    # A fault: counted unless the survivors saved the last step.
    for cause in (EndCause.CRASH, EndCause.HANG, EndCause.NODE_FAIL):
        assert lost_state(_attempt(cause), followed=True)
        assert not lost_state(_attempt(cause, rescue=SAVED), followed=True)
        assert lost_state(_attempt(cause, rescue=SHARDED), followed=True)
    # A warned stop: counted only when the save at the warning missed the step reached.
    saved = "step-00000050.pt"
    assert not lost_state(_attempt(EndCause.PREEMPTED, checkpoint=saved), followed=True)
    assert lost_state(_attempt(EndCause.PREEMPTED, checkpoint="step-00000040.pt"), followed=True)
    assert lost_state(_attempt(EndCause.TIME_LIMIT, checkpoint=None), followed=True)
    assert not lost_state(_attempt(EndCause.FINISHED), followed=False)
    assert not lost_state(_attempt(EndCause.CANCELLED), followed=False)


def test_exposure_sums_training_time_and_counts_the_interruptions() -> None:
    run = [
        _attempt(EndCause.CRASH, started=0.0, ended=100.0),
        _attempt(None, started=200.0, ended=None, saves=(Save(260.0, 60, 0.1),)),
        _attempt(None, started=300.0, ended=None),
    ]
    # The second died unrecorded (its last save is the last known of it); the third runs.
    assert exposure(run, now=350.0) == Exposure(100.0 + 60.0 + 50.0, 2)
    # Read by a later attempt: the third died too, with nothing known after its start.
    assert exposure(run, more=True) == Exposure(160.0, 3)


def test_the_history_keeps_one_entry_per_run_and_pools_the_others_on_the_same_key() -> None:
    now = 1e9
    runs = {
        "a": HistoryEntry("gpu", 1000.0, 2, now - 10),
        "b": HistoryEntry("gpu", 500.0, 1, now - 20),
        "c": HistoryEntry("cpu", 9999.0, 9, now - 30),
        "old": HistoryEntry("gpu", 9999.0, 9, now - HISTORY_WINDOW_S - 1),
    }
    assert history_exposure(runs, key="gpu", exclude="b", now=now) == Exposure(1000.0, 2)
    text = render_history(runs, "b", HistoryEntry("gpu", 800.0, 2, now))
    parsed, warning = parse_history(text)
    assert warning is None
    assert parsed["b"] == HistoryEntry("gpu", 800.0, 2, now)
    assert set(parsed) == {"a", "b", "c", "old"}
    kept, _ = parse_history(render_history(runs, "d", HistoryEntry("x", 1, 0, now), keep=2))
    assert set(kept) == {"d", "a"}  # the newest


def test_a_damaged_history_warns_and_keeps_what_it_can() -> None:
    assert parse_history("") == ({}, None)
    runs, warning = parse_history("{not json")
    assert runs == {}
    assert warning is not None
    assert "not JSON" in warning
    assert parse_history("[1, 2]")[1] is not None
    doc = {"runs": {"ok": {"key": "k", "seconds": 5, "interruptions": 1, "updated": 1},
                    "neg": {"key": "k", "seconds": -5, "interruptions": 1, "updated": 1},
                    "junk": "x"}}  # fmt: skip
    runs, warning = parse_history(json.dumps(doc))
    assert set(runs) == {"ok"}
    assert warning == "2 damaged entries skipped"
