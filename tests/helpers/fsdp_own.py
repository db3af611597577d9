"""Your own script, sharded: the README's own-script shape with ``s.wrap(model,
strategy="fsdp")``, run as a job's ``command:`` on the dev cluster.

Usage: fsdp_own.py TOTAL

A two-block model sharded per ``Block``, AdamW on fixed random data from ``s.loader``, a
checkpoint every 10 steps and the last step saved on leaving the ``with`` block. Each step
sleeps a little, so a signal lands mid-run.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.linear(x).relu()
        return out


def main() -> None:
    total = int(sys.argv[1])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    with hpc_ddp.session() as s:
        model = s.wrap(nn.Sequential(Block(), Block(), nn.Linear(16, 4)), strategy="fsdp",
                       shard=["Block"])  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        s.restore(model=model, optimizer=opt)
        batches = s.loader(data, batch_size=8).forever()
        for step in s.steps(total=total, checkpoint_every=10):
            x, y = next(batches)
            loss: torch.Tensor = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            s.log(step=step, loss=loss.item())
            time.sleep(0.1)


if __name__ == "__main__":
    main()
