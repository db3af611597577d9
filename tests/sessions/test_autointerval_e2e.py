"""``checkpoint_every="auto"`` with real ranks (local, CPU gloo): rank 0 records W for every
save, and the saves come at the interval it chose, which every rank followed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from hpc_ddp.checkpoint.interval import Mtbf, SaveCost, choose_interval
from hpc_ddp.rundir.ledger import read_ledger
from tests.helpers.launch import HELPERS, run_ranks

AUTO = str(HELPERS / "auto_interval.py")
STEP_S = 0.02
WRITE_S = 0.15


@pytest.mark.timeout(240)
def test_two_ranks_save_at_the_chosen_interval_and_record_w(tmp_path: Path) -> None:
    state = tmp_path / "state"
    history = state / "hpc-ddp" / "interruptions.json"
    history.parent.mkdir(parents=True)
    # The user's other runs here: 10 interruptions in 60 s of training (M about 6 s).
    doc = {"runs": {"earlier": {"key": "local", "seconds": 60.0, "interruptions": 10,
                                "updated": 4e9}}}  # fmt: skip
    history.write_text(json.dumps(doc))
    run_dir = tmp_path / "run"
    results = run_ranks(
        [AUTO, str(run_dir), "300", str(STEP_S), str(WRITE_S)],
        2,
        {"XDG_STATE_HOME": str(state)},
        timeout=200,
    )
    for code, out, err in results:
        assert code == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["step"] == 300
    [attempt] = read_ledger(run_dir / "ledger.jsonl")
    saves = attempt.saves
    assert len(saves) >= 4, saves
    # W: recorded for every save, past the slow write, and above the stall.
    assert all(s.durable_s is not None and s.durable_s >= WRITE_S for s in saves)
    assert all(s.durable_s is not None and s.durable_s >= s.stall_s for s in saves)
    # Every periodic save after the first (made at once, to measure) comes the chosen number
    # of steps after the one before; the last is the final save at the end.
    periodic = [s for s in saves if s.step < 300]
    assert periodic[0].auto is None
    for before, save in itertools.pairwise(periodic):
        assert save.auto is not None
        assert save.step - before.step == save.auto.interval_steps
        assert save.auto.mtbf_from == "run+history"
        assert save.auto.interval_s >= WRITE_S  # never below W
        # Steps are padded to STEP_S (a busy machine only makes them longer): measured, not
        # guessed.
        assert save.auto.step_s >= STEP_S * 0.9
    # The interval is the model's optimum for what rank 0 measured.
    plan = periodic[-1].auto
    assert plan is not None
    first_w = periodic[0].durable_s
    assert first_w is not None
    cost_hi = SaveCost(max(s.stall_s for s in periodic), max(s.durable_s or 0 for s in periodic))
    cost_lo = SaveCost(min(s.stall_s for s in periodic), min(s.durable_s or 0 for s in periodic))
    lo = choose_interval(cost_lo, Mtbf(plan.mtbf_s, "x")).seconds
    hi = choose_interval(cost_hi, Mtbf(plan.mtbf_s, "x")).seconds
    assert lo * 0.9 <= plan.interval_s <= hi * 1.1
    # Rank 0 added this run to the user's history.
    assert len(json.loads(history.read_text())["runs"]) == 2
