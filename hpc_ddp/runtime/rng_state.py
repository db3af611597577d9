"""This process's RNG states (python, numpy, torch CPU, CUDA) in the form a checkpoint holds them.

Weights-only loadable (lists, ints, tensors): one entry per global rank goes into a
checkpoint's ``rng`` (see :mod:`hpc_ddp.runtime.checkpoint_format`), so a resume restores every
rank's random stream exactly.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states in weights-only-loadable form (lists, ints, tensors)."""
    version, words, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": None,
    }
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, words, gauss = state["python"]
    random.setstate((int(version), tuple(int(w) for w in words), gauss))
    torch.set_rng_state(state["torch"].to("cpu"))
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].to("cpu"), device)
    if state.get("numpy") is not None and np is not None:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
