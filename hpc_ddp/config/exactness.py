"""How exact a resume is: what a run stopped and resumed keeps of the uninterrupted run. Pure.

Stated once here, for the resume message and the trainer's log; the README and
``docs/concepts.md`` ("Exactness: what is bit-identical where") say the same in prose.

=========================================  ==================================================
where                                      a resume is
=========================================  ==================================================
CPU (gloo)                                 bit-identical: the same weights, to the last bit
GPU (NCCL) with ``train.deterministic``    bit-identical on the same nodes, GPU topology and
                                           software, as long as no op lacked a deterministic
                                           version (the log names any that did)
GPU without it (the default)               step- and sample-exact: the same steps, the same
                                           samples in the same order, the same RNG streams;
                                           the weights differ by rounding, as two
                                           uninterrupted GPU runs differ from each other
another world size than the checkpoint's   sample-exact, not bit-exact (``--elastic``, or a
                                           ``slurm.min_nodes`` allocation): the same global
                                           batch and the same samples in every step, summed
                                           over other ranks; RNG reseeded from (seed, step,
                                           rank) (:mod:`hpc_ddp.config.elastic`)
a key shaping the schedule or the data     not comparable to an uninterrupted run at all
changed (:func:`path_changes`)
=========================================  ==================================================
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

from hpc_ddp.config.model import JobConfig, SlurmConfig, TrainConfig

if TYPE_CHECKING:  # a resize comes from a resume; a submit's preflight loads no elastic
    from hpc_ddp.config.elastic import Resize

DETERMINISTIC_ENV = (("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),)
"""What ``train.deterministic`` sets in a task's environment (a value set by the user wins):
cuBLAS reads it once, at its first call, so ``hpc-ddp run`` sets it before torch is imported."""

_GPU_FLAGS = frozenset({"gpus", "gpus-per-socket", "gres"})
"""``slurm.extra`` flags that can ask for GPUs (``gres`` only with ``gpu`` in its value)."""


class Exactness(enum.Enum):
    """What a resume keeps; the value is the phrase for messages."""

    BITWISE = "bit-identical to an uninterrupted run"
    BITWISE_SAME_NODES = "bit-identical on the same nodes and GPU topology"
    STEP_EXACT = "step- and sample-exact, not bitwise"
    NONE = "not exact"


def exactness(*, on_gpu: bool, deterministic: bool) -> Exactness:
    """What a resume on the same world size keeps, by where it computes."""
    if not on_gpu:
        return Exactness.BITWISE
    return Exactness.BITWISE_SAME_NODES if deterministic else Exactness.STEP_EXACT


def asks_for_gpus(slurm: SlurmConfig) -> bool:
    """True when the job asks Slurm for GPUs: ``gpus_per_*``, or a GPU flag in ``extra``."""
    if slurm.gpus_per_task is not None or slurm.gpus_per_node is not None:
        return True
    return any(
        name in _GPU_FLAGS and (name != "gres" or "gpu" in (value or ""))
        for name, value in slurm.extra
    )


NOT_COMPARABLE = "not comparable to an uninterrupted run"

TRAIN_KEYS_OFF_THE_PATH = frozenset(
    {
        "checkpoint_every", "keep_last", "keep_best", "log_every", "eval_every", "tensorboard",
        "num_workers", "deterministic",
    }
)  # fmt: skip
"""``train`` keys that change what is saved, logged or evaluated (on its own generator), how
the data is loaded (the workers: the same batches in the same order) or which kernels run
(how exact a GPU resume is, said separately), never which steps are taken on which samples.
Every other ``train`` key shapes the run's path: its length and learning-rate schedule
(``epochs``, ``max_steps``, ``lr``, ``lr_schedule``, ``warmup_steps``), its data
(``dataset``, ``batch_size``, ``grad_accum``, ``seed``, ...) or its model and optimizer."""


def path_changes(before: JobConfig, after: JobConfig, resize: Resize | None = None) -> list[str]:
    """The keys a resume changed that shape the schedule or the data, so that the run goes on
    as no uninterrupted run would have: ``train`` keys (less :data:`TRAIN_KEYS_OFF_THE_PATH`;
    ``grad_accum`` too when ``--elastic`` rescaled it), and a program of its own's ``command``,
    ``entrypoint`` and ``params`` (what they shape cannot be told from here)."""
    off = TRAIN_KEYS_OFF_THE_PATH | ({"grad_accum"} if resize is not None else set())
    keys = [
        f"train.{f.name}"
        for f in dataclasses.fields(TrainConfig)
        if f.name not in off and getattr(before.train, f.name) != getattr(after.train, f.name)
    ]
    keys += [k for k in ("command", "entrypoint") if getattr(before, k) != getattr(after, k)]
    if before.params != after.params:
        keys.append("params")
    return keys


def total_below_checkpoint(step: int, total: int, source: str) -> str:
    """The error for a resume whose new total (``source`` names where it comes from) is below
    the step its checkpoint is at: it would train nothing and end the run as finished."""
    return (
        f"{source} makes the run {total} steps long, but its checkpoint is at step {step}: "
        "going on would train nothing and end the run at once as finished (a resume cannot "
        f"go back). HINT: resume with a total of at least {step} steps (train.max_steps, or "
        "train.epochs covering it); for a shorter run, submit a new one with `hpc-ddp submit`."
    )


def resume_clause(before: JobConfig, after: JobConfig, resize: Resize | None = None) -> str:
    """One short clause on what a resume of ``before`` as ``after`` keeps, for the resume
    message: ``bit-identical to an uninterrupted run (CPU)``; ``resize``: ``--elastic`` changes
    the world size; a key that shapes the schedule or the data changed (:func:`path_changes`):
    not comparable at all."""
    from hpc_ddp.config.elastic import SAMPLE_EXACT

    changed = path_changes(before, after, resize)
    if changed:
        they = "it shapes" if len(changed) == 1 else "they shape"
        return (
            f"{NOT_COMPARABLE}: {', '.join(changed)} changed, and {they} the schedule or the data"
        )
    if resize is not None:
        return (
            f"{SAMPLE_EXACT}: {resize.before_world} -> {resize.world} ranks with the same global "
            "batch (--elastic)"
        )
    if before.slurm.ntasks != after.slurm.ntasks and after.slurm.min_nodes is None:
        return (
            f"{Exactness.NONE.value}: {before.slurm.ntasks} -> {after.slurm.ntasks} ranks "
            "reshards the data"
        )
    clause = _same_world_clause(after)
    if after.slurm.min_nodes is not None:
        clause += f"; {SAMPLE_EXACT} where it lands on another node count (slurm.min_nodes)"
    return clause


def _same_world_clause(after: JobConfig) -> str:
    if not asks_for_gpus(after.slurm):
        return f"{Exactness.BITWISE.value} (CPU)"
    if after.command is not None or after.entrypoint is not None:
        return f"{Exactness.STEP_EXACT.value} on GPUs, unless your program makes them so"
    kept = exactness(on_gpu=True, deterministic=after.train.deterministic)
    if kept is Exactness.STEP_EXACT:
        return f"{kept.value} (GPUs without train.deterministic)"
    return f"{kept.value} (train.deterministic)"
