"""``hpc-ddp results SWEEP_DIR``: every task of a sweep in one sorted table (or CSV, JSON,
Markdown), and optionally a plot. Works while the sweep runs; unfinished tasks are shown as such.
The rows are :func:`hpc_ddp.api.sweep.gather`'s (the Python API's ``Sweep.results()``); this
verb formats them.

Exit codes: 0 shown; 2 usage error (no such sweep directory, a run directory that is no
sweep, ``--sort`` naming no metric that
was logged, a ``--plot`` file matplotlib cannot write there, or no matplotlib); 1 unreadable
sweep.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpc_ddp.api.results import FORMATS, check_plot, format_rows, plot, summary_line
from hpc_ddp.api.sweep import RESULT_COLUMNS, Sweep, gather, results_json
from hpc_ddp.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("sweep_dir", help="the sweep directory printed by `hpc-ddp sweep`")
    parser.add_argument(
        "--sort",
        metavar="KEY",
        help="a metric in metrics.jsonl (ranked by its best value), a swept key, or one of "
        f"{', '.join(RESULT_COLUMNS)} (default: the sweep's metric)",
    )
    parser.add_argument(
        "--mode", choices=["min", "max"], help="min: lower is better (default: the sweep's)"
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--format", choices=FORMATS, default="table", help="default: table")
    shape.add_argument(
        "--json", action="store_const", const="json", dest="format", help="same as --format json"
    )
    parser.add_argument("--top", type=int, metavar="K", help="only the first K rows")
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also draw the metric per swept key and the top curves (the suffix names the "
        "format; a directory gets results.png)",
    )
    parser.add_argument(
        "--no-slurm", action="store_true", help="do not ask squeue: states from the ledgers only"
    )


def run(args: argparse.Namespace) -> int:
    """Print the results of a sweep."""
    if args.top is not None and args.top < 1:
        raise ConfigError(
            f"--top {args.top}: must be at least 1 (the number of rows to show). HINT: leave "
            "--top out to show every task"
        )
    sweep = Sweep.from_dir(args.sweep_dir, backends=args.backends)
    plot_out = None
    if args.plot:
        plot_out = check_plot(args.plot)  # before anything is computed
    found = gather(sweep.sweep_dir, args.backends, sort=args.sort, mode=args.mode,
                   ask_backend=not args.no_slurm)  # fmt: skip
    rows = found.rows
    shown = rows[: args.top] if args.top is not None else rows
    if args.format == "json":
        print(json.dumps(results_json(found, shown), indent=1))
    else:
        print(format_rows(shown, found.record.keys, found.metric, args.format), end="")
    if args.format == "table":
        print(f"\n{summary_line(found)}")
    if len(shown) < len(rows):
        print(f"showing {len(shown)} of {len(rows)} tasks (--top {args.top})", file=sys.stderr)
    if not found.slurm_answered and not args.no_slurm:
        print("Slurm not reachable: states come from the task ledgers only", file=sys.stderr)
    if plot_out is not None:
        out = plot(found, plot_out)
        print(f"plot written to {out}", file=sys.stderr)
    return 0
