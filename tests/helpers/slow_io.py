"""One rank of a run whose rank 0 reads and writes checkpoints slower than ``dist.timeout_s``.

Usage: slow_io.py RUN_DIR TOTAL SLOW_WRITE_S SLOW_LOAD_S TIMEOUT_S CHECKPOINT_TIMEOUT_S [LATE_S
[LATE_AT]]

A session with ``dist.timeout_s = TIMEOUT_S`` and ``fault.checkpoint_timeout_s =
CHECKPOINT_TIMEOUT_S`` trains a small DDP model to step TOTAL, checkpointing every 2 steps and at
the end. On rank 0 every checkpoint write first sleeps SLOW_WRITE_S and every ``torch.load``
SLOW_LOAD_S (a large state on a slow shared file system). The ranks start their sessions
together (each waits for the others' ready file first), so that only the slow I/O, and not a
slow ``import torch`` on a busy machine, can outlast the short timeout. Prints
``{"rank", "resumed_from", "step", "digest"}`` as JSON. LATE_S: rank 1 builds its model that
much later than rank 0 (a slow node's start-up), after the process group is joined; LATE_AT
``step``: rank 1 is that late to its second step instead (training has begun).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hpc_ddp.checkpoint.writer as checkpoint_module
from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.config.model import DistConfig, FaultConfig, JobConfig, TrainConfig
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.sessions.session import Session


def slow_down(write_s: float, load_s: float) -> None:
    """Rank 0's file I/O, made slow."""
    write, load = checkpoint_module.write_checkpoint, torch.load

    def slow_write(*args: Any, **kwargs: Any) -> Path:
        time.sleep(write_s)
        return write(*args, **kwargs)

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        time.sleep(load_s)
        return load(*args, **kwargs)

    checkpoint_module.write_checkpoint = slow_write
    torch.load = slow_load


def start_together(run_dir: Path, rank: int, world: int) -> None:
    ready = run_dir / "ready" / os.environ["MASTER_PORT"]  # one launch's ranks
    ready.mkdir(parents=True, exist_ok=True)
    (ready / str(rank)).write_text("")
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < world and time.monotonic() < deadline:
        time.sleep(0.02)


def main() -> None:
    run_dir, total = Path(sys.argv[1]), int(sys.argv[2])
    write_s, load_s, timeout_s, io_timeout_s = (float(a) for a in sys.argv[3:7])
    late_s = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    late_at = sys.argv[8] if len(sys.argv) > 8 else "model"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        slow_down(write_s, load_s)
    config = JobConfig(
        name="slow-io",
        dist=DistConfig(timeout_s=int(timeout_s)),
        train=TrainConfig(keep_last=3),
        fault=FaultConfig(checkpoint_timeout_s=int(io_timeout_s)),
    )
    start_together(run_dir, rank, world)
    with Session(run_dir, config) as s:
        torch.manual_seed(0)
        if rank == 1 and late_at == "model":
            time.sleep(late_s)
        model = s.wrap(nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loaded = s.restore(model=model, optimizer=opt)
        resumed_from = None if loaded is None else loaded.step
        x = torch.linspace(-1, 1, 16).reshape(2, 8) * (rank + 1)
        for step in s.steps(total, checkpoint_every=2):
            if rank == 1 and late_at == "step" and step == 2:
                time.sleep(late_s)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        s.checkpoint(wait=True)
        digest = weights_digest(unwrap(model).state_dict())
        step = s.progress.step
    print(json.dumps({"rank": rank, "resumed_from": resumed_from, "step": step, "digest": digest}))


if __name__ == "__main__":
    main()
