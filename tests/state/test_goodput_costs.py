"""``status --goodput`` shows what the saves cost (C, W) and the auto interval in force, with
M and where it came from (hpc_ddp.state.goodput)."""

from __future__ import annotations

from hpc_ddp.rundir.attempt import Attempt, AutoInterval, Save
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.state.goodput import account, checkpoint_costs, describe

AUTO = AutoInterval(95.25, 381, 0.25, 28800.0, "run+history", 12.0)


def _attempt(*saves: Save) -> Attempt:
    return Attempt(
        attempt=0, started=0.0, ended=100.0, cause=EndCause.FINISHED, steps_done=400,
        checkpoint=None, nodelist="n1", job_ref="1", resumed_from_step=None, saves=saves,
    )  # fmt: skip


def test_the_account_shows_c_w_and_the_auto_interval_with_m_and_its_source() -> None:
    a = _attempt(Save(10.0, 40, 0.01, 0.5), Save(50.0, 200, 0.03, 0.7, AUTO))
    g = account([a], [], 100.0)
    assert g.checkpoints is not None
    assert g.checkpoints.saves == 2
    text = "\n".join(describe(g))
    assert "saves              2, C 0.02 s, W 0.6 s (mean)" in text
    assert "auto interval      95.2 s = 381 steps at 0.25 s/step" in text
    assert "M 28,800 s from run+history, restart 12.0 s" in text
    assert g.to_dict()["checkpoints"]["auto"]["mtbf_from"] == "run+history"


def test_an_old_ledger_without_w_and_a_fixed_interval_say_so() -> None:
    costs = checkpoint_costs([_attempt(Save(10.0, 40, 0.01))])
    assert costs is not None
    assert (costs.durable_s, costs.auto) == (None, None)
    g = account([_attempt(Save(10.0, 40, 0.01))], [], 100.0)
    text = "\n".join(describe(g))
    assert "W not recorded" in text
    assert "auto interval" not in text
    assert checkpoint_costs([_attempt()]) is None
    assert "saves" not in "\n".join(describe(account([_attempt()], [], 100.0)))
