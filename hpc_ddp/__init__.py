"""hpc-ddp: PyTorch DDP on Slurm that survives preemption, time limits and requeues.

Two public APIs, both loaded on first use: the training API on the tasks
(``hpc_ddp.session()`` and friends), and the login side's (``hpc_ddp.submit()``,
``resume()``, ``submit_sweep()``, ``runs()``, :class:`Job`, :class:`Sweep`: what the
``hpc-ddp`` verbs do, from a script or a notebook; :mod:`hpc_ddp.api`). So ``import hpc_ddp``
on a login node pays for neither torch nor the config layer, and the login side's API never
imports torch, torchvision or submitit. The exception tree of :mod:`hpc_ddp.errors` is imported
directly: it is one small standard-library-only module, and ``except hpc_ddp.HpcDdpError``
should just work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpc_ddp.errors import (
    BackendError,
    CheckpointError,
    ConfigError,
    DevClusterError,
    DistEnvError,
    HpcDdpError,
    OverrideError,
    PeerError,
    RenderError,
    RunDirError,
    RunFailedError,
    RunsDirError,
    SlurmError,
    SlurmUnavailableError,
    SubmissionError,
    TargetError,
    WaitTimeoutError,
)
from hpc_ddp.version import __version__

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "session": "hpc_ddp.sessions.session",
    "Session": "hpc_ddp.sessions.session",
    "RequeueExit": "hpc_ddp.sessions.session",
    "REQUEUE_EXIT_CODE": "hpc_ddp.exitcodes",
    "unwrap": "hpc_ddp.runtime.procgroup",
    "Progress": "hpc_ddp.runtime.progress",
    "CheckpointInfo": "hpc_ddp.checkpoint.format",
    "list_checkpoints": "hpc_ddp.checkpoint.format",
    "weights_digest": "hpc_ddp.checkpoint.digest",
    "ResumableLoader": "hpc_ddp.runtime.sampler",
    "ResumableSampler": "hpc_ddp.runtime.sampler",
    "data_worker_init": "hpc_ddp.runtime.childsignals",
    "run_training": "hpc_ddp.train.trainer",
    "TrainResult": "hpc_ddp.train.trainer",
    "JobConfig": "hpc_ddp.config.model",
    # The login side's API (hpc_ddp/api): no torch, torchvision or submitit.
    "submit": "hpc_ddp.api.job",
    "resume": "hpc_ddp.api.job",
    "Job": "hpc_ddp.api.job",
    "submit_sweep": "hpc_ddp.api.sweep",
    "Sweep": "hpc_ddp.api.sweep",
    "runs": "hpc_ddp.api.status",
    "RunStatus": "hpc_ddp.api.status",
    "SweepStatus": "hpc_ddp.api.status",
    "CancelResult": "hpc_ddp.api.cancel",
}

__all__ = [
    "REQUEUE_EXIT_CODE",
    "BackendError",
    "CancelResult",
    "CheckpointError",
    "CheckpointInfo",
    "ConfigError",
    "DevClusterError",
    "DistEnvError",
    "HpcDdpError",
    "Job",
    "JobConfig",
    "OverrideError",
    "PeerError",
    "Progress",
    "RenderError",
    "RequeueExit",
    "ResumableLoader",
    "ResumableSampler",
    "RunDirError",
    "RunFailedError",
    "RunStatus",
    "RunsDirError",
    "Session",
    "SlurmError",
    "SlurmUnavailableError",
    "SubmissionError",
    "Sweep",
    "SweepStatus",
    "TargetError",
    "TrainResult",
    "WaitTimeoutError",
    "__version__",
    "data_worker_init",
    "list_checkpoints",
    "resume",
    "run_training",
    "runs",
    "session",
    "submit",
    "submit_sweep",
    "unwrap",
    "weights_digest",
]

if TYPE_CHECKING:
    from hpc_ddp.api.cancel import CancelResult
    from hpc_ddp.api.job import Job, resume, submit
    from hpc_ddp.api.status import RunStatus, SweepStatus, runs
    from hpc_ddp.api.sweep import Sweep, submit_sweep
    from hpc_ddp.checkpoint.digest import weights_digest
    from hpc_ddp.checkpoint.format import CheckpointInfo, list_checkpoints
    from hpc_ddp.config.model import JobConfig
    from hpc_ddp.exitcodes import REQUEUE_EXIT_CODE
    from hpc_ddp.runtime.childsignals import data_worker_init
    from hpc_ddp.runtime.procgroup import unwrap
    from hpc_ddp.runtime.progress import Progress
    from hpc_ddp.runtime.sampler import ResumableLoader, ResumableSampler
    from hpc_ddp.sessions.session import RequeueExit, Session, session
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
