"""Measure what a checkpoint costs the training loop, for the default mlp and resnet18.

Usage: ``python -m benchmarks.checkpoint_cost RUN_DIR [MODEL ...]``. One process, CPU, SGD with
momentum (so the optimizer state is as large as the weights). Prints one JSON line per model:
the time ``Session.checkpoint()`` blocks the training thread (RNG gather + CPU snapshot), the
time until the file is durable (digest + torch.save + fsync + rename, on the background
thread), and the file size. No target of its own: :mod:`benchmarks.bench_trainer` (b) holds
these figures against ``dd conv=fsync`` of the same bytes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.runtime.session import Session
from hpc_ddp.train.models import build_model


def measure(run_dir: Path, name: str, repeats: int = 3, warmup: int = 1) -> dict[str, object]:
    """The best of ``repeats`` checkpoints of model ``name`` in ``run_dir / name``, after
    ``warmup`` ones not counted: a process's first save pays one-time costs (fresh memory for
    the snapshot, the writer thread) that a training run pays once, not at every checkpoint.
    """
    cfg = JobConfig(name="bench", train=TrainConfig(model=name, keep_last=2))
    with Session(run_dir / name, cfg, env={}) as s:
        model = s.wrap(build_model(cfg.train))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        opt.step()
        s.restore(model=model, optimizer=opt)
        blocking, durable = [], []
        for _ in range(warmup + repeats):
            s.progress.step += 1
            start = time.perf_counter()
            s.checkpoint()
            blocking.append(time.perf_counter() - start)
            s.checkpoint(wait=True)
            durable.append(time.perf_counter() - start)
        blocking, durable = blocking[warmup:], durable[warmup:]
        path = s.paths.checkpoints / f"step-{s.progress.step:08d}.pt"
        return {
            "model": name,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "file_mb": path.stat().st_size / 2**20,
            "blocking_s": min(blocking),
            "durable_s": min(durable),
        }


def main() -> None:
    run_dir = Path(sys.argv[1])
    for name in sys.argv[2:] or ["mlp", "resnet18"]:
        print(json.dumps(measure(run_dir, name)), flush=True)


if __name__ == "__main__":
    main()
