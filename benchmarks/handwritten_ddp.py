"""The baseline for ``bench_trainer``: the DDP loop a researcher writes by hand.

Same model (:func:`hpc_ddp.train.models.build_model`), same dataset
(:func:`hpc_ddp.train.data.build_dataset`),
same per-rank batch, SGD with momentum and a cosine schedule; nothing else: no checkpoints, no
stop agreement, no metrics, no logging. A deliberately strict baseline.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.train.data import build_dataset
from hpc_ddp.train.models import build_model


def train_handwritten(
    cfg: TrainConfig, *, rank: int, world_size: int, init_method: str, total: int
) -> list[float]:
    """Run ``total`` steps; returns ``perf_counter()`` before step 1 and after every step."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        torch.manual_seed(cfg.seed)
        dataset = build_dataset(cfg, train=True)
        assert dataset is not None
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
        loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
        criterion = nn.CrossEntropyLoss()
        marks = [time.perf_counter()]
        step, epoch = 0, 0
        while step < total:
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                marks.append(time.perf_counter())
                if step == total:
                    break
            epoch += 1
        return marks
    finally:
        dist.destroy_process_group()
