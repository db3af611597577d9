"""A ``command:`` job on the session API whose rank KILL_RANK is SIGKILLed inside
``optimizer.step()`` of step KILL_AT, in the first launch only.

Usage: rescued.py STEPS CHECKPOINT_EVERY KILL_AT KILL_RANK [bn]

``KILL_AT`` 0: no fault (the uninterrupted twin). ``bn``: the model has a BatchNorm, whose
running stats only rank 0's checkpoint holds. The model draws dropout masks (each step's RNG
streams), the optimizer keeps momentum and a scheduler steps every step, so a resume that lost
any of them would not end with the twin's weights. Before the kill, the periodic save before it
is waited for (a fallback then resumes from a known step).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp


def wait_durable(checkpoints: Path, step: int) -> None:
    path = checkpoints / f"step-{step:08d}.pt"
    deadline = time.monotonic() + 60
    while step > 0 and not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    steps, every, kill_at, kill_rank = (int(a) for a in sys.argv[1:5])
    bn = len(sys.argv) > 5 and sys.argv[5] == "bn"
    with hpc_ddp.session() as s:
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(4, 16)]
        if bn:
            layers.append(nn.BatchNorm1d(16))
        layers += [nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3)]
        model = s.wrap(nn.Sequential(*layers))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
        s.restore(model=model, optimizer=opt, scheduler=sched)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(512, 4, generator=g), torch.arange(512) % 3)
        batches = s.loader(data, batch_size=16).forever()
        current = {"step": 0}

        def inside_update(*_: Any) -> None:
            if (current["step"], s.rank, s.dist.launch) == (kill_at, kill_rank, 0):
                wait_durable(s.paths.checkpoints, kill_at // every * every)
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        opt.register_step_pre_hook(inside_update)
        for step in s.steps(steps, checkpoint_every=every):
            current["step"] = step
            x, y = next(batches)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            s.log(step=step, loss=loss.item())
            time.sleep(0.02)  # a step long enough for the fault to land inside one


if __name__ == "__main__":
    main()
