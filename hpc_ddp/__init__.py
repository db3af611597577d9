"""hpc-ddp: PyTorch DDP on Slurm that survives preemption, time limits and requeues.

The training API (``hpc_ddp.session()`` and friends) is loaded on first use, so that
``import hpc_ddp`` on a login node does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "session": "hpc_ddp.runtime.session",
    "Session": "hpc_ddp.runtime.session",
    "RequeueExit": "hpc_ddp.runtime.session",
    "REQUEUE_EXIT_CODE": "hpc_ddp.runtime.session",
    "unwrap": "hpc_ddp.runtime.session",
    "Progress": "hpc_ddp.runtime.checkpoint",
    "CheckpointInfo": "hpc_ddp.runtime.checkpoint",
    "list_checkpoints": "hpc_ddp.runtime.checkpoint",
    "weights_digest": "hpc_ddp.runtime.checkpoint",
    "ResumableLoader": "hpc_ddp.runtime.sampler",
    "ResumableSampler": "hpc_ddp.runtime.sampler",
    "run_training": "hpc_ddp.train.trainer",
    "TrainResult": "hpc_ddp.train.trainer",
}

__all__ = [
    "REQUEUE_EXIT_CODE",
    "CheckpointInfo",
    "Progress",
    "RequeueExit",
    "ResumableLoader",
    "ResumableSampler",
    "Session",
    "TrainResult",
    "__version__",
    "list_checkpoints",
    "run_training",
    "session",
    "unwrap",
    "weights_digest",
]

if TYPE_CHECKING:
    from hpc_ddp.runtime.checkpoint import (
        CheckpointInfo,
        Progress,
        list_checkpoints,
        weights_digest,
    )
    from hpc_ddp.runtime.sampler import ResumableLoader, ResumableSampler
    from hpc_ddp.runtime.session import REQUEUE_EXIT_CODE, RequeueExit, Session, session, unwrap
    from hpc_ddp.train.trainer import TrainResult, run_training


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpc_ddp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
