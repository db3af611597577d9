"""``hpc-ddp logs RUN_DIR [--rank N] [--err] [--follow]``: a run's per-rank or batch logs."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir import RunPaths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("--rank", type=int, default=0, help="which rank's log (default 0)")
    parser.add_argument("--err", action="store_true", help="stderr instead of stdout")
    parser.add_argument("--batch", action="store_true", help="the batch script's own log")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--follow-for", type=float, default=None, help=argparse.SUPPRESS)


def log_path(paths: RunPaths, *, rank: int, err: bool, batch: bool) -> Path:
    """The log file asked for; a missing one is a RunDirError listing what exists."""
    stream = "err" if err else "out"
    if batch:
        found = sorted(paths.logs.glob(f"batch-*.{stream}"))
        if found:
            return found[-1]
    else:
        path = paths.rank_log(rank, stream)
        if path.exists():
            return path
    have = sorted(p.name for p in paths.logs.glob("*")) if paths.logs.is_dir() else []
    raise RunDirError(
        f"{paths.logs}: no {'batch' if batch else f'rank-{rank}'}.{stream} log yet. "
        f"HINT: logs present: {', '.join(have) or 'none (has the job started?)'}."
    )


def run(args: argparse.Namespace) -> int:
    """Print the log, then follow it if asked."""
    paths = RunPaths(Path(args.run_dir))
    path = log_path(paths, rank=args.rank, err=args.err, batch=args.batch)
    deadline = None if args.follow_for is None else time.monotonic() + args.follow_for
    with path.open("r", errors="replace") as f:
        while True:
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
            if not args.follow or (deadline is not None and time.monotonic() > deadline):
                return 0
            time.sleep(args.poll)
