"""Elastic runs: going on at another world size with the same global batch. Pure.

A run's global batch is ``batch_size x world x grad_accum`` samples per optimizer step. An
elastic run keeps it when its world size changes (``hpc-ddp resume RUN slurm.nodes=1
--elastic``, or a requeue that lands on fewer nodes of a ``slurm.min_nodes``..``slurm.nodes``
range) by keeping the product ``world x grad_accum``, the *accumulation-world product*: at
``W`` ranks each rank accumulates ``product / W`` micro-batches per step (2 ranks x batch 32 x
accumulation 1 -> 1 rank x batch 32 x accumulation 2). What cannot carry over is refused, with
a hint: a world size that does not divide the product (the global batch is not a whole number
of its batches), and one larger than the product (each rank would need less than one batch).

Such a resume is sample-exact, not bit-exact (:data:`SAMPLE_EXACT`): every optimizer step
sees the same samples as in the uninterrupted run (the data position is a global sample index,
see :mod:`hpc_ddp.runtime.sampler`), but its gradient is summed over other ranks and
micro-batches, in another order, and the per-rank RNG streams of one world cannot be mapped to
another: they are reseeded from (``train.seed``, step, rank) (:data:`RESEEDED`).
"""

from __future__ import annotations

import math

from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.frozen import dataclass

SAMPLE_EXACT = "sample-exact, not bit-exact"
"""What a resume at another world size keeps (the resume's ``changed:`` lines, the ledger's
``resize``, the log)."""
RESEEDED = "reseeded from (train.seed, step, rank)"
"""What happens to the RNG states at another world size (recorded in the ledger)."""


@dataclass(frozen=True)
class Shape:
    """How one optimizer step is made: ``world`` ranks x ``accum`` micro-batches each."""

    world: int
    accum: int

    @property
    def product(self) -> int:
        """The accumulation-world product: per-rank batches in one global batch."""
        return self.world * self.accum

    def describe(self, batch_size: int | None = None) -> str:
        """``2 ranks x 32 x accumulation 1 (64 samples)``; without a batch size ``2 ranks x
        accumulation 1``."""
        ranks = f"{self.world} rank{'s' if self.world != 1 else ''}"
        if batch_size is None:
            return f"{ranks} x accumulation {self.accum}"
        samples = batch_size * self.product
        return f"{ranks} x {batch_size} x accumulation {self.accum} ({samples} samples)"


def product_of(cfg: JobConfig) -> int:
    """The config's accumulation-world product: ``train.grad_accum x slurm.nodes x
    slurm.tasks_per_node`` (with ``slurm.min_nodes``, ``slurm.nodes`` is the largest
    allocation, the one ``train.grad_accum`` is meant for)."""
    return cfg.train.grad_accum * cfg.slurm.ntasks


def rescaled_accum(before: Shape, world: int, *, batch_size: int | None = None) -> int:
    """The accumulation that keeps ``before``'s global batch at ``world`` ranks.

    A :class:`ConfigError` with a hint when it cannot: ``world`` is larger than the product
    (fewer than one batch per rank and step) or does not divide it.
    """
    product = before.product
    if world <= product and product % world == 0:
        return product // world
    fits = [w for w in range(1, product + 1) if product % w == 0]
    was = before.describe(batch_size)
    if world > product:
        why = (
            f"{world} ranks would each need less than one batch per step to keep the global "
            f"batch of {was}"
        )
        fix = (
            f"go on with at most {product} ranks ({_listed(fits)}), or submit a new run with a "
            "smaller train.batch_size to train on more ranks"
        )
    else:
        why = (
            f"the global batch of {was} is not a whole number of per-rank batches at "
            f"{world} ranks ({product} / {world})"
        )
        fix = f"pick a world size that divides {product}: {_listed(fits)} ranks"
    raise ConfigError(f"the world size cannot change to {world}: {why}. HINT: {fix}.")


def planned_accum(cfg: JobConfig, world: int) -> int:
    """The accumulation a task at ``world`` ranks runs under ``cfg``: ``train.grad_accum``,
    or with ``slurm.min_nodes`` the one that keeps the global batch of the largest allocation
    (:func:`rescaled_accum`; the config check makes every size of the range fit)."""
    if cfg.slurm.min_nodes is None or world == cfg.slurm.ntasks:
        return cfg.train.grad_accum
    return rescaled_accum(Shape(cfg.slurm.ntasks, cfg.train.grad_accum), world)


def worlds_of(slurm: SlurmConfig) -> range:
    """The world sizes a job may run at: ``nodes x tasks_per_node``, or every node count of
    the ``min_nodes``..``nodes`` range times ``tasks_per_node``."""
    low = slurm.nodes if slurm.min_nodes is None else slurm.min_nodes
    return range(low * slurm.tasks_per_node, slurm.ntasks + 1, slurm.tasks_per_node)


def range_problem(cfg: JobConfig) -> str | None:
    """Why ``cfg``'s ``slurm.min_nodes`` range cannot keep one global batch at every node
    count Slurm may give ("problem. HINT: fix"), or None."""
    s = cfg.slurm
    if s.min_nodes is None:
        return None
    if s.gpus_per_task is not None:
        return (
            "is set together with slurm.gpus_per_task: a node range cannot ask Slurm for a "
            "number of tasks, which GPUs per task need. HINT: ask for slurm.gpus_per_node "
            "instead, as many as slurm.tasks_per_node (each rank takes cuda:LOCAL_RANK)"
        )
    if s.min_nodes > s.nodes:
        return (
            f"is {s.min_nodes}, more than slurm.nodes ({s.nodes}), the largest allocation. "
            f"HINT: set slurm.min_nodes to at most {s.nodes}"
        )
    counts = range(s.min_nodes, s.nodes + 1)
    bad = [n for n in counts if (s.nodes * cfg.train.grad_accum) % n]
    if not bad:
        return None
    every = math.lcm(*counts)
    accum = every // math.gcd(every, s.nodes)
    return (
        f"is {s.min_nodes}, but the global batch ({s.nodes} nodes x accumulation "
        f"{cfg.train.grad_accum}) is not a whole number of per-rank batches on "
        f"{_listed(bad)} node(s), which Slurm may give. HINT: set train.grad_accum to "
        f"{accum} (or a multiple: it is the accumulation at slurm.nodes, and fewer nodes "
        "accumulate more), or narrow the range"
    )


def nodes_for_launch(slurm: SlurmConfig, usable: int) -> int:
    """Nodes a launch trains on, of ``usable`` healthy ones in the allocation (0: unknown):
    ``slurm.nodes``, or with ``slurm.min_nodes`` as many of them as the allocation has (the
    rest are spares), never fewer than ``min_nodes`` (srun then refuses the step)."""
    if slurm.min_nodes is None or usable <= 0:
        return slurm.nodes
    return max(slurm.min_nodes, min(slurm.nodes, usable))


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values[:-1])) + (" or " if len(values) > 1 else "") + str(values[-1])


@dataclass(frozen=True)
class Resize:
    """A resume at another world size: how the checkpoint's steps were made, and this run's.

    ``before_accum`` is None for a checkpoint of an hpc-ddp that did not record it.
    """

    before_world: int
    before_accum: int | None
    world: int
    accum: int
    exactness: str = SAMPLE_EXACT
    rng: str = RESEEDED

    def to_dict(self) -> dict[str, object]:
        """The ledger's ``resize`` field of an attempt's start."""
        return {
            "from_world_size": self.before_world,
            "from_grad_accum": self.before_accum,
            "world_size": self.world,
            "grad_accum": self.accum,
            "exactness": self.exactness,
            "rng": self.rng,
        }

    def describe(self) -> str:
        """``2 ranks x accumulation 1 -> 1 rank x accumulation 2 (the same global batch):
        sample-exact, not bit-exact; RNG reseeded from (train.seed, step, rank)``."""
        before = (
            Shape(self.before_world, self.before_accum).describe()
            if self.before_accum is not None
            else f"{self.before_world} ranks"
        )
        after = Shape(self.world, self.accum).describe()
        return f"{before} -> {after} (the same global batch): {self.exactness}; RNG {self.rng}"
