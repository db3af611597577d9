"""Slurm's tasks-per-node strings (``2(x3),1``), by table."""

from __future__ import annotations

import pytest

from hpc_ddp.backends.slurm.nodelist import parse_tasks_per_node
from hpc_ddp.errors import DistEnvError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", [1]),
        ("2", [2]),
        ("2(x3)", [2, 2, 2]),
        ("2(x2),1", [2, 2, 1]),
        ("1,2(x2),4", [1, 2, 2, 4]),
    ],
)
def test_parse_tasks_per_node(text: str, expected: list[int]) -> None:
    assert parse_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "2(x0)", "2,,1", "-1", "2(x2"])
def test_parse_tasks_per_node_rejects(text: str) -> None:
    with pytest.raises(DistEnvError, match=r"SLURM_TASKS_PER_NODE=.*HINT:"):
        parse_tasks_per_node(text)
