"""One rank of a run that checkpoints at ``checkpoint_every="auto"``.

Usage: auto_interval.py RUN_DIR TOTAL STEP_S WRITE_S

A small DDP model trains to step TOTAL, each step padded to STEP_S seconds; rank 0's
checkpoint writes first sleep WRITE_S (a slow file system: W well above the stall). The
interruption rate comes from the user's history under ``$XDG_STATE_HOME`` (the test seeds it).
Prints ``{"rank", "step"}`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.sessions.session import Session
from tests.helpers.slow_io import slow_down, start_together


def main() -> None:
    run_dir, total = Path(sys.argv[1]), int(sys.argv[2])
    step_s, write_s = float(sys.argv[3]), float(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        slow_down(write_s, 0.0)
    config = JobConfig(name="auto-interval", train=TrainConfig(checkpoint_every="auto"))
    start_together(run_dir, rank, world)
    with Session(run_dir, config) as s:
        torch.manual_seed(0)
        model = s.wrap(nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt)
        x = torch.linspace(-1, 1, 16).reshape(2, 8) * (rank + 1)
        for _ in s.steps(total, checkpoint_every="auto"):
            began = time.monotonic()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            time.sleep(max(0.0, step_s - (time.monotonic() - began)))
        step = s.progress.step
    print(json.dumps({"rank": rank, "step": step}))


if __name__ == "__main__":
    main()
