"""Resumable, exact data order: a DistributedSampler that can start mid-epoch at any world
size, and a loader.

Exactness rests on three facts. (1) An epoch's order is a permutation of the dataset that is a
pure function of (seed, epoch), DistributedSampler's, the same at every world size; each rank
takes every ``world``-th index of it, from its ``rank``-th, as DistributedSampler deals. So a
step of ``world x batch x accumulation`` samples consumes the next block of the permutation
whatever the world size, and the data position is one number: the samples of the epoch
consumed by all ranks together (``Progress.samples_in_epoch``). Resuming deals out the rest of
the permutation the same way: at the world size that wrote the checkpoint that is exactly the
uninterrupted order; at another one (an elastic resume) every step still sees the same block of
samples, only split over other ranks, so every sample of the interrupted epoch is seen exactly
once (:func:`remainder_shard`). An epoch is the whole steps that fit in the dataset
(``len // (world x batch x multiple_of)``), a number that does not depend on the world size
when the global batch is kept. (2) The DataLoader gets its own generator seeded from (seed,
the epoch it starts in, rank): it never draws from the global torch RNG (which a plain
DataLoader does once per epoch, shifting dropout masks after a resume) and its workers' seeds
are reproducible. (3) Batches are counted when they are handed to the training loop, not when
workers prefetch them.

The workers are started once and kept across epochs (:meth:`ResumableLoader.forever` also
prefetches across each boundary). Random augmentations inside them draw from per-worker
streams that start where the loader starts (a resume, at the resumed batch); they are
reproducible run to run but not bit-identical to an uninterrupted run unless they derive their
randomness from the sample index.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]
from torch.utils.data import DataLoader, Dataset, Sampler

from hpc_ddp.runtime.childsignals import blocked_while_starting, data_worker_init
from hpc_ddp.runtime.progress import Progress


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (same on every machine and Python run)."""
    out = 0x9E3779B97F4A7C15
    for p in parts:
        out = (out ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3 & 0xFFFFFFFFFFFFFFFF
    return out >> 1


def reseed_rng(seed: int, step: int, rank: int) -> None:
    """Seed python, numpy and torch (CPU and every GPU) from (``seed``, ``step``, ``rank``):
    an elastic resume's RNG streams, as the checkpoint's per-rank ones belong to another world
    size. The same numbers whichever attempt resumes at that step with that rank."""
    mixed = mix_seed(seed, step, rank, _ELASTIC_STREAM)
    random.seed(mixed)
    torch.manual_seed(mixed)
    if np is not None:
        np.random.seed(mixed % 2**32)


_ELASTIC_STREAM = 3
"""Keeps :func:`reseed_rng`'s seeds apart from the other streams :func:`mix_seed` makes."""


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: torch already seeded this worker; python/numpy follow it;
    Slurm's stop signals are left to the rank
    (:func:`~hpc_ddp.runtime.childsignals.data_worker_init`)."""
    data_worker_init(worker_id)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Epoch ``epoch``'s order of ``range(n)``: DistributedSampler's permutation
    (``torch.randperm`` seeded with ``seed + epoch``), or ``range(n)`` without shuffling."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order: list[int] = torch.randperm(n, generator=g).tolist()
    return order


def remainder_shard(
    order: Sequence[int], *, start: int, world: int, rank: int, count: int | None = None
) -> list[int]:
    """Rank ``rank``'s share of what is left of ``order`` once ``start`` samples of it are
    consumed: ``order[start:]`` dealt out the DistributedSampler way (rank ``r`` takes every
    ``world``-th, from its ``r``-th), its first ``count`` (None: all). Pure.

    Over all ranks, the first ``k x world`` of their shares are exactly ``order[start : start
    + k x world]``, whatever ``world`` is: a step at another world size consumes the same block.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    if not 0 <= start <= len(order):
        raise ValueError(f"start {start} is outside an order of {len(order)}")
    share = order[start + rank :: world]
    return list(share if count is None else share[:count])


def epoch_samples(n: int, step_samples: int) -> int:
    """Samples of an ``n``-sample epoch that whole steps of ``step_samples`` use (the rest of
    the permutation is left out, as ``drop_last`` does). Pure."""
    return n // step_samples * step_samples


class ResumableSampler(Sampler[int]):
    """DistributedSampler for one rank whose epoch can start at any global sample position."""

    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int,
        rank: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        self.n = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.start = 0
        self.count: int | None = None

    def set_epoch(self, epoch: int, start: int = 0, count: int | None = None) -> None:
        """Select ``epoch``'s permutation and this rank's share of what follows its first
        ``start`` samples (consumed by all ranks together): ``count`` of them (None: all)."""
        self.epoch = epoch
        self.start = start
        self.count = count

    @property
    def shard_size(self) -> int:
        """Indices this rank takes in a whole epoch (the last, ragged ones included)."""
        return len(range(self.rank, self.n, self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.n, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        share = remainder_shard(
            order, start=self.start, world=self.num_replicas, rank=self.rank, count=self.count
        )
        return iter(share)

    def __len__(self) -> int:
        left = len(range(self.start + self.rank, self.n, self.num_replicas))
        return left if self.count is None else min(left, self.count)


class ResumableLoader:
    """Batches for one rank that pick up where :class:`Progress` says, and advance it.

    Iterating gives the rest of the current epoch (all of it on a fresh epoch) and moves
    ``progress.batch_in_epoch`` and ``progress.samples_in_epoch`` on as each batch is handed
    out; the epoch then rolls over. An epoch is the whole steps of ``num_replicas x batch_size
    x multiple_of`` samples (``multiple_of``: the gradient accumulation, so an accumulation
    never spans two epochs) that fit in the dataset; ``len()`` is this rank's batches in it.
    A position written at another world size (an elastic resume) is taken as it is: the rest
    of the epoch is dealt out over this world (:func:`remainder_shard`).
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
        on_wait: Callable[[bool], None] | None = None,
    ) -> None:
        self.dataset = dataset
        self.on_wait = on_wait
        """Told True while this rank waits for its next batch, False once it has it (the
        session's heartbeat says so: a rank stuck in its data is the one to blame)."""
        self.progress = progress
        self.batch_size = batch_size
        self.world = num_replicas
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
        self.round = num_replicas * batch_size
        """Samples one batch on every rank consumes."""
        self.epoch_samples = epoch_samples(self.sampler.n, self.round * multiple_of)
        """Samples of the permutation an epoch uses (whole steps)."""
        self._len = self.epoch_samples // self.round
        self._epoch_loader: DataLoader[Any] | None = None

    def __len__(self) -> int:
        return self._len

    def consumed(self) -> int:
        """Samples of the current epoch consumed by all ranks (a position without
        ``samples_in_epoch``, from an older checkpoint, is ``batch_in_epoch`` rounds)."""
        p = self.progress
        return p.batch_in_epoch * self.round if p.samples_in_epoch is None else p.samples_in_epoch

    def _left(self) -> int:
        """Batches of the current epoch still to come on each rank."""
        return max(0, self.epoch_samples - self.consumed()) // self.round

    def _roll_over_if_done(self) -> None:
        if self._left() == 0:
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0
            self.progress.samples_in_epoch = 0

    def _start_epoch(self) -> tuple[int, int, int]:
        """(epoch, start, batches left) of the position in :attr:`progress`, which is re-counted
        in this world (a position written at another world size, an elastic resume)."""
        p = self.progress
        self._roll_over_if_done()  # a checkpoint taken just after an epoch's last batch
        epoch, start, left = p.epoch, self.consumed(), self._left()
        p.batch_in_epoch, p.samples_in_epoch = self._len - left, start
        return epoch, start, left

    def _data_loader(self, epoch: int, **how: Any) -> DataLoader[Any]:
        return DataLoader(
            self.dataset,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(mix_seed(self.seed, epoch, self.rank)),
            worker_init_fn=seed_worker if self.num_workers else None,
            pin_memory=self.pin_memory,
            collate_fn=self.collate_fn,
            **how,
        )

    def _next(self, batches: Iterator[Any]) -> Any:
        if self.on_wait is None:
            return next(batches)
        self.on_wait(True)
        try:
            return next(batches)
        finally:
            self.on_wait(False)

    def _hand_out(self, batch: Any) -> Any:
        """Count ``batch`` as consumed (it is handed to the training loop now)."""
        p = self.progress
        p.batch_in_epoch += 1
        p.samples_in_epoch = (p.samples_in_epoch or 0) + self.round
        return batch

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch. Workers are kept for the next epoch's ``iter()``
        (``persistent_workers``), but its first batches are fetched only once it is asked for:
        :meth:`forever` fetches across the boundary."""
        epoch, start, left = self._start_epoch()
        self.sampler.set_epoch(epoch, start, left * self.batch_size)
        if self._epoch_loader is None:
            self._epoch_loader = self._data_loader(
                epoch,
                batch_size=self.batch_size,
                sampler=self.sampler,
                drop_last=True,
                persistent_workers=self.num_workers > 0,
            )
        with blocked_while_starting():  # workers start here (the first time)
            batches = iter(self._epoch_loader)
        for _ in range(left):
            yield self._hand_out(self._next(batches))
        self._roll_over_if_done()

    def forever(self) -> Iterator[Any]:
        """Epoch after epoch, without end (the step count decides when training stops).

        One DataLoader serves every epoch: its workers start once and prefetch across each
        epoch boundary (a loader made anew per epoch starts its workers again, and the first
        steps of every epoch wait for them). The order is exactly that of iterating epoch by
        epoch; a batch counts as consumed when it is handed out, not when it is prefetched.
        """
        if self._len == 0:
            raise ValueError("an epoch has no batches")
        epoch, start, left = self._start_epoch()
        plan = _EpochBatches(self, epoch, start, left)
        with blocked_while_starting():  # the workers start here
            batches = iter(self._data_loader(epoch, batch_sampler=plan))
        try:
            while True:
                self._roll_over_if_done()  # only once the next batch is asked for, as per epoch
                yield self._hand_out(self._next(batches))
        finally:
            del batches  # shuts the workers down when the loop is left


class _EpochBatches(Sampler[list[int]]):
    """The batch sampler of :meth:`ResumableLoader.forever`: this rank's batches of epoch after
    epoch, the first from ``start`` (``left`` batches of it), each dealt as
    :class:`ResumableSampler` deals it. Runs where the DataLoader fetches (ahead of the loop)."""

    def __init__(self, loader: ResumableLoader, epoch: int, start: int, left: int) -> None:
        self.loader, self.epoch, self.start, self.left = loader, epoch, start, left

    def __iter__(self) -> Iterator[list[int]]:
        src, size = self.loader, self.loader.batch_size
        sampler = src.sampler
        epoch, start, left = self.epoch, self.start, self.left
        while True:
            order = epoch_order(sampler.n, seed=sampler.seed, epoch=epoch, shuffle=sampler.shuffle)
            share = remainder_shard(
                order, start=start, world=src.world, rank=src.rank, count=left * size
            )
            for b in range(left):
                yield share[b * size : (b + 1) * size]
            epoch, start, left = epoch + 1, 0, len(src)
