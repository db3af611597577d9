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
import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from hpc_ddp.api.sweep import RESULT_COLUMNS, Sweep, gather, results_json
from hpc_ddp.errors import ConfigError
from hpc_ddp.sweep.results import (
    ResultRow,
    loss_curve,
    read_metrics,
    sweep_summary,
)

FORMATS = ("table", "csv", "json", "markdown")


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
    sweep = Sweep.from_dir(args.sweep_dir, slurm=args.slurm)
    plot_out = None
    if args.plot:
        from hpc_ddp.sweep.plot import plot_target

        plot_out = plot_target(args.plot)  # before anything is computed
    found = gather(sweep.sweep_dir, args.slurm, sort=args.sort, mode=args.mode,
                   ask_slurm=not args.no_slurm)  # fmt: skip
    record, rows, sort_key, metric, mode = (
        found.record, found.rows, found.sort_key, found.metric, found.mode
    )  # fmt: skip
    shown = rows[: args.top] if args.top is not None else rows
    if args.format == "json":
        print(json.dumps(results_json(found, shown), indent=1))
    else:
        print(format_rows(shown, record.keys, metric, args.format), end="")
    if args.format == "table":
        counts = ", ".join(f"{n} {state}" for state, n in sweep_summary(rows).items() if n)
        print(f"\n{len(rows)} tasks: {counts}; ranked by {sort_key} ({mode})")
    if len(shown) < len(rows):
        print(f"showing {len(shown)} of {len(rows)} tasks (--top {args.top})", file=sys.stderr)
    if not found.slurm_answered and not args.no_slurm:
        print("Slurm not reachable: states come from the task ledgers only", file=sys.stderr)
    if plot_out is not None:
        from hpc_ddp.sweep.plot import plot_results

        top = [r for r in rows if r.best is not None][:5]
        curves = {r.index: loss_curve(read_metrics(r.run_dir / "metrics.jsonl")) for r in top}
        out = plot_results(
            rows,
            keys=record.keys,
            metric=metric,
            curves=curves,
            out=plot_out,
            title=f"{record.name}: {len(rows)} tasks",
        )
        print(f"plot written to {out}", file=sys.stderr)
    return 0


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def table_rows(rows: Sequence[ResultRow], keys: Sequence[str]) -> list[list[Any]]:
    """Rows as table cells; a failed or cancelled task's state names its last cause."""
    out = []
    for r in rows:
        state = r.state.value
        if r.last_cause and r.state.value in ("failed", "cancelled"):
            state = f"{state} ({r.last_cause})"
        out.append(
            [
                r.index,
                state,
                *(_cell(r.values.get(k)) for k in keys),
                r.best,
                r.final,
                r.loss,
                r.steps,
                r.attempts,
                r.job,
            ]
        )
    return out


def format_rows(rows: Sequence[ResultRow], keys: Sequence[str], metric: str, fmt: str) -> str:
    """The rows as a table, CSV or Markdown (text ending in a newline); JSON is
    :func:`hpc_ddp.api.sweep.results_json`'s."""
    headers = ["#", "state", *keys, f"best {metric}", f"final {metric}", "loss", "steps",
               "attempts", "job"]  # fmt: skip
    cells = table_rows(rows, keys)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows([["" if c is None else c for c in row] for row in cells])
        return buf.getvalue()
    tablefmt = "github" if fmt == "markdown" else "simple"
    text = tabulate(
        cells,
        headers=headers,
        tablefmt=tablefmt,
        floatfmt=".4g",
        missingval="-",
        # Job refs such as 31_1 would read as the number 311 (Python allows _ in numbers).
        disable_numparse=[len(headers) - 1],
    )
    return text + "\n"
