"""The auto checkpoint interval's cost model (hpc_ddp.checkpoint.interval): the interval chosen
is the model's optimum, its bounds hold, and M is estimated as documented."""

from __future__ import annotations

import math

import pytest

from hpc_ddp.checkpoint.interval import (
    PRIOR_MTBF_S,
    Exposure,
    Mtbf,
    SaveCost,
    blocking_s,
    choose_interval,
    daly_interval,
    efficiency,
    estimate_mtbf,
    interval_steps,
    segment_wall_s,
    young_interval,
)

# (C, W, R, M): a cheap save against rare faults, a dear one against frequent faults, and
# regimes where C/M is far from small (where Young's formula drifts).
REGIMES = [
    (0.05, 0.4, 5.0, 8 * 3600.0),
    (1.0, 3.0, 10.0, 3600.0),
    (10.0, 30.0, 20.0, 300.0),
    (5.0, 8.0, 3.0, 60.0),
    (30.0, 60.0, 10.0, 120.0),
    (2.0, 2.0, 0.0, 20.0),
]


def _grid_optimum(cost: SaveCost, mtbf_s: float, low: float, high: float) -> float:
    """The model's optimum by brute force: 20,000 log-spaced intervals."""
    n = 20_000
    grid: list[float] = [low * (high / low) ** (i / (n - 1)) for i in range(n)]
    return max(grid, key=lambda t: efficiency(t, cost, mtbf_s))


@pytest.mark.parametrize(("c", "w", "r", "m"), REGIMES)
def test_the_chosen_interval_is_within_ten_percent_of_the_models_numeric_optimum(
    c: float, w: float, r: float, m: float
) -> None:
    cost = SaveCost(c, w, r)
    choice = choose_interval(cost, Mtbf(m, "prior"), upper_s=1e6)
    best = _grid_optimum(cost, m, w, 1e6)
    assert abs(choice.seconds - best) <= 0.10 * best, (choice.seconds, best)
    assert choice.efficiency >= efficiency(best, cost, m) - 1e-9
    assert choice.bound is None


def test_youngs_formula_misses_the_optimum_once_c_over_m_is_not_small() -> None:
    """The 10 % check above can fail: Young's sqrt(2CM) is more than 10 % off where C/M is
    large, and Daly's higher-order form (the search's reference) is not."""
    cost = SaveCost(30.0, 30.0, 0.0)
    best = _grid_optimum(cost, 120.0, 30.0, 1e5)
    assert abs(young_interval(30.0, 120.0) - best) > 0.10 * best
    assert abs(daly_interval(30.0, 120.0) - best) <= 0.10 * best


def test_a_save_waits_for_the_previous_write_so_short_intervals_block_up_to_w() -> None:
    cost = SaveCost(stall_s=1.0, durable_s=10.0)
    assert blocking_s(100.0, cost) == 1.0
    assert blocking_s(4.0, cost) == pytest.approx(6.0)
    assert blocking_s(0.0, cost) == pytest.approx(10.0)


def test_the_work_lost_per_fault_is_half_an_interval_plus_w_to_first_order() -> None:
    """E(T) = (T + C) (1 + ((T + C)/2 + R + W)/M) + O(1/M^2)."""
    cost, m, t = SaveCost(1.0, 5.0, 2.0), 1e7, 100.0
    extra = segment_wall_s(t, cost, m) - (t + 1.0)
    assert extra * m / (t + 1.0) == pytest.approx((t + 1.0) / 2 + 2.0 + 5.0, rel=1e-3)


def test_the_interval_never_goes_below_w_nor_outside_the_users_bounds() -> None:
    cost = SaveCost(0.01, 50.0)  # a cheap stall, a slow write: the model wants T << W
    choice = choose_interval(cost, Mtbf(60.0, "run"), upper_s=3600.0)
    assert choice.seconds == pytest.approx(50.0)
    assert choice.bound == "W"
    cheap = SaveCost(0.01, 0.02)
    low = choose_interval(cheap, Mtbf(60.0, "run"), lower_s=10.0)
    assert low.seconds == pytest.approx(10.0)
    assert low.bound == "min"
    high = choose_interval(cheap, Mtbf(1e9, "run"), upper_s=900.0)
    assert high.seconds == pytest.approx(900.0)
    assert high.bound == "max"
    # W wins over a maximum below it: saving faster than a write takes only stalls training.
    assert choose_interval(cost, Mtbf(1e9, "run"), upper_s=10.0).seconds == pytest.approx(50.0)


def test_m_is_the_prior_without_data_and_the_rate_seen_with_it() -> None:
    none = estimate_mtbf(Exposure(), Exposure())
    assert none.seconds == PRIOR_MTBF_S
    assert none.source == "prior"
    quiet = estimate_mtbf(Exposure(3600.0, 0), Exposure())
    assert quiet.seconds == PRIOR_MTBF_S
    assert quiet.source == "run"
    long_quiet = estimate_mtbf(Exposure(40 * 3600.0, 0), Exposure())
    assert long_quiet.seconds == 40 * 3600.0  # a long quiet run earns a longer M
    pooled = estimate_mtbf(Exposure(600.0, 1), Exposure(1800.0, 3))
    assert pooled.seconds == pytest.approx(600.0)
    assert pooled.source == "run+history"
    assert "4 interruption(s)" in pooled.describe()
    assert estimate_mtbf(Exposure(), Exposure(900.0, 3)).source == "history"


def test_seconds_become_steps_at_the_measured_step_time() -> None:
    assert interval_steps(30.0, 0.25) == 120
    assert interval_steps(0.1, 1.0) == 1  # at least one step
    assert interval_steps(30.0, 0.0) == 1
    assert interval_steps(30.0, math.inf) == 1
