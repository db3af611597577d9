"""The built-in trainer: DDP or FSDP (``train.strategy``) image classification, written only
against the session API.

Checkpoints, stop signals and requeues all go through
:class:`~hpc_ddp.sessions.session.Session`, the same way a user's own script uses them; nothing
here has a second path for them.

Per step: ``grad_accum`` micro-batches (DDP's ``no_sync`` on all but the last, so gradients are
all-reduced once), optional autocast on GPU (bf16 where supported, else fp16 with a GradScaler),
an optimizer step and an LR-schedule step. The global batch is ``batch_size x world_size x
grad_accum`` samples (``grad_accum``: the session's, which keeps it at any world size).

Resume is bit-identical on CPU (gloo) for any number of ranks. On GPUs it is step- and
sample-exact, and bit-identical only with ``train.deterministic`` (deterministic kernels, and
DDP's fixed bucket layout with 3+ ranks) on the same nodes and GPU topology; neither is the
default there, as each costs speed (:mod:`hpc_ddp.config.exactness`). At another world size
(``slurm.min_nodes``, ``hpc-ddp resume --elastic``) the accumulation changes to keep the global
batch (the session's ``grad_accum``) and a resume is sample-exact, not bit-exact
(:mod:`hpc_ddp.config.elastic`).

Data-loader workers: ``train.num_workers: auto`` gives a GPU rank workers (decoding overlaps
the GPU's work) and a CPU rank none (they would take the cores the model computes on).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from hpc_ddp import collector
from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.config.elastic import SAMPLE_EXACT, Resize
from hpc_ddp.config.exactness import Exactness, exactness, total_below_checkpoint
from hpc_ddp.config.model import FaultConfig, JobConfig, TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.sampler import mix_seed
from hpc_ddp.runtime.sharding import full_state_dict
from hpc_ddp.sessions.session import Session
from hpc_ddp.train.data import build_dataset
from hpc_ddp.train.loop import (
    DeterministicKernels,
    Precision,
    ProgressReport,
    StepRunner,
    TunedKernels,
)
from hpc_ddp.train.models import build_model

log = logging.getLogger(__name__)

_STEP_DECAY_AT = (0.5, 0.75)
_STEP_DECAY = 0.1


@dataclass(frozen=True)
class TrainResult:
    """How a completed run ended."""

    step: int
    epoch: int
    loss: float | None
    """Mean training loss over the last logging window, across ranks."""
    val_loss: float | None
    val_acc: float | None
    weights_digest: str


def lr_factor(step: int, *, total: int, schedule: str, warmup: int) -> float:
    """The multiplier of the base LR after ``step`` optimizer steps (pure).

    Linear warmup over ``warmup`` steps, then ``constant``; ``cosine`` down to 0 at ``total``;
    or ``step``: x0.1 at 50% and again at 75% of ``total``.
    """
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "step":
        return float(_STEP_DECAY ** sum(step >= f * total for f in _STEP_DECAY_AT))
    raise ConfigError(f"train.lr_schedule {schedule!r} is unknown. HINT: constant|cosine|step.")


def plan_total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """``max_steps`` when set, else ``epochs`` whole epochs."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    if cfg.epochs is not None:
        return cfg.epochs * steps_per_epoch
    raise ConfigError("train.max_steps and train.epochs are both null. HINT: set one of them.")


def build_optimizer(cfg: TrainConfig, params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD (with momentum) or AdamW, per ``cfg.optimizer``."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ConfigError(f"train.optimizer {cfg.optimizer!r} is unknown. HINT: sgd|adamw.")


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if present) and torch (CPU and every GPU)."""
    random.seed(seed)
    torch.manual_seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)


def _datasets(cfg: TrainConfig, s: Session) -> tuple[Dataset[Any], Dataset[Any] | None]:
    """Rank 0 builds (and checks) the datasets first, the others after it succeeded (a
    user's dataset function may cache on first use); rank 0's error stops them all."""
    with s.main_first():
        train, val = build_dataset(cfg, train=True), build_dataset(cfg, train=False)
    assert train is not None
    return train, val


def fixed_buckets(world_size: int, kept: Exactness) -> bool:
    """Whether DDP's bucket layout is fixed up front (``Session.wrap(exact=...)``), which costs
    the overlap of all-reduce with backward: only where it buys bit-identical resume, with
    3+ ranks on CPUs or deterministic GPU kernels."""
    return world_size > 2 and kept is not Exactness.STEP_EXACT


MAX_AUTO_WORKERS = 8
"""``num_workers: auto`` never starts more workers per rank than this."""


def resolve_num_workers(setting: int | str, device_type: str, cpus: int) -> int:
    """The data-loader workers per rank for ``train.num_workers`` (pure).

    A number is used as given. ``auto``: none on the CPU, where the model computes on every
    core the rank has; on a GPU one fewer than the rank's ``cpus`` (the last one runs the
    training loop), at least 1 and at most :data:`MAX_AUTO_WORKERS`.
    """
    if isinstance(setting, int):
        return setting
    if device_type != "cuda":
        return 0
    return max(1, min(MAX_AUTO_WORKERS, cpus - 1))


def task_cpus(env: Mapping[str, str], local_world_size: int) -> int:
    """The CPUs this rank may use: what its scheduler gave each task (Slurm's
    ``cpus_per_task``), else its share of the CPUs this process may run on (its affinity,
    shared with the other ranks of the node)."""
    from hpc_ddp.backends.node_registry import allocation_for

    given = allocation_for(env).cpus_per_task()
    if given is not None:
        return given
    return max(1, len(os.sched_getaffinity(0)) // max(1, local_world_size))


def _val_loader(ds: Dataset[Any], cfg: TrainConfig, s: Session, workers: int) -> DataLoader[Any]:
    shard = Subset(ds, range(s.rank, len(ds), s.world_size))  # type: ignore[arg-type]
    return DataLoader(
        shard,
        batch_size=cfg.batch_size,
        num_workers=workers,
        # Its own generator: a DataLoader without one draws from the global RNG.
        generator=torch.Generator().manual_seed(mix_seed(cfg.seed, s.rank, 2)),
    )


def evaluate(
    module: nn.Module, loader: DataLoader[Any], device: torch.device, autocast: Any
) -> tuple[float, float]:
    """(mean loss, accuracy) over every rank's shard (one all-reduce)."""
    module.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for inputs, labels in loader:
            x, y = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with autocast():
                out = module(x)
            sums[0] += nn.functional.cross_entropy(out.float(), y, reduction="sum")
            sums[1] += (out.argmax(1) == y).sum()
            sums[2] += y.numel()
    module.train()
    dist.all_reduce(sums)
    n = max(1.0, float(sums[2]))
    return float(sums[0]) / n, float(sums[1]) / n


@dataclass
class _Validation:
    """Evaluation on the held-out split: when it last ran, and its (loss, accuracy)."""

    loader: DataLoader[Any] | None
    total: int
    result: tuple[float, float] | None = None
    step: int = -1

    def run(self, s: Session, model: nn.Module, step: int, precision: Precision) -> None:
        """Evaluate now (collective), log the result as a metrics row and a line."""
        assert self.loader is not None
        with s.section("eval"):  # its own deadline: an evaluation is no hung step
            val = evaluate(
                unwrap(model), self.loader, s.device, lambda: precision.autocast(s.device)
            )
        self.result, self.step = val, step
        s.log(step=step, epoch=s.progress.epoch, val_loss=val[0], val_acc=val[1])
        log.info("step %d/%d | val_loss %.4f | val_acc %.4f", step, self.total, *val)


def _steps_per_epoch(loader: Any, t: TrainConfig, s: Session) -> int:
    """Whole optimizer steps in an epoch: the dataset over the global batch, the same number
    at every world size that keeps it."""
    steps = len(loader) // s.grad_accum
    if steps == 0:
        raise ConfigError(
            f"{loader.sampler.n} samples make no whole step of batch_size={t.batch_size} x "
            f"{s.world_size} ranks x grad_accum={s.grad_accum}. HINT: lower train.batch_size "
            "or use more data."
        )
    return steps


def exactness_line(
    kept: Exactness, *, resumed: bool, resize: Resize | None, min_nodes: bool
) -> str:
    """The trainer's one log line on exactness (docs/concepts.md, "Exactness").

    ``kept``: what a resume at the same world size keeps here. A resume at another world size
    (``resize``) is sample-exact and nothing more, so it says only that; a resume at the same
    one says only ``kept``. A fresh start says what a later resume of the run will be, and,
    under ``slurm.min_nodes`` (``min_nodes``), what it is should it land on another node
    count.
    """
    if resize is not None:
        return (
            f"exactness: this resume ({resize.before_world} -> {resize.world} ranks, the same "
            f"global batch) is {SAMPLE_EXACT}"
        )
    if resumed:
        return f"exactness: this resume (at its checkpoint's world size) is {kept.value}"
    elsewhere = f" (at another world size: {SAMPLE_EXACT})" if min_nodes else ""
    return f"exactness: a resume of this run is {kept.value}{elsewhere}"


def compile_model(model: nn.Module, fault: FaultConfig) -> None:
    """Compile the module inside ``model``'s DDP wrapper in place (``nn.Module.compile``: its
    calls run ``torch.compile``'d, its state dict keeps its keys, DDP's gradient hooks stay
    eager). Compiling DDP's own forward instead leaves the module uncompiled: Dynamo skips
    DDP's forward and what it calls. Compilation happens in the first step, and again for a
    new shape, under ``fault.startup_timeout_s`` while the launch is within its first
    ``fault.warmup_steps`` steps (the watchdog's warm-up)."""
    if fault.enabled and fault.warmup_steps < 1:
        log.warning(
            "train.compile: the first step compiles the model, but fault.warmup_steps is 0, "
            "so it runs under the step timeout (%d s floor); raise fault.warmup_steps if it "
            "is taken for a hang",
            fault.step_timeout_s,
        )
    log.info("train.compile: torch.compile of the model; its first steps compile it")
    unwrap(model).compile()


def _make_runner(
    t: TrainConfig, s: Session, model: nn.Module, total: int
) -> tuple[StepRunner, bool]:
    """Optimizer, LR schedule and precision for ``model``, restored from the newest checkpoint;
    and whether there was one."""
    optimizer = build_optimizer(t, model.parameters())

    def factor(step: int) -> float:
        return lr_factor(step, total=total, schedule=t.lr_schedule, warmup=t.warmup_steps)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    # Under FSDP train.amp is its MixedPrecisionPolicy (Session.wrap), not autocast.
    precision = Precision.choose(t.amp and t.strategy == "ddp", s.device)
    seed_everything(mix_seed(t.seed, s.rank, 1))  # each rank's own stream (dropout, ...)
    # Elastic: the step loop runs s.grad_accum micro-batches and the data comes from s.loader.
    restored = s.restore(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=precision.scaler,
        elastic=True,
    )
    runner = StepRunner(t, model, optimizer, scheduler, precision, s.device, accum=s.grad_accum)
    return runner, restored is not None


def run_training(cfg: JobConfig, session: Session) -> TrainResult:
    """Train ``cfg.train`` to the end, resuming from the newest checkpoint in the session.

    On an agreed stop signal the session saves, requeues and raises
    :class:`~hpc_ddp.sessions.session.RequeueExit`; this function then never returns.
    """
    if not cfg.train.deterministic:
        with TunedKernels(session.device):
            return _run_training(cfg, session)
    with DeterministicKernels():
        return _run_training(cfg, session)


def _run_training(cfg: JobConfig, session: Session) -> TrainResult:
    t, s = cfg.train, session
    kept = exactness(on_gpu=s.device.type == "cuda", deterministic=t.deterministic)
    seed_everything(t.seed)  # identical initial weights on every rank
    train_ds, val_ds = _datasets(t, s)
    # With 1 or 2 ranks every gradient element is a sum of at most two terms, the same in any
    # bucket layout, so DDP may keep its own order, which overlaps all-reduce with backward.
    model = s.wrap(build_model(t), exact=fixed_buckets(s.world_size, kept), strategy=t.strategy)
    if t.compile:
        compile_model(model, cfg.fault)
    workers = resolve_num_workers(
        t.num_workers, s.device.type, task_cpus(s.env, s.dist.local_world_size)
    )
    log.info("data loader: %d worker process(es) per rank (train.num_workers: %s)", workers,
             t.num_workers)  # fmt: skip
    loader = s.loader(
        train_ds,
        batch_size=t.batch_size,
        num_workers=workers,
        multiple_of=s.grad_accum,
        pin_memory=s.device.type == "cuda",
    )
    steps_per_epoch = _steps_per_epoch(loader, t, s)
    total = plan_total_steps(t, steps_per_epoch)
    runner, resumed = _make_runner(t, s, model, total)
    # Said once the restore is known: before it, an elastic resume was told "bit-identical"
    # here and "sample-exact" by the checkpointer, two words for one resume.
    log.info(
        "%s",
        exactness_line(
            kept,
            resumed=resumed,
            resize=s.resize,
            min_nodes=cfg.slurm.min_nodes is not None,
        ),
    )
    if s.progress.step > total:  # resumed with a shorter run: never "finished" at once
        how = f"train.max_steps={t.max_steps}" if t.max_steps is not None else (
            f"train.epochs={t.epochs} ({steps_per_epoch} steps each)"
        )  # fmt: skip
        raise ConfigError(total_below_checkpoint(s.progress.step, total, how))
    global_batch = t.batch_size * s.world_size * s.grad_accum
    log.info(
        "global batch %d = %d per rank x %d ranks x %d accumulation; %d steps/epoch, steps %d..%d",
        global_batch,
        t.batch_size,
        s.world_size,
        s.grad_accum,
        steps_per_epoch,
        s.progress.step + 1,
        total,
    )
    val = _Validation(_val_loader(val_ds, t, s, workers) if val_ds is not None else None, total)
    report = ProgressReport(t, s, total, global_batch)
    collector.release()  # start-up is over: torch, the model, the restored state (see there)
    _train_loop(t, s, total, loader.forever(), runner, report, val)
    if val.loader is not None and val.step != s.progress.step:
        val.run(s, model, s.progress.step, runner.precision)
    s.checkpoint(wait=True)
    return TrainResult(
        step=s.progress.step,
        epoch=s.progress.epoch,
        loss=report.last_loss,
        val_loss=None if val.result is None else val.result[0],
        val_acc=None if val.result is None else val.result[1],
        weights_digest=weights_digest(full_state_dict(model)),
    )


def _train_loop(
    t: TrainConfig,
    s: Session,
    total: int,
    batches: Iterator[Any],
    runner: StepRunner,
    report: ProgressReport,
    val: _Validation,
) -> None:
    """Steps ``progress.step + 1`` to ``total`` (the session checkpoints and stops between)."""
    evaluating = val.loader is not None and t.eval_every > 0
    for step in s.steps(total, checkpoint_every=t.checkpoint_every):
        runner.step(batches)
        report.after_step(step, runner)
        if evaluating and step % t.eval_every == 0:
            began = time.perf_counter()
            val.run(s, runner.model, step, runner.precision)
            report.meter.pause(time.perf_counter() - began)
