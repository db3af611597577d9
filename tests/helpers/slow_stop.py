"""A ``command:`` job on the session API whose save at an agreed stop is slow on rank 0 in
its first attempt (a large state on a slow file system, met by a preemption).

Usage: slow_stop.py STEPS CHECKPOINT_EVERY STEP_S SLOW_STOP_S

Each step takes STEP_S (a steady pace, however busy the machine); the periodic saves every
CHECKPOINT_EVERY steps are fast. In the first attempt (Slurm's restart count 0), rank 0's write
of the stop's checkpoint first sleeps SLOW_STOP_S: a grace time shorter than that kills it
before it is durable. Prints ``{"rank", "resumed_from", "step"}`` as JSON at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hpc_ddp
import hpc_ddp.checkpoint.writer as checkpoint_module


def main() -> None:
    steps, every = int(sys.argv[1]), int(sys.argv[2])
    step_s, slow_s = float(sys.argv[3]), float(sys.argv[4])
    with hpc_ddp.session() as s:
        first = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
        if first and s.rank == 0:
            write = checkpoint_module.write_checkpoint

            def slow_at_stop(*args: Any, **kwargs: Any) -> Path:
                if s.stop_flag.agreed is not None:  # the stop's save, not a periodic one
                    time.sleep(slow_s)
                return write(*args, **kwargs)

            checkpoint_module.write_checkpoint = slow_at_stop
        torch.manual_seed(0)
        model = s.wrap(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        s.restore(model=model, optimizer=opt)
        resumed = s.progress.step
        x = torch.randn(8, 4)
        for step in s.steps(steps, checkpoint_every=every):
            began = time.monotonic()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            time.sleep(max(0.0, step_s - (time.monotonic() - began)))
            s.log(step=step, loss=0.0)
        print(json.dumps({"rank": s.rank, "resumed_from": resumed, "step": s.progress.step}))


if __name__ == "__main__":
    main()
