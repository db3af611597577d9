"""``hpc-ddp nodes [--forget NODE] [--json]``: the lemon record (:mod:`hpc_ddp.lemons`), the
nodes blamed for faults across this user's runs, which of them submissions and launches now
leave out and why; ``--forget`` clears a node that was repaired.

Exit codes: 0 shown (or forgotten; a damaged entry is only a warning), 2 a wrong argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from hpc_ddp.api.nodes import NodesReport, forget, nodes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("--forget", metavar="NODE", help="remove NODE from the record")
    parser.add_argument(
        "--window-days",
        type=float,
        metavar="D",
        help="judge faults of the last D days (default 7, as fault.lemon_window_days)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (docs/json.md)")


def run(args: argparse.Namespace) -> int:
    """List the record, or forget one node of it."""
    if args.forget is not None:
        gone = forget(args.forget)
        if args.json:
            from hpc_ddp.output import NODES, document

            print(json.dumps(document(NODES, {"forgot": args.forget, "entries": gone})))
        else:
            print(f"forgot {args.forget}: {gone} entr{'y' if gone == 1 else 'ies'} removed")
        return 0
    report = nodes(window_days=args.window_days)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    print(table(report))
    return 0


def table(report: NodesReport) -> str:
    """The record as a table, lemons first, with where it lives."""
    days = f"{report.window_s / 86400:g}"
    if not report.rows:
        return f"no node in the lemon record ({report.directory})"
    head = ("NODE", "LEMON", f"FAULTS/{days}d", "RUNS", "LAST", "CAUSE", "WHY")
    rows = [head]
    for r in report.rows:
        when = datetime.fromtimestamp(r.last.time, timezone.utc).strftime("%Y-%m-%d %H:%M")
        why = r.reason or (r.last.evidence or "")
        rows.append(
            (r.node, "yes" if r.lemon else "no", str(r.faults), str(r.runs), when,
             r.last.cause, why)
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in rows]  # fmt: skip
    lines.append(f"record: {report.directory}")
    return "\n".join(line.rstrip() for line in lines)
