"""``hpc-ddp checkpoints RUN_DIR [--json] [--verify]``: step, epoch, time, size, weights digest."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tabulate import tabulate

from hpc_ddp.errors import RunDirError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument(
        "--verify", action="store_true", help="recompute each digest from the tensors"
    )


def run(args: argparse.Namespace) -> int:
    """List the checkpoints (this command imports torch: it reads the files)."""
    from hpc_ddp.checkpoint import list_checkpoints

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory.")
    infos = list_checkpoints(run_dir, verify=args.verify)
    rows = [
        {
            "path": str(i.path),
            "step": i.step,
            "epoch": i.epoch,
            "time": i.time,
            "size": i.size,
            "weights_digest": i.weights_digest,
            "error": i.error,
        }
        for i in infos
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [
        [
            i.path.name,
            i.step,
            i.epoch,
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.time)) if i.time else "-",
            f"{i.size / 1e6:.1f} MB",
            (i.weights_digest or "-")[:16],
            i.error or "ok",
        ]
        for i in infos
    ]
    print(tabulate(table, headers=["file", "step", "epoch", "saved", "size", "digest", "state"]))
    return 1 if infos and infos[-1].error else 0
