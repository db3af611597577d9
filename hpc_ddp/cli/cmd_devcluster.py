"""``hpc-ddp dev-cluster up | down | status``: a real multi-node Slurm on this machine, with
accounting (slurmdbd and MariaDB) and fake GPUs if asked; ``--json`` prints one JSON object."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import MAX_NODES, SLOTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--state-dir",
        help=f"where the cluster's files live (default ${devcluster.STATE_DIR_ENV} "
        f"or {devcluster.DEFAULT_STATE_DIR}); each state dir is its own cluster",
    )
    parser.add_argument("--purge", action="store_true", help="with down: delete the state dir")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    shape = parser.add_argument_group(
        "with up: the cluster's shape (default: what it had last time, else the values shown)"
    )
    shape.add_argument(
        "--nodes", type=int, metavar="N", help=f"nodes n1..nN, 1 to {MAX_NODES} (default 2)"
    )
    shape.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="G",
        help="fake GPUs per node (GRES gpu, backed by dummy devices; default 2)",
    )
    shape.add_argument(
        "--accounting",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run MariaDB and slurmdbd too, so sacct works (default off)",
    )
    shape.add_argument(
        "--slurmd-timeout",
        type=int,
        metavar="S",
        help="seconds before a silent node is marked DOWN (default 300, Slurm's)",
    )
    shape.add_argument(
        "--cred-expire",
        type=int,
        metavar="S",
        help="munge credential lifetime; a requeued job is held S + 1 s (default 10; Slurm's "
        "own default is 120)",
    )
    shape.add_argument(
        "--slot",
        type=int,
        help=f"0 to {SLOTS - 1}: picks the cluster's ports and job ids (default: 0 for the "
        "default state dir, else derived from the state dir)",
    )


def run(args: argparse.Namespace) -> int:
    """Bring the cluster up or down, or show it."""
    state_dir = devcluster.state_dir_from(os.environ, args.state_dir)
    if args.action == "up":
        spec = devcluster.resolve_spec(
            state_dir,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            accounting=args.accounting,
            slurmd_timeout_s=args.slurmd_timeout,
            slot=args.slot,
            cred_expire_s=args.cred_expire,
        )
        result = devcluster.up(state_dir, os.environ, spec)
        if args.json:
            _print_json(
                {"conf": str(result.conf), "started": list(result.started),
                 "installed": list(result.installed), "elapsed_s": round(result.seconds, 2)}
            )  # fmt: skip
            return 0
        started = ", ".join(result.started) or "nothing (already running)"
        installed = f"; installed: {', '.join(result.installed)}" if result.installed else ""
        print(f"dev cluster up in {result.seconds:.1f} s; started: {started}{installed}")
        print(f"export SLURM_CONF={result.conf}")
    elif args.action == "down":
        stopped = devcluster.down(state_dir, purge=args.purge)
        if args.json:
            _print_json({"stopped": stopped, "purged": args.purge})
            return 0
        print(f"dev cluster down; stopped: {', '.join(stopped) or 'nothing (not running)'}")
    else:
        return _status(state_dir, as_json=args.json)
    return 0


def _status(state_dir: Path, *, as_json: bool) -> int:
    """Each daemon (running, with its pid, or stopped) and the nodes; exit 3 unless all run."""
    pids, sinfo = devcluster.status(state_dir)
    code = 0 if all(pids.values()) else 3
    if as_json:
        layout = devcluster.layout_for(state_dir)
        _print_json(
            {
                "state_dir": str(state_dir),
                "conf": str(layout.conf),
                "running": code == 0,
                "spec": asdict(layout.spec),
                "daemons": pids,
                "nodes": devcluster.node_states(layout) if pids["slurmctld"] else {},
            }
        )
        return code
    for name, pid in pids.items():
        print(f"{name:12} {'running, pid ' + str(pid) if pid else 'stopped'}")
    print(sinfo)
    return code


def _print_json(value: dict[str, Any]) -> None:
    from hpc_ddp.output import DEV_CLUSTER, document

    print(json.dumps(document(DEV_CLUSTER, value), indent=2))
