"""A sweep's job arrays: planned below ``MaxArraySize`` with as few arrays as it allows, one per
script variant (:mod:`hpc_ddp.backends.slurm.array_sweep`). Submitting them is
``tests/sweep/test_submit.py``'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.backends.arrays import ArrayPlan
from hpc_ddp.backends.slurm.array_sweep import plan_arrays, script_groups
from hpc_ddp.sweep.spec import chunk_array, load_sweep

DATA = Path(__file__).parents[2] / "data" / "config"


@pytest.mark.parametrize(("n", "limit"), [(1, 1001), (6, 1001), (1001, 1001), (1002, 1001),
                                          (2500, 1001), (10, 3), (7, 1)])  # fmt: skip
def test_a_whole_sweep_is_planned_as_chunk_array_ranges(n: int, limit: int) -> None:
    plans = plan_arrays(range(n), [0] * n, limit)
    assert [(p.points[0], p.points[-1] + 1) for p in plans] == chunk_array(n, limit)
    assert [p.offset for p in plans] == [start for start, _ in chunk_array(n, limit)]
    assert all(max(p.points) - p.offset < limit for p in plans)  # task ids below the limit


@pytest.mark.parametrize(
    ("points", "limit", "expected"),
    [
        ([3, 5], 1001, [((3, 5), 0)]),  # below the limit: task id = point index
        ([999, 1000, 1001, 1500], 1001, [((999, 1000), 0), ((1001, 1500), 1001)]),
        ([1200, 2300], 1001, [((1200,), 1200), ((2300,), 2300)]),
        ([0, 4, 5, 9], 5, [((0, 4), 0), ((5, 9), 5)]),
    ],
)
def test_subsets_use_as_few_arrays_as_possible(
    points: list[int], limit: int, expected: list[tuple[tuple[int, ...], int]]
) -> None:
    plans = plan_arrays(points, [0] * len(points), limit)
    assert [(p.points, p.offset) for p in plans] == expected


def test_points_with_different_scripts_go_to_different_arrays() -> None:
    plans = plan_arrays([0, 1, 2, 3, 4], [0, 1, 0, 1, 0], 1001)
    assert [(p.points, p.group) for p in plans] == [((0, 2, 4), 0), ((1, 3), 1)]
    assert plans[0].spec(2) == "0,2,4%2"
    assert ArrayPlan((5, 6, 7, 9), 5, 0).spec(None) == "0-2,4"


def test_script_groups_split_only_on_sections_the_script_renders() -> None:
    spec = load_sweep(DATA / "sweep.yaml")  # point 7 changes env.modules and slurm.nodes
    groups = script_groups([p.config for p in spec.points])
    assert groups == [0] * 7 + [1] + [0] * 4
