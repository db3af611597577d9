"""Resumable, exact data order: a DistributedSampler that can start mid-epoch, and a loader.

Exactness rests on three facts. (1) DistributedSampler's permutation is a pure function of
(seed, epoch), and each rank's shard a fixed slice of it; so (epoch, batches consumed) is a
complete data position, and resuming means skipping ``batch_in_epoch * batch_size`` indices of
this rank's shard. (2) The DataLoader gets its own generator seeded from (seed, epoch, rank): it
never draws from the global torch RNG (which a plain DataLoader does once per epoch, shifting
dropout masks after a resume) and its workers' seeds are reproducible. (3) Batches are counted
when they are handed to the training loop, not when workers prefetch them.

Random augmentations inside workers draw from per-worker streams that restart at the resumed
batch; they are reproducible run to run but not bit-identical to an uninterrupted epoch unless
they derive their randomness from the sample index.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from hpc_ddp.runtime.progress import Progress


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (same on every machine and Python run)."""
    out = 0x9E3779B97F4A7C15
    for p in parts:
        out = (out ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3 & 0xFFFFFFFFFFFFFFFF
    return out >> 1


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: torch already seeded this worker; python/numpy follow it."""
    del worker_id
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)


class ResumableSampler(Sampler[int]):
    """DistributedSampler for one rank whose epoch can start at any position of its shard."""

    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        self.inner: DistributedSampler[Any] = DistributedSampler(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select ``epoch``'s permutation and skip the first ``start`` indices of this shard."""
        self.inner.set_epoch(epoch)
        self.start = start

    @property
    def shard_size(self) -> int:
        """Indices in this rank's shard for a whole epoch."""
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.start, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.start)


class ResumableLoader:
    """Batches for one rank that pick up where :class:`Progress` says, and advance it.

    Iterating gives the rest of the current epoch (all of it on a fresh epoch) and moves
    ``progress.batch_in_epoch`` on as each batch is handed out; the epoch then rolls over.
    ``len()`` is the number of batches in a whole epoch, trimmed to a multiple of
    ``multiple_of`` (the gradient accumulation) so an accumulation never spans two epochs.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        progress: Progress,
        *,
        batch_size: int,
        num_replicas: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
        num_workers: int = 0,
        multiple_of: int = 1,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.progress = progress
        self.batch_size = batch_size
        self.rank = rank
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.sampler = ResumableSampler(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            shuffle=shuffle,
        )
        whole = self.sampler.shard_size // batch_size
        self._len = whole - whole % multiple_of

    def __len__(self) -> int:
        return self._len

    def _roll_over_if_done(self) -> None:
        if self.progress.batch_in_epoch >= self._len:
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0

    def __iter__(self) -> Iterator[Any]:
        p = self.progress
        self._roll_over_if_done()  # a checkpoint taken just after an epoch's last batch
        epoch, start = p.epoch, p.batch_in_epoch
        self.sampler.set_epoch(epoch, start * self.batch_size)
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(mix_seed(self.seed, epoch, self.rank)),
            worker_init_fn=seed_worker if self.num_workers else None,
            pin_memory=self.pin_memory,
            collate_fn=self.collate_fn,
        )
        batches = iter(loader)
        try:
            for _ in range(self._len - start):
                batch = next(batches)
                p.batch_in_epoch += 1
                yield batch
        finally:
            del batches  # shuts worker processes down when the loop is left early
        self._roll_over_if_done()

    def forever(self) -> Iterator[Any]:
        """Epoch after epoch, without end (the step count decides when training stops)."""
        if self._len == 0:
            raise ValueError("an epoch has no batches")
        while True:
            yield from self
