"""The baseline for ``bench_trainer``: the DDP loop a researcher writes by hand.

Same model (:func:`hpc_ddp.train.models.build_model`), same dataset
(:func:`hpc_ddp.train.data.build_dataset`),
same per-rank batch, SGD with momentum and a cosine schedule; nothing else: no checkpoints, no
stop agreement, no metrics, no logging. A deliberately strict baseline.

On a GPU (``device`` given) it is the tutorials' loop: DDP over NCCL, a DataLoader with
``cfg.num_workers`` workers, pinned memory and ``persistent_workers``, non-blocking copies and
bf16 autocast when ``cfg.amp``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.train.data import build_dataset
from hpc_ddp.train.models import build_model


def train_handwritten(
    cfg: TrainConfig,
    *,
    rank: int,
    world_size: int,
    init_method: str,
    total: int,
    device: torch.device | None = None,
    on_step: Callable[[int], None] | None = None,
    persistent: bool = True,
    log_every: int = 0,
) -> list[float]:
    """Run ``total`` steps; returns ``perf_counter()`` before step 1 and after every step.

    ``on_step(step)`` runs after each step, before its mark (the GPU benchmark's syncs);
    ``persistent=False`` starts the loader's workers anew every epoch; ``log_every``: read the
    loss (``loss.item()``) every that many steps, as a loop that prints its progress does."""
    gpu = device is not None and device.type == "cuda"
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    try:
        torch.manual_seed(cfg.seed)
        dataset = build_dataset(cfg, train=True)
        assert dataset is not None
        workers = cfg.num_workers if isinstance(cfg.num_workers, int) else 0
        if gpu:
            assert device is not None
            model = nn.parallel.DistributedDataParallel(
                build_model(cfg).to(device), device_ids=[device]
            )
        else:
            model = nn.parallel.DistributedDataParallel(build_model(cfg))
        optimizer = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
        sampler: DistributedSampler[object] = DistributedSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            seed=cfg.seed,
        )
        loader = DataLoader(
            dataset,
            batch_size=cfg.batch_size,
            sampler=sampler,
            drop_last=True,
            num_workers=workers,
            pin_memory=gpu,
            persistent_workers=persistent and workers > 0,
        )
        criterion = nn.CrossEntropyLoss()
        amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu and cfg.amp)
        losses: list[float] = []
        marks = [time.perf_counter()]
        step, epoch = 0, 0
        while step < total:
            sampler.set_epoch(epoch)
            for images, labels in loader:
                x, y = images, labels
                if device is not None:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                with amp:
                    loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                if log_every and step % log_every == 0:
                    losses.append(loss.item())
                if on_step is not None:
                    on_step(step)
                marks.append(time.perf_counter())
                if step == total:
                    break
            epoch += 1
        return marks
    finally:
        dist.destroy_process_group()
