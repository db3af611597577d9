"""Each step's RNG streams, derived from (seed, step, rank) in every run.

A session seeds python's, numpy's and torch's (CPU and this rank's GPU) global generators at the
start of every step from ``(train.seed, step, rank)``. So no rank's RNG state is something only
that rank holds: a survivor can write a complete checkpoint for a peer that died
(:mod:`hpc_ddp.fault.rescue`), a resume at another world size gets reproducible streams, and an
uninterrupted run draws exactly the numbers a resumed one does. It costs a few microseconds a
step (the generators' own ``manual_seed``, not :func:`torch.manual_seed`, which looks for every
accelerator and takes ~0.1 ms).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

from hpc_ddp.runtime.sampler import mix_seed

__all__ = ["StepSeeds", "step_rng_state"]

_STEP_STREAM = 4
"""Keeps the step seeds apart from the other streams :func:`mix_seed` makes."""


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s streams for step ``step`` (63 bits)."""
    return mix_seed(seed, step, rank, _STEP_STREAM)


class StepSeeds:
    """Seeds this rank's global generators at the start of each step (:meth:`seed`)."""

    def __init__(self, seed: int, rank: int, device: torch.device) -> None:
        self.seed, self.rank = seed, rank
        self._cuda: torch.Generator | None = None
        if device.type == "cuda":
            torch.cuda.init()  # type: ignore[no-untyped-call]  # the generators exist after it
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._cuda = torch.cuda.default_generators[index]

    def seed_step(self, step: int) -> None:
        """Seed python, numpy (if imported) and torch for step ``step``."""
        mixed = step_seed(self.seed, step, self.rank)
        random.seed(mixed)
        torch.default_generator.manual_seed(mixed)
        if self._cuda is not None:
            self._cuda.manual_seed(mixed)
        np = sys.modules.get("numpy")  # never imported for this
        if np is not None:
            np.random.seed(mixed % 2**32)


def step_rng_state(seed: int, step: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s RNG states as step ``step`` begins, in the checkpoint's form
    (:func:`~hpc_ddp.checkpoint.format.capture_rng_state`), computed without that rank: what a
    survivor records for a peer that died. The GPU's entry is None (it is seeded again at the
    step's start like every other stream)."""
    mixed = step_seed(seed, step, rank)
    version, words, gauss = random.Random(mixed).getstate()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "torch": torch.Generator().manual_seed(mixed).get_state(),
        "cuda": None,
        "numpy": None,
    }
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.RandomState(mixed % 2**32).get_state(
            legacy=True
        )
        state["numpy"] = [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    return state
