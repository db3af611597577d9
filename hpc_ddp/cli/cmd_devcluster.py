"""``hpc-ddp dev-cluster up | down | status``: a real two-node Slurm on this machine."""

from __future__ import annotations

import argparse
import os

from hpc_ddp.devcluster import cluster as devcluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--state-dir",
        help=f"where the cluster's files live (default ${devcluster.STATE_DIR_ENV} "
        f"or {devcluster.DEFAULT_STATE_DIR})",
    )
    parser.add_argument("--purge", action="store_true", help="with down: delete the state dir")


def run(args: argparse.Namespace) -> int:
    """Bring the cluster up or down, or show it."""
    state_dir = devcluster.state_dir_from(os.environ, args.state_dir)
    if args.action == "up":
        result = devcluster.up(state_dir, os.environ)
        started = ", ".join(result.started) or "nothing (already running)"
        print(f"dev cluster up in {result.seconds:.1f} s; started: {started}")
        print(f"export SLURM_CONF={result.conf}")
    elif args.action == "down":
        stopped = devcluster.down(state_dir, purge=args.purge)
        print(f"dev cluster down; stopped: {', '.join(stopped) or 'nothing (not running)'}")
    else:
        pids, sinfo = devcluster.status(state_dir)
        for name, pid in pids.items():
            print(f"{name:12} {'running, pid ' + str(pid) if pid else 'stopped'}")
        print(sinfo)
        return 0 if all(pids.values()) else 3
    return 0
