"""Measure what the per-step stop agreement costs, apart from any trainer.

Run: ``OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/agree_cost.py``
(``BENCH_N`` calls each, default 2000; ``BENCH_HIDDEN`` the hidden width, default 256).
Prints, on rank 0, microseconds per call of: StopFlag.agree() alone, and a small DDP training
step without and with the agreement. A diagnostic with no target of its own (so
``run_all.py`` does not run it): :mod:`benchmarks.bench_trainer` holds the whole trainer,
agreement included, to its target against a hand-written loop.
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.runtime.stopflag import StopFlag


def per_call_us(fn: object, n: int) -> float:
    assert callable(fn)
    for _ in range(20):
        fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    hidden = int(os.environ.get("BENCH_HIDDEN", "256"))
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(192, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 192), torch.randint(10, (32,))
    flag = StopFlag([signal.SIGUSR2]).install()

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()

    def step_and_agree() -> None:
        step()
        flag.agree()

    n = int(os.environ.get("BENCH_N", "2000"))
    out = {
        "agree_us": per_call_us(flag.agree, n),
        "step_us": per_call_us(step, n),
        "step_and_agree_us": per_call_us(step_and_agree, n),
        "world": dist.get_world_size(),
    }
    flag.close()
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
