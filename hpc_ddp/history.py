"""A user's history file read leniently: ``{"version": N, "runs": {run_id: entry}}``. Pure.

The save-time history (:mod:`hpc_ddp.config.leadtime`) and the interruption history
(:mod:`hpc_ddp.fault.interruptions`) both keep one entry per run in a JSON file of the user's
state directory, rewritten whole by each run. A damaged file, or a damaged entry, never fails
a submit or a run: what can be read is kept, and a warning says what was not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

Entry = TypeVar("Entry")


def parse_runs(
    text: str, entry: Callable[[Any], Entry | None], *, version: int, rewritten: str
) -> tuple[dict[str, Entry], str | None]:
    """The entries of ``text`` by run id (each raw entry read by ``entry``, None: damaged),
    and a warning when the text or some entries are damaged; ``rewritten`` says when the
    file is written whole again (``"at the next save"``)."""
    try:
        doc = json.loads(text) if text.strip() else {"version": version, "runs": {}}
    except ValueError as exc:
        return {}, f"not JSON ({exc}); it is rewritten {rewritten}"
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, dict):
        return {}, f"no 'runs' mapping; it is rewritten {rewritten}"
    out: dict[str, Entry] = {}
    bad = 0
    for run_id, raw in runs.items():
        read = entry(raw)
        if read is None:
            bad += 1
        else:
            out[str(run_id)] = read
    return out, (f"{bad} damaged entr{'y' if bad == 1 else 'ies'} skipped" if bad else None)


class Dated(Protocol):
    """An entry that says when its run last wrote it."""

    @property
    def updated(self) -> float: ...


DatedEntry = TypeVar("DatedEntry", bound=Dated)


def render_runs(
    runs: Mapping[str, DatedEntry],
    run_id: str,
    entry: DatedEntry,
    as_dict: Callable[[DatedEntry], dict[str, Any]],
    *,
    version: int,
    keep: int,
) -> str:
    """The history's text with ``run_id``'s entry replaced by ``entry`` (each written by
    ``as_dict``); the oldest runs beyond ``keep`` dropped."""
    merged = {**runs, run_id: entry}
    newest = sorted(merged.items(), key=lambda kv: kv[1].updated, reverse=True)[:keep]
    doc = {"version": version, "runs": {rid: as_dict(e) for rid, e in newest}}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
