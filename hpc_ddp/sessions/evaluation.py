"""Evaluation data and exact metrics: every sample once across the ranks, training untouched.

DistributedSampler pads a dataset whose size the world size does not divide: some samples are
seen twice, and a mean over the ranks' means weighs them wrongly. Here each rank takes one
contiguous shard of ``range(len(dataset))`` (shard sizes differ by at most one, a rank may get
none), in order, so the shards together hold every index exactly once. Metrics are summed, not
averaged: each rank adds up sums and counts, and :meth:`EvalLoader.reduce` all-reduces them in
float64, so ``loss / count`` is the mean over the whole set, whatever the world size.

Nothing here touches the training side: no :class:`~hpc_ddp.runtime.progress.Progress` (the
data position a checkpoint saves), and no draw from the global RNG (a plain DataLoader draws
one number from it for every iteration, which would shift dropout masks after an evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

__all__ = ["EvalLoader", "eval_shard"]


def eval_shard(n: int, *, world: int, rank: int) -> range:
    """Rank ``rank``'s contiguous share of ``range(n)``: the shares of all ranks are disjoint
    and cover it, and their sizes differ by at most one. Pure."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return range(n * rank // world, n * (rank + 1) // world)


class EvalLoader:
    """This rank's batches of an evaluation set, and the sums to reduce over all ranks.

    ::

        val = s.eval_loader(val_set, batch_size=256)
        with torch.no_grad(), s.section("eval"):
            for x, y in val:
                out = model(x.to(s.device))
                val.add(loss=loss_fn(out, y.to(s.device), reduction="sum"), count=len(y))
        totals = val.reduce()                 # collective: every rank gets the same sums
        s.log(step=step, val_loss=totals["loss"] / totals["count"])

    Iterate it as often as wanted (the same batches each time). :meth:`add` and
    :meth:`reduce` are optional: any other reduction of your own works as well.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device("cpu") if device is None else device
        """Where :meth:`reduce` all-reduces (the session's device: NCCL needs the GPU)."""
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.indices = eval_shard(len(dataset), world=world_size, rank=rank)  # type: ignore[arg-type]
        """This rank's sample indices."""
        self._sums: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        """This rank's batches (the last one may be short)."""
        return math.ceil(len(self.indices) / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=self.indices,
            drop_last=False,
            num_workers=self.num_workers,
            # Its own generator: a DataLoader without one draws its base seed from the
            # global RNG, which training (dropout) goes on drawing from after the evaluation.
            generator=torch.Generator().manual_seed(self.rank),
            pin_memory=self.pin_memory,
            collate_fn=self.collate_fn,
        )
        return iter(loader)

    def add(self, **sums: float | torch.Tensor) -> None:
        """Add to this rank's running sums (a tensor is summed over all its elements, on its
        device, without waiting for it): ``loss=`` a summed loss, ``count=`` samples, ..."""
        for name, value in sums.items():
            if isinstance(value, torch.Tensor):
                total = value.detach().to(torch.float64).sum()
            else:
                total = torch.tensor(float(value), dtype=torch.float64)
            held = self._sums.get(name)
            self._sums[name] = total if held is None else held + total.to(held.device)

    def reduce(self) -> dict[str, float]:
        """The sums of every rank's :meth:`add`, the same on every rank (collective: every
        rank calls it, even one with no samples); they start again at zero afterwards."""
        mine = sorted(self._sums)
        names = set(mine)
        if self.world_size > 1 and dist.is_initialized():
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine)  # a rank with no samples added nothing
            names = {n for keys in gathered for n in keys}
        ordered = sorted(names)
        values = torch.zeros(len(ordered), dtype=torch.float64, device=self.device)
        for i, name in enumerate(ordered):
            if name in self._sums:
                values[i] = self._sums[name].to(self.device)
        if self.world_size > 1 and dist.is_initialized() and ordered:
            dist.all_reduce(values)
        self._sums = {}
        return dict(zip(ordered, values.tolist(), strict=True))
