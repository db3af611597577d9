"""hpc-ddp: PyTorch DDP on Slurm that survives preemption, time limits and requeues.

The training API (``hpc_ddp.session()`` and friends) and :class:`JobConfig` are loaded on
first use, so that ``import hpc_ddp`` on a login node does not pay for importing torch (or the
config layer). The exception tree of :mod:`hpc_ddp.errors` is imported directly: it is one
small standard-library-only module, and ``except hpc_ddp.HpcDdpError`` should just work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpc_ddp.errors import (
    CheckpointError,
    ConfigError,
    DevClusterError,
    DistEnvError,
    HpcDdpError,
    OverrideError,
    PeerError,
    RenderError,
    RunDirError,
    RunsDirError,
    SlurmError,
    SlurmUnavailableError,
    SubmissionError,
    TargetError,
)
from hpc_ddp.version import __version__

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "session": "hpc_ddp.runtime.session",
    "Session": "hpc_ddp.runtime.session",
    "RequeueExit": "hpc_ddp.runtime.session",
    "REQUEUE_EXIT_CODE": "hpc_ddp.exitcodes",
    "unwrap": "hpc_ddp.runtime.session",
    "Progress": "hpc_ddp.runtime.progress",
    "CheckpointInfo": "hpc_ddp.runtime.checkpoint",
    "list_checkpoints": "hpc_ddp.runtime.checkpoint",
    "weights_digest": "hpc_ddp.runtime.checkpoint",
    "ResumableLoader": "hpc_ddp.runtime.sampler",
    "ResumableSampler": "hpc_ddp.runtime.sampler",
    "run_training": "hpc_ddp.train.trainer",
    "TrainResult": "hpc_ddp.train.trainer",
    "JobConfig": "hpc_ddp.config.model",
}

__all__ = [
    "REQUEUE_EXIT_CODE",
    "CheckpointError",
    "CheckpointInfo",
    "ConfigError",
    "DevClusterError",
    "DistEnvError",
    "HpcDdpError",
    "JobConfig",
    "OverrideError",
    "PeerError",
    "Progress",
    "RenderError",
    "RequeueExit",
    "ResumableLoader",
    "ResumableSampler",
    "RunDirError",
    "RunsDirError",
    "Session",
    "SlurmError",
    "SlurmUnavailableError",
    "SubmissionError",
    "TargetError",
    "TrainResult",
    "__version__",
    "list_checkpoints",
    "run_training",
    "session",
    "unwrap",
    "weights_digest",
]

if TYPE_CHECKING:
    from hpc_ddp.config.model import JobConfig
    from hpc_ddp.runtime.checkpoint import CheckpointInfo, list_checkpoints, weights_digest
    from hpc_ddp.runtime.procgroup import unwrap
    from hpc_ddp.runtime.progress import Progress
    from hpc_ddp.runtime.sampler import ResumableLoader, ResumableSampler
    from hpc_ddp.exitcodes import REQUEUE_EXIT_CODE
    from hpc_ddp.runtime.session import RequeueExit, Session, session
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
