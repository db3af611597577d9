"""The built-in trainer's step: micro-batches, mixed precision, optimizer; and its progress log.

Split from :mod:`hpc_ddp.train.trainer` so that what runs every step is small and visible: one
forward/backward per micro-batch, one optimizer and LR-schedule step, and one in-place add for
the loss window. Everything else (the loss all-reduce, metrics rows, progress lines) happens
only every ``log_every`` steps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.runtime.metrics import Throughput, format_progress
from hpc_ddp.runtime.session import Session

log = logging.getLogger("hpc_ddp.train.trainer")


@dataclass(frozen=True)
class Precision:
    """Autocast and loss scaling for one run (float32 unless ``train.amp`` on a GPU)."""

    enabled: bool
    dtype: torch.dtype
    scaler: torch.amp.GradScaler | None

    @classmethod
    def choose(cls, amp: bool, device: torch.device) -> Precision:
        """bf16 where the GPU supports it, else fp16 with a GradScaler; float32 on CPU."""
        enabled = amp and device.type == "cuda"
        if amp and not enabled:
            log.warning("train.amp needs a GPU; training in float32 on %s", device)
        dtype = torch.bfloat16 if enabled and torch.cuda.is_bf16_supported() else torch.float16
        scaler = torch.amp.GradScaler("cuda") if enabled and dtype == torch.float16 else None
        return cls(enabled, dtype, scaler)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The forward pass's context; a plain null context in float32 (nothing to switch)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)


class StepRunner:
    """One optimizer step: ``grad_accum`` micro-batches, all-reduced once (``no_sync``)."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        precision: Precision,
        device: torch.device,
    ) -> None:
        self.accum = cfg.grad_accum
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.device = device
        self.criterion = nn.CrossEntropyLoss()
        self._no_sync: Callable[[], Any] = getattr(model, "no_sync", contextlib.nullcontext)
        # The sum of every micro-batch's loss since the last report; divided only when read,
        # so a step costs one in-place add here, not a cast, a division and an add.
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)

    def step(self, batches: Iterator[Any]) -> None:
        """Run one whole optimizer step on the next ``grad_accum`` batches."""
        self.optimizer.zero_grad(set_to_none=True)
        for micro in range(self.accum):
            x, y = next(batches)
            if micro == self.accum - 1:
                self._forward_backward(x, y)  # the last one all-reduces the gradients
            else:
                with self._no_sync():
                    self._forward_backward(x, y)
        scaler = self.precision.scaler
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self.precision.autocast(self.device):
            loss = self.criterion(self.model(x), y)
        scaled = loss / self.accum if self.accum > 1 else loss
        scaler = self.precision.scaler
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        self.loss_sum += loss.detach()

    def take_mean_loss(self, steps: int, world_size: int) -> float:
        """The mean micro-batch loss over the last ``steps`` steps of every rank (collective);
        the window starts again."""
        dist.all_reduce(self.loss_sum)
        mean = float(self.loss_sum) / (steps * self.accum * world_size)
        self.loss_sum.zero_()
        return mean


class ProgressReport:
    """Every ``log_every`` steps (and at the last): mean loss, a metrics row, a progress line."""

    def __init__(self, cfg: TrainConfig, session: Session, total: int, global_batch: int):
        self.every = cfg.log_every
        self.session = session
        self.total = total
        self.global_batch = global_batch
        self.meter = Throughput()
        self.window_steps = 0
        self.last_loss: float | None = None

    def after_step(self, step: int, runner: StepRunner) -> None:
        """Count ``step``; at a reporting step, report (every rank: it all-reduces)."""
        self.window_steps += 1
        self.meter.add(1, self.global_batch)
        if step % self.every == 0 or step == self.total:
            self._report(step, runner)

    def _report(self, step: int, runner: StepRunner) -> None:
        s = self.session
        # Every rank reaches this all-reduce at the same steps: the schedule is shared.
        self.last_loss = runner.take_mean_loss(self.window_steps, s.world_size)
        self.window_steps = 0
        rate, step_s = self.meter.rate()
        self.meter.reset()
        lr = runner.optimizer.param_groups[0]["lr"]
        s.log(step=step, epoch=s.progress.epoch, loss=self.last_loss, lr=lr, samples_per_s=rate)
        if log.isEnabledFor(logging.INFO):  # not on ranks that log warnings only: skip the text
            eta = None if step_s is None else step_s * (self.total - step)
            line = format_progress(
                step=step,
                total=self.total,
                epoch=s.progress.epoch,
                loss=self.last_loss,
                samples_per_s=rate,
                eta_s=eta,
            )
            log.info(line)
