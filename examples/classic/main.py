"""A classic DDP tutorial script, as written for ``torch.distributed.launch``: it takes its
local rank from ``--local_rank`` and nothing from hpc-ddp. ``jobs/local-rank.yaml`` runs it one
Slurm task per GPU with ``dist.local_rank_arg: --local_rank``; RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT come from ``hpc-ddp run`` as torchrun would set them.

    hpc-ddp submit jobs/local-rank.yaml --backend local --wait
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", args.local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randint(0, 4, (512,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(
        nn.Linear(8, 4).to(device), device_ids=[args.local_rank] if cuda else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} (local rank {args.local_rank})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
