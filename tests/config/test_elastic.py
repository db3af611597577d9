"""The arithmetic of an elastic run (pure): the accumulation that keeps the global batch, the
node counts a ``slurm.min_nodes`` range may give, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ddp.config.elastic import (
    Resize,
    Shape,
    nodes_for_launch,
    planned_accum,
    range_problem,
    rescaled_accum,
    worlds_of,
)
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.errors import ConfigError


def job(**sections: Any) -> JobConfig:
    return job_config_from_dict({"name": "j", **sections}, "x")


@pytest.mark.parametrize(
    ("world", "accum", "to", "expected"),
    [
        (2, 1, 1, 2),  # the example: 2 ranks x 32 x 1 -> 1 rank x 32 x 2
        (1, 3, 3, 1),  # 1 -> 3 ranks, if the run accumulated 3
        (2, 3, 3, 2),
        (4, 2, 8, 1),
        (4, 2, 1, 8),
        (2, 1, 2, 1),  # no change
    ],
)
def test_the_accumulation_keeps_the_global_batch(
    world: int, accum: int, to: int, expected: int
) -> None:
    got = rescaled_accum(Shape(world, accum), to)
    assert got == expected
    assert to * got * 32 == world * accum * 32  # the global batch, in samples


@pytest.mark.parametrize(
    ("before", "to", "says"),
    [
        (Shape(1, 1), 3, "3 ranks would each need less than one batch per step"),
        (Shape(1, 1), 3, "HINT: go on with at most 1 ranks (1), or submit a new run with a "),
        (Shape(2, 1), 3, "to keep the global batch of 2 ranks x 32 x accumulation 1 (64 samples)"),
        (Shape(2, 3), 4, "is not a whole number of per-rank batches at 4 ranks (6 / 4)"),
        (Shape(2, 3), 4, "HINT: pick a world size that divides 6: 1, 2, 3 or 6 ranks."),
    ],
)
def test_what_cannot_keep_the_global_batch_is_refused_with_a_hint(
    before: Shape, to: int, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        rescaled_accum(before, to, batch_size=32)
    assert says in str(err.value)
    assert str(err.value).startswith(f"the world size cannot change to {to}: ")


def test_a_min_nodes_range_plans_the_accumulation_of_each_node_count() -> None:
    cfg = job(slurm={"nodes": 4, "min_nodes": 1, "tasks_per_node": 2}, train={"grad_accum": 3})
    assert list(worlds_of(cfg.slurm)) == [2, 4, 6, 8]
    assert [planned_accum(cfg, w) for w in worlds_of(cfg.slurm)] == [12, 6, 4, 3]
    plain = job(slurm={"nodes": 2}, train={"grad_accum": 5})
    assert list(worlds_of(plain.slurm)) == [2]
    assert planned_accum(plain, 2) == 5
    assert planned_accum(plain, 7) == 5  # no range: a launcher's own world (torchrun) as given


@pytest.mark.parametrize(
    ("slurm", "accum", "says"),
    [
        ({"nodes": 3, "min_nodes": 2}, 1, "not a whole number of per-rank batches on 2 node(s)"),
        ({"nodes": 3, "min_nodes": 2}, 1, "HINT: set train.grad_accum to 2 (or a multiple"),
        ({"nodes": 4, "min_nodes": 1}, 1, "on 3 node(s), which Slurm may give"),
        ({"nodes": 4, "min_nodes": 1}, 1, "HINT: set train.grad_accum to 3 "),
        ({"nodes": 2, "min_nodes": 3}, 1, "is 3, more than slurm.nodes (2)"),
    ],
)
def test_a_range_that_cannot_keep_one_global_batch_is_refused_at_load(
    slurm: dict[str, int], accum: int, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        job(slurm=slurm, train={"grad_accum": accum})
    assert "slurm.min_nodes: " in str(err.value)
    assert says in str(err.value)


def test_the_accumulation_a_refusal_suggests_does_fit_every_node_count() -> None:
    refused = 0
    for nodes in range(1, 9):
        for low in range(1, nodes + 1):
            slurm = SlurmConfig(nodes=nodes, min_nodes=low)
            problem = range_problem(JobConfig(name="j", slurm=slurm))
            if problem is None:
                continue
            refused += 1
            accum = int(problem.split("HINT: set train.grad_accum to ")[1].split()[0])
            fixed = job(slurm={"nodes": nodes, "min_nodes": low}, train={"grad_accum": accum})
            assert range_problem(fixed) is None
    assert refused > 10


@pytest.mark.parametrize(("usable", "expected"), [(0, 4), (1, 2), (2, 2), (3, 3), (4, 4), (6, 4)])
def test_a_launch_trains_on_the_nodes_it_got(usable: int, expected: int) -> None:
    """0: the allocation is not known (a local run): the most nodes; beyond slurm.nodes: spares;
    below min_nodes: min_nodes, which srun then refuses (a requeue follows)."""
    assert nodes_for_launch(SlurmConfig(nodes=4, min_nodes=2), usable) == expected
    assert nodes_for_launch(SlurmConfig(nodes=4), usable) == 4


def test_a_resize_reads_as_the_ledger_and_the_log_say_it() -> None:
    resize = Resize(2, 1, 1, 2)
    assert resize.describe() == (
        "2 ranks x accumulation 1 -> 1 rank x accumulation 2 (the same global batch): "
        "sample-exact, not bit-exact; RNG reseeded from (train.seed, step, rank)"
    )
    assert resize.to_dict() == {
        "from_world_size": 2,
        "from_grad_accum": 1,
        "world_size": 1,
        "grad_accum": 2,
        "exactness": "sample-exact, not bit-exact",
        "rng": "reseeded from (train.seed, step, rank)",
    }
    assert Resize(2, None, 1, 2).describe().startswith("2 ranks -> 1 rank x accumulation 2")
