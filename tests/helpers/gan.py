"""A GAN-shaped own script for the session tests: two models, two optimizers, an EMA copy of
the generator and a curriculum object of the user's own, all handed to ``s.restore`` by name.

``python tests/helpers/gan.py TOTAL STOP_AT``: rank 0 sends itself SIGTERM in step STOP_AT (0:
never), as a scheduler would; the ranks agree on it, save and leave, and a second start resumes.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import TensorDataset

import hpc_ddp
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.stopflag import AgreementCadence


class Curriculum:
    """State of the user's own kind (torch DCP's Stateful protocol)."""

    def __init__(self) -> None:
        self.level = 0
        self.seen: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level, self.seen = int(state["level"]), list(state["seen"])


def main(total: int, stop_at: int) -> None:
    bce = nn.functional.binary_cross_entropy_with_logits
    with hpc_ddp.session() as s:
        torch.manual_seed(0)  # the same initial weights on every rank
        random.seed(s.rank)  # unseeded, the twins' python and numpy streams would differ
        np.random.seed(s.rank)
        gen = s.wrap(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)))
        disc = s.wrap(nn.Sequential(nn.Linear(2, 16), nn.Dropout(0.2), nn.Linear(16, 1)))
        ema = AveragedModel(unwrap(gen), multi_avg_fn=get_ema_multi_avg_fn(0.9))  # type: ignore[no-untyped-call]
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-2)
        opt_d = torch.optim.Adam(disc.parameters(), lr=1e-2)
        curriculum = Curriculum()
        # Agree after every step: the stop must come before the run's end however fast the
        # steps are (an adaptive cadence agrees every ~0.1 s, possibly past step TOTAL).
        s.cadence = AgreementCadence(fixed=1)
        s.restore(model=gen, optimizer=opt_g, discriminator=disc, opt_d=opt_d, ema=ema,
                  curriculum=curriculum)  # fmt: skip
        data = TensorDataset(torch.randn(96, 2, generator=torch.Generator().manual_seed(1)) + 1)
        real = s.loader(data, batch_size=8).forever()
        ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
        for step in s.steps(total, checkpoint_every=7):
            (x,) = next(real)
            z = torch.randn(8, 2)  # this rank's RNG stream, restored on resume
            with torch.no_grad():
                fake = gen(z)
            opt_d.zero_grad()
            bce(disc(torch.cat([x, fake])), torch.cat([ones, zeros])).backward()  # type: ignore[no-untyped-call]
            opt_d.step()
            opt_g.zero_grad()
            bce(disc(gen(z)), ones).backward()  # type: ignore[no-untyped-call]
            opt_g.step()
            ema.update_parameters(unwrap(gen))
            curriculum.seen.append(step)
            curriculum.level += step % 5 == 0
            if step == stop_at and s.is_main:
                os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
