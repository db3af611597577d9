"""One rank of a script of your own that shards its model: ``s.wrap(model, strategy="fsdp")``.

Usage: fsdp_script.py RUN_DIR TOTAL SLOW_DIGEST_S

Trains a small two-block model with AdamW on fixed random data from ``s.loader``, sharded
per ``Block`` (``shard=["Block"]``), checkpointing at step 3 (timed: how long the training
thread waits for it) and at the end. Every shard file's digest first sleeps SLOW_DIGEST_S on
the writer thread (a slow shared file system). Prints ``{"rank", "resumed_from", "step",
"stall_s", "digest"}`` as JSON, the digest of the whole weights gathered on every rank.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpc_ddp.checkpoint import sharded
from hpc_ddp.checkpoint.format import weights_digest
from hpc_ddp.config.model import JobConfig
from hpc_ddp.runtime.session import Session
from hpc_ddp.runtime.sharding import full_state_dict


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.linear(x).relu()
        return out


def main() -> None:
    run_dir, total, slow = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    digest = sharded.file_digest

    def slow_digest(path: Path) -> str:
        time.sleep(slow)
        return digest(path)

    sharded.file_digest = slow_digest
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    stall: float | None = None
    with Session(run_dir, JobConfig(name="fsdp-script")) as s:
        model = s.wrap(nn.Sequential(Block(), Block(), nn.Linear(16, 4)), strategy="fsdp",
                       shard=["Block"])  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        resumed = s.restore(model=model, optimizer=opt)
        resumed_from = None if resumed is None else resumed.step
        batches = s.loader(data, batch_size=4).forever()
        for step in s.steps(total):
            x, y = next(batches)
            loss: torch.Tensor = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            if step == 3:
                began = time.monotonic()
                s.checkpoint()
                stall = time.monotonic() - began
        out: dict[str, Any] = {
            "rank": s.rank,
            "resumed_from": resumed_from,
            "step": s.progress.step,
            "stall_s": stall,
            "digest": weights_digest(full_state_dict(model)),
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
