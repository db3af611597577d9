"""One rank of a script of your own that shards its model: ``s.wrap(model, strategy="fsdp")``.

Usage: fsdp_script.py RUN_DIR TOTAL SLOW_DIGEST_S [GRAD_ACCUM [best]]

Trains a small two-block model with AdamW on fixed random data from ``s.loader``, sharded
per ``Block`` (``shard=["Block"]``), checkpointing at step 3 (timed: how long the training
thread waits for it) and at the end. Every shard file's digest first sleeps SLOW_DIGEST_S on
the writer thread (a slow shared file system). Prints ``{"rank", "resumed_from", "step",
"stall_s", "restored", "digest"}`` as JSON: the digests of the whole weights gathered on
every rank after the restore and at the end. The loop runs ``s.grad_accum`` micro-batches per
step and says so (``elastic=True``): a resume at another world size sets GRAD_ACCUM to keep
the global batch. With ``best``: ``keep_last: 1`` and ``keep_best: {metric: val_loss, mode:
min}``, a checkpoint every step, ``val_loss`` logged each step from :data:`VAL_LOSS` (its best,
0.5, at step 2) before that step's checkpoint.
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
from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.config.model import JobConfig, KeepBestConfig, TrainConfig
from hpc_ddp.runtime.sharding import full_state_dict
from hpc_ddp.sessions.session import Session

VAL_LOSS = {1: 1.0, 2: 0.5, 3: 0.8, 4: 0.9, 5: 0.7, 6: 0.6}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.linear(x).relu()
        return out


def main() -> None:
    run_dir, total, slow = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    accum = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    best = len(sys.argv) > 5 and sys.argv[5] == "best"
    digest = sharded.file_digest

    def slow_digest(path: Path) -> str:
        time.sleep(slow)
        return digest(path)

    sharded.file_digest = slow_digest
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    stall: float | None = None
    train = TrainConfig(grad_accum=accum)
    if best:
        keep = KeepBestConfig(metric="val_loss", mode="min")
        train = TrainConfig(grad_accum=accum, keep_last=1, keep_best=keep)
    cfg = JobConfig(name="fsdp-script", train=train)
    with Session(run_dir, cfg) as s:
        model = s.wrap(nn.Sequential(Block(), Block(), nn.Linear(16, 4)), strategy="fsdp",
                       shard=["Block"])  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        resumed = s.restore(model=model, optimizer=opt, elastic=True)
        resumed_from = None if resumed is None else resumed.step
        restored = weights_digest(full_state_dict(model))
        batches = s.loader(data, batch_size=4).forever()
        for step in s.steps(total, checkpoint_every=1 if best else 0):
            for _ in range(s.grad_accum):
                x, y = next(batches)
                loss: torch.Tensor = nn.functional.cross_entropy(model(x), y) / s.grad_accum
                loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            if best:
                s.log(step=step, val_loss=VAL_LOSS[step])
            if step == 3:
                began = time.monotonic()
                s.checkpoint()
                stall = time.monotonic() - began
        out: dict[str, Any] = {
            "rank": s.rank,
            "resumed_from": resumed_from,
            "step": s.progress.step,
            "stall_s": stall,
            "restored": restored,
            "digest": weights_digest(full_state_dict(model)),
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
