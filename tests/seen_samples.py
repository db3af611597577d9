"""A ``train.dataset`` that records which samples training read: the evidence of the elastic
tests that every sample of an epoch is seen exactly once, whatever the world size.

``train.dataset=tests.seen_samples:seen_synthetic``: the built-in synthetic data, paced like a
slow file system (so a stop lands mid-epoch), and each training sample's index appended to
``RUN_DIR/seen/<pid>.txt`` as it is read. With ``num_workers`` 0 (the default on CPUs) a sample
is read inside the step that uses it, and a stop comes between steps: the files of a run hold
exactly the samples of its completed steps, every attempt's included.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hpc_ddp.rundir.layout import RUN_DIR_ENV

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from hpc_ddp.config.model import TrainConfig

DELAY_S = 0.004
"""Seconds each sample waits (32 samples: a 128 ms micro-batch)."""


def seen_synthetic(cfg: TrainConfig, train: bool) -> Dataset[Any]:
    """The synthetic dataset; the training split records every index it hands out."""
    from hpc_ddp.train.data import SyntheticImages

    n = cfg.synthetic_samples if train else max(1, cfg.synthetic_samples // 8)
    inner = SyntheticImages(n, cfg.num_classes, cfg.image_size, cfg.seed, train=train)
    if not train:
        return cast("Dataset[Any]", inner)
    return cast("Dataset[Any]", _Recorded(inner, Path(os.environ[RUN_DIR_ENV]) / "seen"))


class _Recorded:
    """A map-style dataset that appends each index it reads to its process's file."""

    def __init__(self, inner: Any, directory: Path) -> None:
        self.inner = inner
        self.directory = directory
        self._fd: int | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{os.getpid()}.txt"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, f"{index}\n".encode())  # one whole line per write: never torn
        time.sleep(DELAY_S)
        return self.inner[index]


def seen(run_dir: Path) -> collections.Counter[int]:
    """Every index training read in ``run_dir``, with how often, over all attempts and ranks."""
    counts: collections.Counter[int] = collections.Counter()
    for path in sorted((run_dir / "seen").glob("*.txt")):
        counts.update(int(line) for line in path.read_text().split())
    return counts
