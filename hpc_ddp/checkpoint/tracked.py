"""The objects a checkpoint saves: the model, its optimizer, scheduler and grad scaler, and any
more by name. Named once, by ``session.restore``; both kinds of checkpoint save and restore
them (:mod:`hpc_ddp.checkpoint.checkpointer` a file, :mod:`hpc_ddp.checkpoint.sharded` a shard
set)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hpc_ddp.errors import ConfigError

__all__ = ["Tracked"]


@dataclass(frozen=True)
class Tracked:
    """The objects a checkpoint saves (named once, by ``session.restore``)."""

    model: nn.Module
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None
    objects: Mapping[str, Any] = field(default_factory=dict)
    """Any more, by name: each has ``state_dict()`` and ``load_state_dict()`` (torch DCP's
    ``Stateful``), e.g. an EMA model, a second optimizer, a curriculum. A module is saved
    unwrapped (no DDP ``module.`` prefix)."""

    def __post_init__(self) -> None:
        for name, obj in self.objects.items():
            if not (
                callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))
            ):
                raise ConfigError(
                    f"restore() got {name}={type(obj).__name__}, which has no state_dict() "
                    "and load_state_dict(). HINT: pass objects whose state a checkpoint can "
                    "save (modules, optimizers, schedulers, or a class of yours with those two "
                    "methods); keep small plain values in `s.progress.extra`."
                )
