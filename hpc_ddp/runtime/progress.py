"""Where training is: :class:`Progress`, the counter a checkpoint saves and a resume continues from.

A plain dataclass with no torch, no file I/O and no environment, so that code which only reads
or reports progress (the sampler's position, a summary on the login side) need not import the
checkpoint format (:mod:`hpc_ddp.checkpoint.format`), which imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Progress"]


# Not frozen, unlike the other dataclasses: it is the one live counter of a run, advanced in
# place by the step loop and the loader, which both hold a reference to the same object.
@dataclass
class Progress:
    """Where training is: the one live counter a checkpoint saves and a resume continues from."""

    step: int = 0
    """Optimizer steps done; inside a ``Session.steps()`` loop body, the step being run."""
    epoch: int = 0
    batch_in_epoch: int = 0
    """Micro-batches of ``epoch`` already consumed on each rank (at this world size)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Small user values (numbers, strings, lists) saved with every checkpoint."""
    samples_in_epoch: int | None = None
    """Samples of ``epoch``'s permutation consumed by all ranks together (``world x batch x
    batch_in_epoch``): the data position at any world size, which an elastic resume deals out
    again (:mod:`hpc_ddp.runtime.sampler`). None until a loader counts it (a checkpoint of an
    older hpc-ddp: ``batch_in_epoch`` at the world size that wrote it)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
        }
        if self.samples_in_epoch is not None:
            out["samples_in_epoch"] = self.samples_in_epoch
        return out

    def update_from(self, data: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        """Overwrite in place (loaders hold a reference to this object)."""
        self.step = int(data["step"])
        self.epoch = int(data["epoch"])
        self.batch_in_epoch = int(data["batch_in_epoch"])
        samples = data.get("samples_in_epoch")
        self.samples_in_epoch = None if samples is None else int(samples)
        self.extra = dict(extra)
