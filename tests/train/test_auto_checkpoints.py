"""The built-in trainer at ``train.checkpoint_every: auto``, on 2 real gloo ranks: it saves at
the steps rank 0 chose, and every rank follows (a save is collective: a rank that did not would
block the other). A resume takes C and W from the ledger, so its first save already comes at a
chosen interval, not at once to measure."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.rundir.attempt import Save
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.sessions.autointerval import WARMUP_STEPS
from tests.helpers.train_ranks import SMALL_RUN, train_ranks

pytestmark = pytest.mark.torch

STEPS, STOP_AT = 100, 40
MAX_S = 0.25
"""``train.checkpoint_max_s``: however fast the steps, the stopped attempt saves at least once
at an interval."""
HISTORY_S, HISTORY_FAULTS = 40.0, 20
"""The user's other local runs: 20 interruptions in 40 s (M about 2 s: an interval of a few
tens of the trainer's 10 ms steps, so a short run saves several times)."""


def _seed_history() -> None:
    path = Path(os.environ["XDG_STATE_HOME"]) / "hpc-ddp" / "interruptions.json"  # conftest's
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"key": "local", "seconds": HISTORY_S, "interruptions": HISTORY_FAULTS,
             "updated": time.time()}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "runs": {"earlier": entry}}))


def _spaced_as_chosen(saves: list[Save]) -> None:
    """Each save with an interval in force comes that many steps after the save before it."""
    for before, save in itertools.pairwise(saves):
        assert save.auto is not None, saves
        assert save.step - before.step == save.auto.interval_steps, (before, save)
        assert save.auto.mtbf_from == "run+history"
        assert save.auto.mtbf_s >= HISTORY_S / HISTORY_FAULTS  # a stop is no interruption
        # Never below W, unless the user's maximum is lower (a save slow under load).
        assert save.auto.interval_s >= min(before.durable_s or 0.0, MAX_S)


@pytest.mark.timeout(180)
def test_the_trainer_saves_at_the_chosen_steps_and_a_resume_keeps_choosing(
    tmp_path: Path,
) -> None:
    _seed_history()
    cfg = {**SMALL_RUN, "checkpoint_every": "auto", "checkpoint_max_s": MAX_S, "max_steps": STEPS}
    stopped = [result for result, _ in train_ranks(tmp_path, cfg, str(STOP_AT), "1")]
    assert stopped == [{"stopped": STOP_AT, "signal": 12, "code": 0}] * 2
    finished = [result for result, _ in train_ranks(tmp_path, cfg)]
    assert finished[0] == finished[1]  # same weights on both ranks

    first, resumed = read_ledger(tmp_path / "ledger.jsonl")
    assert (first.cause, first.steps_done) == (EndCause.TIME_LIMIT, STOP_AT)
    assert (resumed.cause, resumed.resumed_from_step) == (EndCause.FINISHED, STOP_AT)
    # A fresh run saves once right after the warm-up, to measure W; then at chosen intervals,
    # the stop's save at the step reached (none of its own where a chosen save fell on it: the
    # interval follows the measured step time, so that happens on some machines).
    measure, *periodic = first.saves
    assert (measure.auto, measure.step) == (None, 1 + WARMUP_STEPS + 1)
    assert periodic[-1].step == STOP_AT, first.saves
    if periodic[-1].auto is None:
        periodic.pop()  # the stop's own save
    assert periodic, first.saves
    _spaced_as_chosen([measure, *periodic])
    # The resume chose at once from the ledger's C and W: its first save comes an interval
    # after the warm-up; the last is the final save.
    chosen = list(resumed.saves)
    assert chosen[-1].step == STEPS, resumed.saves
    if chosen[-1].auto is None:
        chosen.pop()  # the final save (none of its own where a chosen one fell on the last step)
    assert chosen, resumed.saves
    assert chosen[0].auto is not None
    assert chosen[0].step == STOP_AT + 1 + WARMUP_STEPS + chosen[0].auto.interval_steps
    _spaced_as_chosen(chosen)
    # Every save rank 0 recorded is whole on disk, as far as keep_last keeps them.
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.pt"))
    kept = sorted({s.step for s in first.saves + resumed.saves})[-TrainConfig().keep_last :]
    assert names == [f"step-{step:08d}.pt" for step in kept]
