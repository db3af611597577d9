"""The lemon record as the API and ``hpc-ddp nodes`` show it: every node it names, whether it
is a lemon now and why (:mod:`hpc_ddp.lemons`), and ``forget`` for a node that was repaired.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc_ddp.errors import ConfigError
from hpc_ddp.frozen import dataclass
from hpc_ddp.lemons.record import DEFAULT_WINDOW_S, LemonEntry, judge
from hpc_ddp.lemons.store import forget_node, read_record, where

__all__ = ["NodeRow", "NodesReport", "forget", "nodes"]


@dataclass(frozen=True)
class NodeRow:
    """One node of the record."""

    node: str
    lemon: bool
    """Left out of submissions and launches now."""
    reason: str | None
    """Why it is a lemon (None: it is not, yet)."""
    faults: int
    """Entries within the window."""
    runs: int
    """Distinct runs among them."""
    last: LemonEntry
    """Its newest entry (within the window or not)."""

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON values (``hpc-ddp nodes --json``)."""
        from datetime import datetime, timezone

        when = datetime.fromtimestamp(self.last.time, timezone.utc).isoformat(timespec="seconds")
        return {
            "node": self.node,
            "lemon": self.lemon,
            "reason": self.reason,
            "faults": self.faults,
            "runs": self.runs,
            "last_time": when,
            "last_kind": self.last.kind,
            "last_cause": self.last.cause,
            "last_run_dir": self.last.run_dir or None,
            "last_job_id": self.last.job,
            "last_evidence": self.last.evidence or None,
        }


@dataclass(frozen=True)
class NodesReport:
    """The record: where it is, the window it was judged over, its nodes and its damage."""

    directory: Path
    window_s: float
    rows: tuple[NodeRow, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON values (schema ``hpc-ddp.nodes/1``)."""
        from hpc_ddp.output import NODES, document

        return document(
            NODES,
            {
                "record_dir": str(self.directory),
                "window_s": self.window_s,
                "nodes": [r.to_dict() for r in self.rows],
                "warnings": list(self.warnings),
            },
        )


def _window(window_days: float | None) -> float:
    if window_days is None:
        return DEFAULT_WINDOW_S
    if not 0 < window_days <= 365:
        raise ConfigError(
            f"--window-days {window_days:g} is out of range. HINT: use 0.01 to 365 days (the "
            "job's fault.lemon_window_days; 7 by default)"
        )
    return window_days * 86400


def nodes(
    *,
    window_days: float | None = None,
    env: Mapping[str, str] | None = None,
    now: float | None = None,
) -> NodesReport:
    """Every node of the lemon record of ``env``'s user (this process's environment by
    default), judged at ``now`` over ``window_days`` (7: ``fault.lemon_window_days``'
    default), lemons first. A damaged entry is a warning of the report, never an error."""
    window_s = _window(window_days)
    now = time.time() if now is None else now
    directory = where(os.environ if env is None else env)
    record = read_record(directory)
    lemons = {x.node: x for x in judge(record.values, now=now, window_s=window_s)}
    by_node: dict[str, list[LemonEntry]] = {}
    for e in record.values:
        by_node.setdefault(e.node, []).append(e)
    rows = []
    for node, mine in by_node.items():
        recent = [e for e in mine if e.time >= now - window_s]
        lemon = lemons.get(node)
        rows.append(
            NodeRow(
                node=node,
                lemon=lemon is not None,
                reason=lemon.reason if lemon is not None else None,
                faults=len(recent),
                runs=len({e.run for e in recent}),
                last=max(mine, key=lambda e: e.time),
            )
        )
    rows.sort(key=lambda r: (not r.lemon, -r.last.time, r.node))
    return NodesReport(directory, window_s, tuple(rows), record.warnings)


def forget(node: str, *, env: Mapping[str, str] | None = None) -> int:
    """Remove ``node`` from the lemon record (it was repaired); how many entries named it."""
    if not node or any(c.isspace() or c in "/," for c in node):
        raise ConfigError(
            f"--forget {node!r} is not a node name. HINT: name one node as `hpc-ddp nodes` lists it"
        )
    return forget_node(where(os.environ if env is None else env), node)
