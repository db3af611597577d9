"""hpc-ddp: PyTorch DDP on Slurm that survives preemption, time limits and requeues."""

from __future__ import annotations

__version__ = "0.1.0"
