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
    "session": "hpc_ddp.session",
    "Session": "hpc_ddp.session",
    "RequeueExit": "hpc_ddp.session",
    "REQUEUE_EXIT_CODE": "hpc_ddp.session",
    "unwrap": "hpc_ddp.session",
    "Progress": "hpc_ddp.checkpoint",
    "CheckpointInfo": "hpc_ddp.checkpoint",
    "list_checkpoints": "hpc_ddp.checkpoint",
    "weights_digest": "hpc_ddp.checkpoint",
    "ResumableLoader": "hpc_ddp.sampler",
    "ResumableSampler": "hpc_ddp.sampler",
    "run_training": "hpc_ddp.trainer",
    "TrainResult": "hpc_ddp.trainer",
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
    from hpc_ddp.checkpoint import CheckpointInfo, Progress, list_checkpoints, weights_digest
    from hpc_ddp.sampler import ResumableLoader, ResumableSampler
    from hpc_ddp.session import REQUEUE_EXIT_CODE, RequeueExit, Session, session, unwrap
    from hpc_ddp.trainer import TrainResult, run_training


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpc_ddp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
