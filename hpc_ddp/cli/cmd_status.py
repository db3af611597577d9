"""``hpc-ddp status [RUN_DIR | JOB_ID ...]``: one row per run, one summary line per sweep.

Slurm is asked once for every run shown, by job id (``squeue -j IDS -t all``), and ``sacct``
once for the jobs the controller no longer holds; :func:`hpc_ddp.state.verdict.judge` weighs that
against each run's ledger (a job Slurm calls COMPLETED is only shown so when its ledger says
finished). A run whose manifest or files cannot be read is one DAMAGED row, never the end of
the table, and plain runs are listed before the sweeps. What is shown is
:func:`hpc_ddp.api.status.collect_status`'s, the Python API's ``hpc_ddp.runs()``; this verb
prints it. Never imports torch: checkpoints are judged by their zip structure alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from hpc_ddp.api.status import (
    RunStatus,
    SweepStatus,
    add_goodput,
    collect_status,
    goodput_lines,
    status_json,
)
from hpc_ddp.api.targets import runs_dir_of
from hpc_ddp.rundir.layout import RUNS_DIR_ENV

COLUMNS = ["run", "job", "state", "nodes", "elapsed", "attempts", "causes", "ckpt step", "loss"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("targets", nargs="*", help="run directories or job ids (default: all runs)")
    parser.add_argument(
        "--runs-dir", help=f"where to look for runs (default ${RUNS_DIR_ENV} or ./runs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (docs/json.md)")
    parser.add_argument("--attempts", action="store_true", help="also list every attempt")
    parser.add_argument(
        "--goodput",
        action="store_true",
        help="also account for each run's wall time: productive training, start-up, "
        "checkpoint stalls, steps redone, hangs, requeue waits, ETTR",
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        const=WATCH_EVERY_S,
        type=float,
        metavar="SECONDS",
        help=f"show it again every SECONDS (default {WATCH_EVERY_S:g}), in place on a "
        "terminal, until Ctrl-C",
    )


WATCH_EVERY_S = 2.0
CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, clear the screen: ``--watch`` redraws in place on a terminal."""


def run(args: argparse.Namespace) -> int:
    """Print the status table (or JSON): plain runs first, then one line per sweep, then one
    row per sweep task asked for by its directory (``SWEEP_DIR/tasks/N``); with ``--watch``,
    again and again."""
    if args.watch is None:
        return _show(args)
    if args.json or args.watch <= 0:
        why = "--json" if args.json else f"--watch {args.watch:g}"
        hint = "--watch takes seconds > 0 and shows the table; to script, loop over --json"
        print(f"hpc-ddp status: {why} cannot be watched. HINT: {hint}.", file=sys.stderr)
        return 2
    return _watch(args, args.watch)


def _watch(args: argparse.Namespace, every: float) -> int:
    """Redraw the table every ``every`` seconds until Ctrl-C: in place on a terminal, one
    table after another otherwise (a log file keeps them all)."""
    tty = sys.stdout.isatty()
    try:
        while True:
            shown = io.StringIO()
            with contextlib.redirect_stdout(shown):
                _show(args)
            stamp = time.strftime("%H:%M:%S")
            head = f"{stamp}  hpc-ddp status, every {every:g} s (Ctrl-C to stop)\n\n"
            text = head + shown.getvalue()
            sys.stdout.write(CLEAR + text if tty else text + "\n")
            sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return 0


def _show(args: argparse.Namespace) -> int:
    runs_dir = runs_dir_of(args.runs_dir)
    found = collect_status(args.targets, runs_dir, args.backends)
    statuses = [s for s in found if isinstance(s, RunStatus)]
    sweeps = [s for s in found if isinstance(s, SweepStatus)]
    shown = status_json(found)
    if args.goodput:
        add_goodput(shown)
    # A damaged run is shown beside the others but the exit status says something is wrong.
    code = 1 if any(s.damaged for s in statuses) else 0
    if args.json:
        print(json.dumps(shown, indent=2, default=_plain))
        return code
    if not statuses and not sweeps:
        print(f"no runs under {runs_dir}", file=sys.stderr)
        return 0
    _print_runs(statuses, attempts=args.attempts)
    _print_sweeps(shown["sweeps"], attempts=args.attempts)
    if args.goodput:
        for line in goodput_lines(shown):
            print(line)
    return code


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not know: a goodput account as its fields."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _cells(s: RunStatus) -> list[Any]:
    """A run's row of the table: ``-`` where JSON says null."""
    return [s.run, s.job or "-", s.state, s.nodes or "-", s.elapsed,
            "-" if s.attempts is None else s.attempts, ",".join(s.causes) or "-",
            s.ckpt_step, s.loss]  # fmt: skip


def _print_runs(statuses: list[RunStatus], *, attempts: bool) -> None:
    if statuses:
        print(tabulate([_cells(s) for s in statuses], headers=COLUMNS))
    for s in statuses:
        for line in s.reasons:
            print(line)
    if attempts:
        for s in statuses:
            print(f"\n{s.run}")
            print(tabulate([_attempt_cells(a) for a in s.attempt_list], headers=ATTEMPT_COLUMNS))


ATTEMPT_COLUMNS = ["attempt", "job", "restart", "launch", "nodes", "ranks", "cause", "steps",
                   "checkpoint", "then", "why"]  # fmt: skip
"""``status --attempts``: one row per launch. ``restart`` counts Slurm's requeues of a job,
``launch`` the supervisor's restarts inside one allocation; the long text comes last."""


def _attempt_cells(a: Mapping[str, Any]) -> list[Any]:
    """One ``attempt_list`` entry as a table row: ``ranks`` shows an elastic resume as
    ``2->1``, ``then`` what the supervisor did after a fault (nothing after a finished run),
    ``why`` the blame, or the resize in words."""
    resize, world = a.get("resize"), a.get("world")
    ranks = "-" if world is None else str(world)
    if a.get("resized_from") is not None:
        ranks = f"{a['resized_from']}->{ranks}"
    then = a.get("next") if a.get("cause") not in (None, "finished") else None
    why = a.get("blame") or (f"resized: {resize}" if resize else None)
    cause = a["cause"] or "running"
    return [a["attempt"], a["job"], a["restart"], a["launch"], a["nodelist"] or "-", ranks,
            cause, a["steps_done"], a["checkpoint"], then or "", why or ""]  # fmt: skip


def _print_sweeps(entries: list[dict[str, Any]], *, attempts: bool) -> None:
    for entry in entries:
        tasks = [_flat(t) for t in entry["tasks"]]
        if entry["task"] is not None:  # one task asked for by its directory: its row
            [task] = tasks or [{"index": entry["task"], "state": "unknown"}]
            print(f"{entry['sweep_dir']}: task {task['index']}: {task['state']}")
            print(tabulate(tasks, headers="keys"))
            continue
        counts = ", ".join(f"{n} {state}" for state, n in entry["summary"].items() if n)
        print(f"{entry['sweep_dir']}: {len(entry['tasks'])} tasks: {counts}")
        if attempts:
            print(tabulate(tasks, headers="keys"))


def _flat(task: dict[str, Any]) -> dict[str, Any]:
    """A task's row for a table: its swept values as columns of their own."""
    row = {k: v for k, v in task.items() if k not in ("values", "goodput")}
    index = list(row).index("state") + 1
    items = list(row.items())
    return dict([*items[:index], *task.get("values", {}).items(), *items[index:]])
