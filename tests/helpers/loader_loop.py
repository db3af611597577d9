"""An own-script session loop whose data comes through DataLoader workers, for the signal
tests: ``loader_loop.py TOTAL WORKERS STEP_SECONDS [ITEM_SECONDS]`` (also under torchrun);
ITEM_SECONDS: each sample's fetch, so that the rank waits on its workers for every batch
instead of living on what they fetched ahead. Every rank logs each step it trains
(``s.log``), rank 0's rows in metrics.jsonl, so a test sees that no step was lost or trained
twice across a stop."""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp

total, workers, pace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
fetch = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0


class Slow(TensorDataset):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        time.sleep(fetch)
        return super().__getitem__(index)  # type: ignore[no-untyped-call,no-any-return]


data = Slow(torch.randn(256, 4, generator=torch.Generator().manual_seed(0)),
            torch.arange(256) % 3)  # fmt: skip

with hpc_ddp.session() as s:
    torch.manual_seed(0)
    model = s.wrap(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s.restore(model=model, optimizer=opt)
    batches = s.loader(data, batch_size=8, num_workers=workers).forever()
    for step in s.steps(total, checkpoint_every=1000):
        x, y = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        time.sleep(pace)
        s.log(step=step, world=s.world_size)
