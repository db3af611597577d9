"""A model that does not fit one rank's memory trains when FSDP shards it over 2 ranks.

Each rank caps its own memory (``RLIMIT_DATA``: its heap and anonymous mappings, what
tensors live in) before it imports torch, builds a stack of ``Linear(W, W)`` blocks, wraps it
through a session (``s.wrap(model, strategy=...)``), and trains AdamW steps on random data.
Held in full, the model's training state is 4 bytes x 4 copies per parameter (weights,
gradients, Adam's two moments); DDP holds all of it on every rank, FSDP a half on each of 2.

The script first runs both strategies uncapped, to measure each rank's peak resident memory,
then runs both under one cap: a quarter of the way from FSDP's peak to DDP's, and below the
full training state. Targets: the cap is below the full training state, DDP fails under it (it
needs more than the rank may have), FSDP trains every step under it (exit status 1 otherwise).

    python -m benchmarks.fsdp_memory_cap [--width 4096] [--blocks 12] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import Targets
from benchmarks.ranks import run_ranks

WORLD = 2


def rank_main(args: argparse.Namespace) -> None:
    """One rank: cap, build, wrap, train; print one JSON line (peak RSS, steps done, error)."""
    if args.cap_bytes:
        resource.setrlimit(resource.RLIMIT_DATA, (args.cap_bytes, args.cap_bytes))
    out: dict[str, Any] = {"steps": 0, "error": None}
    try:
        import torch
        from torch import nn

        from hpc_ddp.config.model import JobConfig
        from hpc_ddp.sessions.session import Session

        torch.manual_seed(0)
        with Session(Path(args.run_dir), JobConfig(name="memory-cap")) as s:
            blocks = [nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())]
            blocks += [nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
                       for _ in range(args.blocks - 1)]  # fmt: skip
            model = s.wrap(nn.Sequential(*blocks), strategy=args.strategy, shard=["Sequential"])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randn(8, args.width)
            for _ in range(args.steps):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                out["steps"] += 1
    except Exception as exc:  # the out-of-memory this benchmark provokes, reported as data
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


def run(strategy: str, args: argparse.Namespace, cap_bytes: int) -> list[dict[str, Any]]:
    """Both ranks of one strategy; each rank's JSON line (or its failure, as data)."""
    with tempfile.TemporaryDirectory(prefix="memcap-") as run_dir:
        argv = ["-m", "benchmarks.fsdp_memory_cap", "--rank", "--strategy", strategy,
                "--width", str(args.width), "--blocks", str(args.blocks), "--steps",
                str(args.steps), "--cap-bytes", str(cap_bytes), "--run-dir", run_dir]  # fmt: skip
        results = run_ranks(argv, WORLD, {"HPC_DDP_RUN_DIR": run_dir}, timeout_s=args.timeout)
    rows = []
    for r in results:
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"steps": 0, "peak_rss_bytes": None}
        if r.returncode != 0 and not row.get("error"):
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            row["error"] = f"exit {r.returncode}: {tail[:200]}"
        rows.append(row)
    return rows


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--cap-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        rank_main(args)
        return 0
    params = args.blocks * (args.width * args.width + args.width)
    state = 16 * params  # fp32 weights, gradients and Adam's two moments
    print(f"model: {params / 1e6:.0f} M parameters; training state in full {_gb(state)}")
    peaks = {}
    for strategy in ("ddp", "fsdp"):
        rows = run(strategy, args, 0)
        if any(r.get("error") for r in rows):
            print(f"{strategy} uncapped failed: {rows}")
            return 1
        peaks[strategy] = max(r["peak_rss_bytes"] for r in rows)
        print(f"{strategy:4} uncapped: peak resident per rank {_gb(peaks[strategy])}")
    cap = int(peaks["fsdp"] + (peaks["ddp"] - peaks["fsdp"]) / 4)
    print(f"cap per rank (RLIMIT_DATA): {_gb(cap)}, {cap / state:.2f}x the full training state")
    outcome = {}
    for strategy in ("ddp", "fsdp"):
        rows = run(strategy, args, cap)
        trained = all(r["steps"] == args.steps and not r.get("error") for r in rows)
        outcome[strategy] = trained
        for rank, r in enumerate(rows):
            error = f", {r['error']}" if r.get("error") else ""
            print(f"{strategy:4} capped, rank {rank}: {r['steps']}/{args.steps} steps, peak "
                  f"{_gb(r.get('peak_rss_bytes'))}{error}")  # fmt: skip
    targets = Targets()
    targets.check("cap / full training state", cap / state, "<", 1.0)
    targets.check("DDP ranks that trained under the cap", float(outcome["ddp"]), "==", 0.0)
    targets.check("FSDP ranks that trained under the cap", float(outcome["fsdp"]), "==", 1.0)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
