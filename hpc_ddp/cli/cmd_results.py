"""``hpc-ddp results SWEEP_DIR``: every task of a sweep in one sorted table (or CSV, JSON,
Markdown), and optionally a plot. Works while the sweep runs; unfinished tasks are shown as such.

Exit codes: 0 shown; 2 usage error (no such sweep directory, ``--sort`` naming no metric that
was logged, a ``--plot`` file matplotlib cannot write there, or no matplotlib); 1 unreadable
sweep.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.cli.runs import require_dir
from hpc_ddp.errors import ConfigError, SlurmError
from hpc_ddp.slurm.arrayjobs import read_arrays
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.jobstate import AccountingRecord, JobInfo
from hpc_ddp.sweep.records import SweepRecord, read_sweep_record
from hpc_ddp.sweep.results import (
    ResultRow,
    gather_results,
    logged_metrics,
    loss_curve,
    read_metrics,
    row_dict,
    sort_rows,
    sweep_summary,
    unheld_arrays,
)

FORMATS = ("table", "csv", "json", "markdown")
_COLUMNS = ("best", "final", "loss", "steps", "attempts", "index")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("sweep_dir", help="the sweep directory printed by `hpc-ddp sweep`")
    parser.add_argument(
        "--sort",
        metavar="KEY",
        help="a metric in metrics.jsonl (ranked by its best value), a swept key, or one of "
        f"{', '.join(_COLUMNS)} (default: the sweep's metric)",
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
    sweep_dir = require_dir(args.sweep_dir, "sweep directory")
    record = read_sweep_record(sweep_dir)
    plot_out = None
    if args.plot:
        from hpc_ddp.sweep.plot import plot_target

        plot_out = plot_target(args.plot)  # before anything is computed
    live = None if args.no_slurm else _live(sweep_dir, args.slurm)
    accounting = None if live is None else _accounting(sweep_dir, live, args.slurm)
    sort_key, metric, mode = choose_sort(record, args.sort, args.mode)
    rows = sort_rows(gather_results(sweep_dir, live, metric, accounting), sort_key, mode)
    if metric != record.metric and all(r.best is None for r in rows):
        raise unlogged_metric(record, metric, logged_metrics(rows))
    shown = rows[: args.top] if args.top is not None else rows
    print(format_rows(shown, record.keys, metric, args.format), end="")
    if args.format == "table":
        counts = ", ".join(f"{n} {state}" for state, n in sweep_summary(rows).items() if n)
        print(f"\n{len(rows)} tasks: {counts}; ranked by {sort_key} ({mode})")
    if len(shown) < len(rows):
        print(f"showing {len(shown)} of {len(rows)} tasks (--top {args.top})", file=sys.stderr)
    if live is None and not args.no_slurm:
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


def unlogged_metric(record: SweepRecord, metric: str, logged: list[str]) -> ConfigError:
    """``--sort METRIC`` where no task logged METRIC: name what was logged, and the nearest."""
    close = difflib.get_close_matches(metric, [*logged, *record.keys, *_COLUMNS], n=1)
    maybe = f"did you mean {close[0]!r}? " if close else ""
    keys = ", ".join([*record.keys, *_COLUMNS])
    return ConfigError(
        f"--sort {metric}: no task logged a metric {metric!r} (metrics logged: "
        f"{', '.join(logged) or 'none yet'}), and it is no swept key or column. HINT: {maybe}"
        f"sort by a logged metric or one of: {keys}"
    )


def _live(sweep_dir: Path, client: SlurmClient) -> dict[str, JobInfo] | None:
    job_ids = list(dict.fromkeys(a.job_id for a in read_arrays(sweep_dir)))
    try:
        return client.job_states(job_ids) if job_ids else {}
    except SlurmError:
        return None


def _accounting(
    sweep_dir: Path, live: dict[str, JobInfo], client: SlurmClient
) -> dict[str, AccountingRecord] | None:
    """sacct's records of the tasks squeue no longer holds; None without accounting."""
    unheld = unheld_arrays(sweep_dir, live)
    try:
        return client.sacct_states(unheld) if unheld else None
    except SlurmError:
        return None


def choose_sort(record: SweepRecord, key: str | None, mode: str | None) -> tuple[str, str, str]:
    """(row key to sort by, metric to gather, mode) for ``--sort KEY`` and ``--mode``."""
    if key is None or key == record.metric:
        return "best", record.metric, mode or record.mode
    if key in record.keys or key in _COLUMNS:
        metric_mode = record.mode if key in ("best", "final") else "min"
        return key, record.metric, mode or metric_mode
    return "best", key, mode or "min"


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
    """The rows in one of :data:`FORMATS` (text ending in a newline)."""
    if fmt == "json":
        return json.dumps([row_dict(r) for r in rows], indent=1) + "\n"
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
