"""The built-in trainer's step: micro-batches, mixed precision, deterministic kernels, optimizer;
and its progress log.

Split from :mod:`hpc_ddp.train.trainer` so that what runs every step is small and visible: one
forward/backward per micro-batch, one optimizer and LR-schedule step, and one in-place add for
the loss window. Everything else (the loss all-reduce, metrics rows, progress lines) happens
only every ``log_every`` steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.config.exactness import DETERMINISTIC_ENV
from hpc_ddp.config.model import TrainConfig
from hpc_ddp.runtime.metrics import Throughput
from hpc_ddp.runtime.sharding import no_sync
from hpc_ddp.sessions.session import Session

log = logging.getLogger("hpc_ddp.train.trainer")


@dataclass(frozen=True)
class Precision:
    """Autocast and loss scaling for one run (float32 unless ``train.amp`` on a GPU)."""

    enabled: bool
    dtype: torch.dtype
    scaler: torch.amp.GradScaler | None

    @classmethod
    def choose(cls, amp: bool, device: torch.device) -> Precision:
        """bf16 where the GPU computes in it natively, else fp16 with a GradScaler; float32 on
        CPU.

        ``is_bf16_supported()`` alone also says yes for GPUs that only emulate bf16 (a T4 or
        V100 creates bf16 tensors but has no bf16 tensor cores): those get fp16 instead.
        """
        enabled = amp and device.type == "cuda"
        if amp and not enabled:
            log.warning("train.amp needs a GPU; training in float32 on %s", device)
        if not enabled:
            return cls(False, torch.float16, None)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            log.info("train.amp: bfloat16 autocast on %s", device)
            return cls(True, torch.bfloat16, None)
        major, minor = torch.cuda.get_device_capability(device)
        log.info(
            "train.amp: float16 autocast with a GradScaler on %s (sm_%d%d has no native bfloat16)",
            device,
            major,
            minor,
        )
        return cls(True, torch.float16, torch.amp.GradScaler("cuda"))

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The forward pass's context; a plain null context in float32 (nothing to switch)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)


_NO_DETERMINISTIC = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")
"""torch's warning when ``use_deterministic_algorithms(True, warn_only=True)`` meets an op
that has no deterministic version (it names the op first)."""


class DeterministicKernels:
    """``train.deterministic`` for the ``with`` block: the same kernels, and so the same bits,
    every run.

    cuDNN picks deterministic algorithms and never autotunes; ``CUBLAS_WORKSPACE_CONFIG`` (which
    ``hpc-ddp run`` has already set before CUDA started) makes cuBLAS deterministic; every other
    op with a deterministic version uses it. An op without one is not refused: it runs, torch
    warns, and the log names it once (:attr:`fallbacks`): that run is then step-exact only.
    The previous settings come back on exit.
    """

    def __init__(self) -> None:
        self.fallbacks: list[str] = []
        """The ops that ran without a deterministic version, in the order first seen."""
        self._saved: tuple[Any, ...] = ()

    def __enter__(self) -> DeterministicKernels:
        for name, value in DETERMINISTIC_ENV:
            os.environ.setdefault(name, value)  # not run by `hpc-ddp run`: still before cuBLAS
        self._saved = (
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            warnings.showwarning,
        )
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        # Imports torch._inductor.config, about 1.5 s: one more reason it is not the default.
        torch.use_deterministic_algorithms(True, warn_only=True)
        warnings.showwarning = self._show
        return self

    def __exit__(self, *exc: object) -> None:
        benchmark, cudnn_deterministic, algorithms, warn_only, show = self._saved
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cudnn.deterministic = cudnn_deterministic
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        warnings.showwarning = show

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        found = _NO_DETERMINISTIC.match(str(message))
        if found is None:
            self._saved[-1](message, category, filename, lineno, file, line)
            return
        if found["op"] not in self.fallbacks:
            self.fallbacks.append(found["op"])
            log.warning(
                "train.deterministic: %s has no deterministic implementation, so this run is "
                "step- and sample-exact, not bitwise",
                found["op"],
            )


class TunedKernels:
    """cuDNN's autotuner for the ``with`` block on a GPU, where :attr:`enabled` (off for
    ``train.deterministic``): each convolution shape is timed once and its fastest algorithm
    kept. Off by default, as in a hand-written loop: on an H200 (resnet18, 64 px, bf16) it
    bought 0.4 % samples/s and cost 2.6 s at every launch's first step (``bench_gpu
    --diagnose``), which an in-job restart pays again. The previous setting comes back on exit.
    """

    enabled = False
    """On: autotune (the GPU benchmark's ``--diagnose`` measures the choice)."""

    def __init__(self, device: torch.device) -> None:
        self.on = self.enabled and device.type == "cuda"
        self._saved = torch.backends.cudnn.benchmark

    def __enter__(self) -> TunedKernels:
        if self.on:
            torch.backends.cudnn.benchmark = True
        return self

    def __exit__(self, *exc: object) -> None:
        torch.backends.cudnn.benchmark = self._saved


class StepRunner:
    """One optimizer step: ``grad_accum`` micro-batches, reduced once (``no_sync``, or FSDP's
    counterpart)."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        precision: Precision,
        device: torch.device,
        *,
        accum: int | None = None,
    ) -> None:
        self.accum = cfg.grad_accum if accum is None else accum
        """Micro-batches per step: the session's ``grad_accum`` (``cfg.grad_accum`` rescaled
        to keep the global batch at another world size)."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.device = device
        self.criterion = nn.CrossEntropyLoss()
        self._no_sync: Callable[[], Any] = lambda: no_sync(model)  # DDP's or FSDP's
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
        rate, _ = self.meter.rate()
        self.meter.reset()
        lr = runner.optimizer.param_groups[0]["lr"]
        # The session logs the progress line for this row (step/total, samples/s, ETA).
        s.log(step=step, epoch=s.progress.epoch, loss=self.last_loss, lr=lr, samples_per_s=rate)
