"""An own script that logs a validation loss of a fixed course, for ``train.keep_best``.

``python tests/helpers/keep_best.py TOTAL``: checkpoints every 5 steps with ``keep_last: 2`` and
``keep_best: {metric: val_loss, mode: min}``; ``val_loss`` is logged every 5 steps from
:data:`VAL_LOSS` (its best, 0.5, at step 10), before that step's checkpoint.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import hpc_ddp
from hpc_ddp.config.model import JobConfig, KeepBestConfig, TrainConfig

VAL_LOSS = {5: 1.0, 10: 0.5, 15: 0.8, 20: 0.9, 25: 0.7, 30: 0.6}


def main(total: int) -> None:
    keep = KeepBestConfig(metric="val_loss", mode="min")
    config = JobConfig(name="best", train=TrainConfig(keep_last=2, keep_best=keep))
    with hpc_ddp.session(config=config) as s:
        torch.manual_seed(0)
        model = s.wrap(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt)
        for step in s.steps(total, checkpoint_every=5):
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
            if step in VAL_LOSS:
                s.log(step=step, val_loss=VAL_LOSS[step])


if __name__ == "__main__":
    main(int(sys.argv[1]))
