"""The built-in trainer on real ranks (``train_run.py`` under :func:`run_ranks`), for the tests
of the trainer and of its checkpoints: a small run's config and one call that runs it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.helpers.launch import HELPERS, run_ranks

SMALL_RUN: dict[str, Any] = {
    "image_size": 8,
    "synthetic_samples": 256,
    "batch_size": 8,
    "grad_accum": 2,
    "max_steps": 20,
    "checkpoint_every": 6,
    "eval_every": 10,
    "log_every": 5,
    "lr": 0.2,
    "seed": 3,
}
"""256 samples / 2 ranks / batch 8 = 16 batches per epoch = 8 steps of 2 accumulated batches."""
STEPS_PER_EPOCH = 8
"""Of :data:`SMALL_RUN` on 2 ranks."""


def train_argv(run_dir: Path, train: Mapping[str, Any], *stop: str) -> list[str]:
    """One rank's argv: ``train_run.py RUN_DIR TRAIN_JSON [STOP_AT STOP_RANK [SIGNAL]]``."""
    return [str(HELPERS / "train_run.py"), str(run_dir), json.dumps(train), *stop]


def train_ranks(
    run_dir: Path,
    train: Mapping[str, Any],
    *stop: str,
    world: int = 2,
    timeout: float = 120.0,
) -> list[tuple[dict[str, Any], str]]:
    """Run the trainer on ``world`` ranks, each of which must exit 0: each rank's JSON result
    line (its last line of output) and its stderr."""
    out = []
    for rank, (code, stdout, stderr) in enumerate(
        run_ranks(train_argv(run_dir, train, *stop), world, timeout=timeout)
    ):
        assert code == 0, f"rank {rank} exited {code}:\n{stderr[-4000:]}"
        out.append((json.loads(stdout.strip().splitlines()[-1]), stderr))
    return out
