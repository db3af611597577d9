"""A ``command:`` job on the session API with one fault in its first launch only.

Usage: leaver.py STEPS CHECKPOINT_EVERY AT RANK HOW

In launch 0 of the first Slurm attempt (``HPC_DDP_LAUNCH`` and ``SLURM_RESTART_COUNT`` unset
or 0), rank RANK (-1: every rank), at step AT:

- ``break``: leaves the ``s.steps`` loop (and ends its session normally);
- ``exit``: calls ``sys.exit(0)`` inside the loop;
- ``ckpt_hang``: (rank RANK must be 0, the writer) its checkpoint write of step AT sleeps for
  an hour, so every later wait for that write is a wait for a hung writer.

Every other launch trains to STEPS. Each step is paced (0.05 s) so that the peers still train
while the fault is found; logs ``loss`` at every step.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp
import hpc_ddp.checkpoint.writer as checkpoint_module

STEP_PAUSE_S = 0.05


def first_launch() -> bool:
    """Launch 0 of the job's first attempt."""
    launch = os.environ.get("HPC_DDP_LAUNCH", "0") or "0"
    restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    return launch == "0" and restart == "0"


def hang_write_at(step: int) -> None:
    """This process's checkpoint write of ``step`` sleeps for an hour."""
    write = checkpoint_module.write_checkpoint

    def slow_write(directory: Path, payload: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if payload["progress"]["step"] == step:
            print(f"writer: hanging in the write of step {step}", file=sys.stderr, flush=True)
            time.sleep(3600)
        return write(directory, payload, *args, **kwargs)

    checkpoint_module.write_checkpoint = slow_write


def main() -> None:
    steps, every, at, rank = (int(a) for a in sys.argv[1:5])
    how = sys.argv[5]
    armed = first_launch()
    with hpc_ddp.session() as s:
        if armed and how == "ckpt_hang" and s.rank == rank:
            hang_write_at(at)
        torch.manual_seed(0)
        model = s.wrap(nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(256, 4, generator=g), torch.arange(256) % 3)
        batches = s.loader(data, batch_size=8).forever()
        for step in s.steps(steps, checkpoint_every=every):
            x, y = next(batches)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            s.log(step=step, loss=loss.item())
            time.sleep(STEP_PAUSE_S)
            mine = rank in (s.rank, -1)
            if armed and step == at and mine and how in ("break", "exit"):
                said = f"rank {s.rank}: leaving at step {step} ({how}) at {time.time()}"
                print(said, file=sys.stderr, flush=True)
                if how == "break":
                    break
                if how == "exit":
                    sys.exit(0)


if __name__ == "__main__":
    main()
