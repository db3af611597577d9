"""A ``command:`` job on the session API whose rank 1 dies of SIGKILL once: at step KILL_AT of
the first attempt only (``SLURM_RESTART_COUNT`` 0), as the OOM killer would end it. No Python
code runs after the signal, so only the ``hpc_ddp run`` process above it can tell Slurm.

Usage: killed_once.py STEPS CHECKPOINT_EVERY KILL_AT

Logs ``loss`` and ``attempt`` at every step.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp


def main() -> None:
    steps, every, kill_at = (int(a) for a in sys.argv[1:4])
    with hpc_ddp.session() as s:
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
            s.log(step=step, loss=loss.item(), attempt=s.dist.restart_count)
            if step == kill_at and s.rank == 1 and s.dist.restart_count == 0:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
