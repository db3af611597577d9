"""The lemon record's entries and what they mean: which faults count against a node, which
nodes are lemons, and which of them a submission leaves out. Pure: the clock, the environment
and the partition's nodes are arguments; :mod:`hpc_ddp.lemons.store` reads and writes the files.

An entry is one fault blamed on one node: the node, the run (its run id and directory), the
Slurm job, the cause, the evidence and the time. The record keeps every entry it is given; only
:func:`judge` decides what they add up to, so that a longer or shorter window (or a rule changed
later) weighs the same history again:

* a **lost** node (``node_fail``) or a **hardware** error (the evidence speaks against the node
  itself: an ECC error, an Xid) makes its node a lemon alone;
* any other **fault** that singled the node out (a hang, a death by signal on some of the
  launch's nodes) makes it a lemon once it happened in 2 or more distinct runs within the
  window: one run's fault may be its program's, the same node failing two programs is not;
* a Python exception or an exit with an error code is the program's and is never recorded
  (:func:`entry_kind`), and so is a fault that blamed every node of its launch alike.

Entries older than the window (default 7 days) count for nothing: a node that was repaired
comes back by itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc_ddp.frozen import dataclass
from hpc_ddp.lemons import STATE_DIR_ENV, record_dir

__all__ = [
    "DEFAULT_WINDOW_S",
    "KINDS",
    "RETENTION_S",
    "STATE_DIR_ENV",
    "Exclusion",
    "Lemon",
    "LemonEntry",
    "entry_from_dict",
    "entry_kind",
    "entry_name",
    "fault_entries",
    "judge",
    "launch_exclusion",
    "record_dir",
    "submit_exclusion",
]

DEFAULT_WINDOW_S = 7 * 86400.0
"""How long a fault counts against its node (``fault.lemon_window_days``' default)."""

RETENTION_S = 90 * 86400.0
"""Entries older than this are removed when a new one is written: longer than any window that
makes sense, so that no run's window is cut short by another's pruning."""

LOST, HARDWARE, FAULT = "lost", "hardware", "fault"
KINDS = (LOST, HARDWARE, FAULT)
"""An entry's ``kind``: the node was lost, a hardware error on it, another fault singling it
out. The first two count alone; ``fault`` counts from 2 distinct runs."""

_ALONE = frozenset({LOST, HARDWARE})
RUNS_TO_COUNT = 2
"""Distinct runs a ``fault`` entry must be seen in, on one node, within the window."""

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class LemonEntry:
    """One fault blamed on one node (one file of the record)."""

    node: str
    kind: str
    """:data:`KINDS`."""
    cause: str
    """The attempt's end cause (``node_fail``, ``hang``, ``crash``)."""
    evidence: str
    """What the supervisor saw (``srun: Node failure on n2``)."""
    run: str
    """The run's id (``run_id``), or its directory when it has none: what "distinct runs" counts."""
    run_dir: str
    job: str | None
    time: float
    """When the fault was found (seconds since the epoch)."""

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain JSON values (the file's content)."""
        return {
            "node": self.node,
            "kind": self.kind,
            "cause": self.cause,
            "evidence": self.evidence,
            "run": self.run,
            "run_dir": self.run_dir,
            "job": self.job,
            "time": self.time,
        }

    def describe(self) -> str:
        """``lost in run mnist-...(job 12) at 2026-11-28 22:01 UTC: srun: Node failure``."""
        what = {LOST: "lost", HARDWARE: "hardware error"}.get(self.kind, self.cause)
        job = f" (job {self.job})" if self.job else ""
        return f"{what} in run {Path(self.run_dir).name or self.run}{job} at {_when(self.time)}"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def entry_from_dict(data: object) -> LemonEntry:
    """An entry read back from its file; ValueError naming what is wrong with a damaged or
    hand-edited one."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    node, kind, t = data.get("node"), data.get("kind"), data.get("time")
    if not isinstance(node, str) or not node.strip():
        raise ValueError("no node name")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"time {t!r} is not a number of seconds")
    job = data.get("job")
    run_dir = str(data.get("run_dir") or "")
    return LemonEntry(
        node=node.strip(),
        kind=str(kind),
        cause=str(data.get("cause") or kind),
        evidence=str(data.get("evidence") or ""),
        run=str(data.get("run") or run_dir or "?"),
        run_dir=run_dir,
        job=None if job is None else str(job),
        time=float(t),
    )


def entry_name(entry: LemonEntry, unique: str) -> str:
    """The entry's file name: its time and node (readable in ``ls``), then ``unique`` (a pid
    and random part), so that no two writers, on any host, ever pick the same name."""
    return f"{int(entry.time)}-{_SAFE.sub('_', entry.node)[:64]}-{unique}.json"


def entry_kind(cause: str, *, node_level: bool, own_error: bool, singled_out: bool) -> str | None:
    """The kind of entry a launch's fault gives its blamed nodes, or None: it is not recorded.

    ``cause`` is the end cause's value; ``node_level``: the evidence speaks against the node
    (a hardware error); ``own_error``: the program raised or exited with an error code (its
    own fault, wherever it runs); ``singled_out``: the blame names some of the launch's nodes,
    not all of them (a hang of every rank points at no node).
    """
    if cause == "node_fail":
        return LOST
    if node_level:
        return HARDWARE
    if own_error or not singled_out:
        return None
    return FAULT


def fault_entries(
    cause: str,
    blamed: Sequence[str],
    *,
    node_level: bool,
    own_error: bool,
    launch_nodes: int,
    evidence: str,
    run: str,
    run_dir: str,
    job: str | None,
    time: float,
) -> list[LemonEntry]:
    """The entries a launch's fault adds to the record: one for each node it blames (``?``, an
    unknown node, is none), of the kind :func:`entry_kind` gives it (none when it gives none).
    ``launch_nodes``: the nodes the launch ran on (a fault blaming every one singles none out)."""
    nodes = [n for n in dict.fromkeys(blamed) if n and n != "?"]
    kind = entry_kind(
        cause, node_level=node_level, own_error=own_error, singled_out=len(nodes) < launch_nodes
    )
    if kind is None:
        return []
    return [LemonEntry(n, kind, cause, evidence, run, run_dir, job, time) for n in nodes]


@dataclass(frozen=True)
class Lemon:
    """A node the record says to avoid, and why."""

    node: str
    reason: str
    """``lost in run ... (job 12) at ...`` or ``faults in 2 runs within 7 days: ...``."""
    entries: tuple[LemonEntry, ...]
    """The entries within the window that made it one, oldest first."""

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain JSON values."""
        return {
            "node": self.node,
            "reason": self.reason,
            "entries": [e.to_dict() for e in self.entries],
        }


def _days(window_s: float) -> str:
    return f"{window_s / 86400:g} day(s)"


def judge(entries: Iterable[LemonEntry], *, now: float, window_s: float) -> tuple[Lemon, ...]:
    """The lemons among the nodes of ``entries``, by node name: the rules of the module
    docstring, over the entries newer than ``now - window_s``."""
    by_node: dict[str, list[LemonEntry]] = {}
    for e in entries:
        if e.time >= now - window_s:
            by_node.setdefault(e.node, []).append(e)
    found = []
    for node in sorted(by_node):
        mine = sorted(by_node[node], key=lambda e: e.time)
        alone = [e for e in mine if e.kind in _ALONE]
        if alone:
            found.append(Lemon(node, alone[-1].describe(), tuple(mine)))
            continue
        runs: dict[str, LemonEntry] = {}
        for e in mine:
            runs[e.run] = e  # the newest entry of each run
        if len(runs) >= RUNS_TO_COUNT:
            said = "; ".join(e.describe() for e in runs.values())
            reason = f"faults in {len(runs)} runs within {_days(window_s)}: {said}"
            found.append(Lemon(node, reason, tuple(mine)))
    return tuple(found)


def launch_exclusion(
    entries: Iterable[LemonEntry],
    *,
    alloc: Sequence[str],
    bad: Collection[str],
    needed: int,
    now: float,
    window_s: float,
) -> tuple[dict[str, str], list[str]]:
    """The lemons a supervisor leaves out of its launches (node -> why), and what it says.

    The lemons of ``entries`` (:func:`judge`) in the allocation ``alloc`` and not in ``bad``
    (already left out): Slurm may have given them to the job (they became lemons while it
    waited, or the partition was too small to exclude them at submit). They are left out while
    the allocation keeps ``needed`` other nodes for a launch; else none is, and it says so."""
    lemons = {
        x.node: f"lemon node: {x.reason}"
        for x in judge(entries, now=now, window_s=window_s)
        if x.node in alloc and x.node not in bad
    }
    if not lemons:
        return {}, []
    healthy = [n for n in alloc if n not in bad and n not in lemons]
    if len(healthy) < needed:
        return {}, [
            f"lemon node(s) {', '.join(sorted(lemons))} are in this allocation, which has "
            f"{len(healthy)} other(s) of the {needed} a launch needs: using them"
        ]
    return lemons, [f"leaving out {node} ({why})" for node, why in lemons.items()]


@dataclass(frozen=True)
class Exclusion:
    """What a submission does with the lemons: the nodes it asks Slurm to leave out
    (``--exclude``), and in words what it leaves to the supervisor and why."""

    nodes: tuple[str, ...]
    lemons: tuple[Lemon, ...]
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What ``submit`` says (one line each): every lemon, excluded or not, and the notes."""
        out = []
        for lemon in self.lemons:
            done = "excluding" if lemon.node in self.nodes else "not excluding"
            out.append(f"lemon node {lemon.node}: {done} ({lemon.reason})")
        out.extend(self.notes)
        if self.lemons:
            out.append(
                "HINT: `hpc-ddp nodes` lists the record; `hpc-ddp nodes --forget NODE` clears a "
                "node that was repaired"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON values (``submit --dry-run --json``'s ``lemons``)."""
        return {
            "excluded": list(self.nodes),
            "lemons": [{"node": x.node, "reason": x.reason} for x in self.lemons],
            "notes": list(self.notes),
        }


def submit_exclusion(
    lemons: Sequence[Lemon],
    *,
    partition: str,
    partition_nodes: Sequence[str] | None,
    needed: int,
    unknown_why: str = "",
) -> Exclusion:
    """The lemons a submission asks Slurm to leave out: those in the partition, while the
    partition keeps ``needed`` nodes (the job's smallest ``--nodes``) besides them; else none
    (Slurm would never start the job), and the supervisor leaves them out of its launches where
    the allocation has spares. ``partition_nodes`` None: the partition could not be asked
    (``unknown_why``), and nothing is excluded at submit. A lemon outside the partition (another
    partition's, or another cluster's sharing this home) is not named to Slurm, which refuses a
    node it does not know."""
    if not lemons:
        return Exclusion((), ())
    if partition_nodes is None:
        why = f": {unknown_why}" if unknown_why else ""
        note = (
            f"the nodes of partition {partition} are not known{why}; nothing is excluded at "
            "submit (the supervisor still leaves lemons out where the allocation has spares)"
        )
        return Exclusion((), tuple(lemons), (note,))
    known = set(partition_nodes)
    inside = [x.node for x in lemons if x.node in known]
    notes = []
    outside = [x.node for x in lemons if x.node not in known]
    if outside:
        notes.append(f"not in partition {partition}: {', '.join(outside)} (nothing to exclude)")
    kept = len(known) - len(inside)
    if inside and kept < needed:
        notes.append(
            f"partition {partition} would keep {kept} node(s) without {', '.join(inside)}, "
            f"for a job of {needed}: nothing excluded at submit (the supervisor still leaves "
            "them out where the allocation has spares)"
        )
        return Exclusion((), tuple(lemons), tuple(notes))
    return Exclusion(tuple(inside), tuple(lemons), tuple(notes))
