"""The built-in trainer: DDP image classification, written only against the session API.

Checkpoints, stop signals and requeues all go through :class:`~hpc_ddp.runtime.session.Session`, the
same way a user's own script uses them; nothing here has a second path for them.

Per step: ``grad_accum`` micro-batches (DDP's ``no_sync`` on all but the last, so gradients are
all-reduced once), optional autocast on GPU (bf16 where supported, else fp16 with a GradScaler),
an optimizer step and an LR-schedule step. The global batch is ``batch_size x world_size x
grad_accum`` samples.

Resume is bit-identical on CPU (gloo) for any number of ranks. On GPUs it also needs
deterministic kernels (``torch.use_deterministic_algorithms(True)``, cuDNN benchmark off) and
``Session.wrap(exact=True)``; none of them is the default there, as each costs speed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
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

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.errors import ConfigError, HpcDdpError
from hpc_ddp.runtime.checkpoint import weights_digest
from hpc_ddp.runtime.metrics import Throughput, format_progress
from hpc_ddp.runtime.sampler import mix_seed
from hpc_ddp.runtime.session import Session, unwrap
from hpc_ddp.train.data import build_dataset
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
    """Rank 0 builds (and checks) the datasets first, the others after it succeeded."""
    error: str | None = None
    built: tuple[Any, Any] | None = None
    if s.is_main:
        try:
            built = build_dataset(cfg, train=True), build_dataset(cfg, train=False)
        except HpcDdpError as exc:
            error = str(exc)
            if s.world_size == 1:
                raise
    error = s.broadcast_object(error)
    if error is not None:
        raise ConfigError(error)
    if built is None:
        built = build_dataset(cfg, train=True), build_dataset(cfg, train=False)
    assert built[0] is not None
    return built[0], built[1]


def _val_loader(ds: Dataset[Any], cfg: TrainConfig, s: Session) -> DataLoader[Any]:
    shard = Subset(ds, range(s.rank, len(ds), s.world_size))  # type: ignore[arg-type]
    return DataLoader(
        shard,
        batch_size=cfg.batch_size,
        num_workers=cfg.num_workers,
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


def run_training(cfg: JobConfig, session: Session) -> TrainResult:
    """Train ``cfg.train`` to the end, resuming from the newest checkpoint in the session.

    On an agreed stop signal the session saves, requeues and raises
    :class:`~hpc_ddp.runtime.session.RequeueExit`; this function then never returns.
    """
    t, s = cfg.train, session
    seed_everything(t.seed)  # identical initial weights on every rank
    train_ds, val_ds = _datasets(t, s)
    model = s.wrap(build_model(t))
    optimizer = build_optimizer(t, model.parameters())
    loader = s.loader(
        train_ds,
        batch_size=t.batch_size,
        num_workers=t.num_workers,
        multiple_of=t.grad_accum,
        pin_memory=s.device.type == "cuda",
    )
    steps_per_epoch = len(loader) // t.grad_accum
    if steps_per_epoch == 0:
        raise ConfigError(
            f"{loader.sampler.shard_size} samples per rank make no whole step of "
            f"batch_size={t.batch_size} x grad_accum={t.grad_accum}. HINT: lower "
            "train.batch_size or use more data."
        )
    total = plan_total_steps(t, steps_per_epoch)

    def factor(step: int) -> float:
        return lr_factor(step, total=total, schedule=t.lr_schedule, warmup=t.warmup_steps)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    use_amp = t.amp and s.device.type == "cuda"
    if t.amp and not use_amp:
        log.warning("train.amp needs a GPU; training in float32 on %s", s.device)
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda") if use_amp and amp_dtype == torch.float16 else None

    def autocast() -> Any:
        return torch.autocast(s.device.type, dtype=amp_dtype, enabled=use_amp)

    seed_everything(mix_seed(t.seed, s.rank, 1))  # each rank's own stream (dropout, ...)
    s.restore(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    global_batch = t.batch_size * s.world_size * t.grad_accum
    log.info(
        "global batch %d = %d per rank x %d ranks x %d accumulation; %d steps/epoch, steps %d..%d",
        global_batch,
        t.batch_size,
        s.world_size,
        t.grad_accum,
        steps_per_epoch,
        s.progress.step + 1,
        total,
    )
    val_loader = _val_loader(val_ds, t, s) if val_ds is not None else None
    batches = loader.forever()
    criterion = nn.CrossEntropyLoss()
    no_sync: Callable[[], Any] = getattr(model, "no_sync", contextlib.nullcontext)
    window_loss = torch.zeros((), dtype=torch.float64, device=s.device)
    window_steps = 0
    meter = Throughput()
    last_loss: float | None = None
    val: tuple[float, float] | None = None
    val_step = -1

    def run_eval(step: int) -> None:
        nonlocal val, val_step
        assert val_loader is not None
        began = time.perf_counter()
        val, val_step = evaluate(unwrap(model), val_loader, s.device, autocast), step
        meter.pause(time.perf_counter() - began)
        s.log(step=step, epoch=s.progress.epoch, val_loss=val[0], val_acc=val[1])
        log.info("step %d/%d | val_loss %.4f | val_acc %.4f", step, total, val[0], val[1])

    for step in s.steps(total, checkpoint_every=t.checkpoint_every):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(t.grad_accum):
            x, y = next(batches)
            x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
            last = micro == t.grad_accum - 1
            with contextlib.nullcontext() if last else no_sync():
                with autocast():
                    loss = criterion(model(x), y)
                scaled = loss / t.grad_accum
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            window_loss += loss.detach().double() / t.grad_accum
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        window_steps += 1
        meter.add(1, global_batch)
        if step % t.log_every == 0 or step == total:
            # Every rank reaches this all-reduce at the same steps: the schedule is shared.
            dist.all_reduce(window_loss)
            last_loss = float(window_loss) / (window_steps * s.world_size)
            window_loss.zero_()
            window_steps = 0
            rate, step_s = meter.rate()
            meter.reset()
            lr = optimizer.param_groups[0]["lr"]
            s.log(step=step, epoch=s.progress.epoch, loss=last_loss, lr=lr, samples_per_s=rate)
            eta = None if step_s is None else step_s * (total - step)
            log.info(
                format_progress(
                    step=step,
                    total=total,
                    epoch=s.progress.epoch,
                    loss=last_loss,
                    samples_per_s=rate,
                    eta_s=eta,
                )
            )
        if val_loader is not None and t.eval_every > 0 and step % t.eval_every == 0:
            run_eval(step)
    if val_loader is not None and val_step != s.progress.step:
        run_eval(s.progress.step)
    s.checkpoint(wait=True)
    return TrainResult(
        step=s.progress.step,
        epoch=s.progress.epoch,
        loss=last_loss,
        val_loss=None if val is None else val[0],
        val_acc=None if val is None else val[1],
        weights_digest=weights_digest(unwrap(model).state_dict()),
    )
