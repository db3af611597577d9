"""The evaluation shards and sums (one process; the two-rank run is in
``test_own_script_e2e``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from hpc_ddp.sessions.evaluation import EvalLoader, eval_shard

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(("n", "world"), [(23, 2), (23, 4), (3, 8), (0, 3), (64, 8), (1, 1)])
def test_shards_hold_every_index_once_and_differ_by_at_most_one(n: int, world: int) -> None:
    shards = [eval_shard(n, world=world, rank=r) for r in range(world)]
    assert [i for s in shards for i in s] == list(range(n))  # in order, none twice, none left
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_a_rank_outside_the_world_is_an_error() -> None:
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        eval_shard(5, world=2, rank=2)


def test_one_process_sees_all_in_order_and_sums_exactly() -> None:
    val = EvalLoader(TensorDataset(torch.arange(10)), batch_size=4, rank=0, world_size=1)
    assert len(val) == 3
    seen = []
    for (batch,) in val:
        seen += batch.tolist()
        val.add(total=batch, count=len(batch))
    assert seen == list(range(10))
    assert val.reduce() == {"count": 10.0, "total": 45.0}
    assert val.reduce() == {}  # the sums start again
