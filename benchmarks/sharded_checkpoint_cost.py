"""What a sharded (FSDP) checkpoint costs on 2 ranks, against ``dd conv=fsync`` of the same bytes.

Usage: ``python -m benchmarks.sharded_checkpoint_cost DIR [--mb MB] [--rounds N]``. Starts 2 CPU
ranks (:mod:`benchmarks.ranks`), each a :class:`~hpc_ddp.sessions.session.Session` with a model
of four square linear layers sharded by ``s.wrap(model, strategy="fsdp")`` and AdamW after one
step (weights and two moments: about MB megabytes in all, half per rank). Each round, on every
rank: the time ``s.checkpoint()`` blocks the training thread (the copy of its shard into kept
host buffers), then the time until the shard set is committed (every rank's DCP write, the
digests, rank 0's record and rename: ``s.checkpoint(wait=True)``); then both ranks ``dd
bs=1M conv=fsync`` their own shard file (from the page cache) into the same directory at the
same moment, the same bytes written the same way in parallel; every other round dd goes
first (of the round before's set). One uncounted round first (the
first save maps the buffers and forms the writer's process group). Targets, as the file
checkpoints' in :mod:`benchmarks.bench_trainer`: stall <= 0.2x dd, durable <= 1.5x dd (the
slower rank's, median over rounds).

Prints one JSON line (rank 0): every round's seconds, the medians and the two ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STALL_TARGET = 0.2
DURABLE_TARGET = 1.5


def rank_main(directory: Path, mb: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from hpc_ddp.config.model import JobConfig, TrainConfig
    from hpc_ddp.sessions.session import Session

    torch.set_num_threads(1)
    # 4 layers of w x w float32, x 3 (weights and AdamW's two moments): mb megabytes.
    width = int(math.sqrt(mb * 1e6 / (4 * 3 * 4)))
    cfg = JobConfig(name="bench", train=TrainConfig(strategy="fsdp", keep_last=1))
    with Session(directory / "run", cfg) as s:
        torch.manual_seed(0)
        model = s.wrap(nn.Sequential(*(nn.Linear(width, width) for _ in range(4))))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        s.restore(model=model, optimizer=opt)
        model(torch.randn(2, width)).sum().backward()
        opt.step()
        rows = []
        checkpoints = directory / "run" / "checkpoints"
        for r in range(rounds + 1):
            s.progress.step += 1
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1e-3)  # as training changes them between checkpoints
            # In a rotated order, as benchmarks.checkpoint_cost: here a write's speed depends
            # on what ran just before it (1 GB: dd took 0.56 s right after a save, 1.1 s
            # before one), so neither measurement always runs in the other's wake.
            dd_first = r % 2 == 1
            if dd_first:  # the set of the round before: the same bytes, shard for shard
                before = checkpoints / f"step-{s.progress.step - 1:08d}"
                dd = _dd(before / f"__{s.rank}_0.distcp", directory / f"dd-{s.rank}.bin", s.barrier)
            gc.collect()
            s.barrier()
            os.sync()
            s.barrier()
            start = time.perf_counter()
            s.checkpoint()
            stall = time.perf_counter() - start
            s.checkpoint(wait=True)
            durable = time.perf_counter() - start
            s.barrier()
            shard = checkpoints / f"step-{s.progress.step:08d}"
            if not dd_first:
                dd = _dd(shard / f"__{s.rank}_0.distcp", directory / f"dd-{s.rank}.bin", s.barrier)
            if r > 0:  # the first round maps buffers and forms the writer's group
                rows.append({"stall_s": stall, "durable_s": durable, "dd_s": dd})
        every: list[Any] | None = [None] * s.world_size if s.is_main else None
        dist.gather_object(rows, every, dst=0)
        if s.is_main:
            assert every is not None
            print(json.dumps(_summary(every, mb, shard)), flush=True)


def _dd(source: Path, target: Path, barrier: Any) -> float:
    with source.open("rb") as f:  # into the page cache, as the snapshot is in memory
        while f.read(8 << 20):
            pass
    os.sync()
    barrier()
    start = time.perf_counter()
    subprocess.run(
        ["dd", f"if={source}", f"of={target}", "bs=1M", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - start
    barrier()
    target.unlink()
    return seconds


def _summary(every: list[Any], mb: int, shard: Path) -> dict[str, Any]:
    """Per round the slower rank's seconds; medians and the ratios to dd."""
    rounds = [
        {key: max(rank[i][key] for rank in every) for key in ("stall_s", "durable_s", "dd_s")}
        for i in range(len(every[0]))
    ]
    med = {k: statistics.median(r[k] for r in rounds) for k in ("stall_s", "durable_s", "dd_s")}
    stall, durable = med["stall_s"] / med["dd_s"], med["durable_s"] / med["dd_s"]
    return {
        "state_mb": mb,
        "ranks": len(every),
        "shard_set_bytes": sum(p.stat().st_size for p in shard.iterdir()),
        "rounds": rounds,
        "median": med,
        "stall_over_dd": round(stall, 3),
        "durable_over_dd": round(durable, 3),
        "stall_ok": stall <= STALL_TARGET,
        "durable_ok": durable <= DURABLE_TARGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.dir, args.mb, args.rounds)
        return 0
    from benchmarks.common import Targets
    from benchmarks.ranks import run_ranks

    args.dir.mkdir(parents=True, exist_ok=True)
    argv = ["-m", "benchmarks.sharded_checkpoint_cost", str(args.dir), "--rank",
            "--mb", str(args.mb), "--rounds", str(args.rounds)]  # fmt: skip
    results = run_ranks(argv, 2, {}, timeout_s=600)
    for rank, res in enumerate(results):
        if res.returncode != 0:
            sys.exit(f"rank {rank} exited {res.returncode}:\n{res.stderr[-3000:]}")
    line = results[0].stdout.strip().splitlines()[-1]
    print(line)
    summary = json.loads(line)
    targets = Targets()
    targets.check(f"sharded {args.mb} MB stall / dd", summary["stall_over_dd"], "<=", STALL_TARGET)
    targets.check(
        f"sharded {args.mb} MB durable / dd", summary["durable_over_dd"], "<=", DURABLE_TARGET
    )
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
