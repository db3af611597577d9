"""``hpc-ddp status [RUN_DIR | JOB_ID ...]``: one row per run, one summary line per sweep.

Slurm is asked once for every run shown, by job id (``squeue -j IDS -t all``), and ``sacct``
once for the jobs the controller no longer holds; :func:`hpc_ddp.state.verdict.judge` weighs that
against each run's ledger (a job Slurm calls COMPLETED is only shown so when its ledger says
finished). A run whose manifest or files cannot be read is one DAMAGED row, never the end of
the table, and plain runs are listed before the sweeps. Never imports torch: checkpoints are
judged by their zip structure alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.cli.runs import manifest_jobs, resolve_targets, sweep_task_of
from hpc_ddp.errors import RunDirError
from hpc_ddp.launch.submission import runs_dir_from
from hpc_ddp.layout import MANIFEST_FILE, RUNS_DIR_ENV
from hpc_ddp.manifest import Manifest, read_manifest
from hpc_ddp.state.report import (
    DAMAGED,
    ask_slurm,
    damaged_row,
    reason_lines,
    run_status,
    with_accounting,
)
from hpc_ddp.state.verdict import SlurmView

COLUMNS = ["run", "job", "state", "nodes", "elapsed", "attempts", "causes", "ckpt step", "loss"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("targets", nargs="*", help="run directories or job ids (default: all runs)")
    parser.add_argument(
        "--runs-dir", help=f"where to look for runs (default ${RUNS_DIR_ENV} or ./runs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--attempts", action="store_true", help="also list every attempt")


def _sweep_entry(sweep_dir: Path, view: SlurmView) -> dict[str, Any]:
    from hpc_ddp.sweep.results import gather_results, row_dict, sweep_summary

    # live None: states from the ledgers alone; sacct for the tasks squeue no longer holds.
    rows = gather_results(sweep_dir, view.live, accounting=view.accounting)
    tasks = [row_dict(r) for r in rows]
    return {"sweep": str(sweep_dir), "summary": sweep_summary(rows), "tasks": tasks}


def run(args: argparse.Namespace) -> int:
    """Print the status table (or JSON): plain runs first, then one line per sweep, then one
    row per sweep task asked for by its directory (``SWEEP_DIR/tasks/N``)."""
    runs_dir = runs_dir_from(args.runs_dir, os.environ)
    tasks = {t: found for t in args.targets if (found := _sweep_task(t)) is not None}
    others = [t for t in args.targets if t not in tasks]
    dirs = resolve_targets(others, runs_dir) if others or not tasks else []
    manifests = _read_manifests(dirs)
    good = {d: m for d, m in manifests.items() if isinstance(m, Manifest)}
    sweeps = [d for d in good if (d / "tasks").is_dir()]
    plain = [
        m.job_id for d, m in good.items() if d not in sweeps and m.backend != "local" and m.job_id
    ]
    arrays = [j for d in sweeps for j in good[d].array_jobs]
    arrays += [j for sweep, _ in tasks.values() for j in read_manifest(sweep).array_jobs]
    view = ask_slurm(args.slurm, list(dict.fromkeys([*plain, *arrays])), plain)
    view = with_accounting(args.slurm, view, _unheld(sweeps, tasks, view))
    rows, entries = _collect(dirs, manifests, sweeps, view)
    entries += [_task_entry(sweep, index, view) for sweep, index in tasks.values()]
    # A damaged run is shown beside the others but the exit status says something is wrong.
    code = 1 if any(r["state"] == DAMAGED for r in rows) else 0
    if args.json:
        print(json.dumps([*rows, *entries], indent=2))
        return code
    if not rows and not entries:
        print(f"no runs under {runs_dir}", file=sys.stderr)
        return 0
    _print_runs(rows, attempts=args.attempts)
    _print_sweeps(entries, attempts=args.attempts)
    return code


def _unheld(sweeps: list[Path], tasks: dict[str, tuple[Path, int]], view: SlurmView) -> list[str]:
    """The array jobs of the sweeps shown whose tasks squeue no longer holds (all of them may
    have ended long ago): sacct is asked about those."""
    if view.live is None:
        return []
    from hpc_ddp.sweep.results import unheld_arrays

    dirs = dict.fromkeys([*sweeps, *(sweep for sweep, _ in tasks.values())])
    return list(dict.fromkeys(j for d in dirs for j in unheld_arrays(d, view.live)))


def _sweep_task(target: str) -> tuple[Path, int] | None:
    """(sweep dir, point) for a target that is a sweep task's directory (it has no manifest
    of its own: the sweep's records say which array task runs it)."""
    path = Path(target)
    if not path.is_dir() or (path / MANIFEST_FILE).exists():
        return None
    return sweep_task_of(path)


def _task_entry(sweep_dir: Path, index: int, view: SlurmView) -> dict[str, Any]:
    """One sweep task, as the sweep's own entry shows it, alone."""
    entry = _sweep_entry(sweep_dir, view)
    entry["tasks"] = [t for t in entry["tasks"] if t["index"] == index]
    entry["summary"] = {state: sum(t["state"] == state for t in entry["tasks"])
                        for state in entry["summary"]}  # fmt: skip
    entry["task"] = index
    return entry


def _read_manifests(dirs: list[Path]) -> dict[Path, Manifest | RunDirError]:
    """Each run's manifest, or why it cannot be read (that run becomes a DAMAGED row).

    A Slurm run's job ids must be job ids: ``--me`` or ``1,2`` there is a damaged manifest,
    shown as such rather than left out of the squeue call in silence.
    """
    manifests: dict[Path, Manifest | RunDirError] = {}
    for d in dirs:
        try:
            manifest = read_manifest(d)
            if manifest.backend != "local":
                manifest_jobs(d, manifest)  # raises for an id that is no job id
            manifests[d] = manifest
        except RunDirError as exc:
            manifests[d] = exc
    return manifests


def _collect(
    dirs: list[Path],
    manifests: dict[Path, Manifest | RunDirError],
    sweeps: list[Path],
    view: SlurmView,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per plain or damaged run, one entry per sweep), in the order of ``dirs``."""
    rows = []
    entries = []
    for d in dirs:
        manifest = manifests[d]
        if isinstance(manifest, RunDirError):
            rows.append(damaged_row(d, manifest))
        elif d in sweeps:
            try:
                entries.append(_sweep_entry(d, view))
            except (RunDirError, OSError) as exc:
                rows.append(damaged_row(d, exc))
        else:
            rows.append(run_status(d, view))
    return rows, entries


def _print_runs(rows: list[dict[str, Any]], *, attempts: bool) -> None:
    if rows:
        print(tabulate([[r[c] for c in COLUMNS] for r in rows], headers=COLUMNS))
    for r in rows:
        for line in reason_lines(r):
            print(line)
    if attempts:
        for r in rows:
            print(f"\n{r['run']}")
            print(tabulate(r["attempt_list"], headers="keys"))


def _print_sweeps(entries: list[dict[str, Any]], *, attempts: bool) -> None:
    for entry in entries:
        if "task" in entry:  # one task asked for by its directory: its row
            [task] = entry["tasks"] or [{"index": entry["task"], "state": "unknown"}]
            print(f"{entry['sweep']}: task {task['index']}: {task['state']}")
            print(tabulate(entry["tasks"], headers="keys"))
            continue
        counts = ", ".join(f"{n} {state}" for state, n in entry["summary"].items() if n)
        print(f"{entry['sweep']}: {len(entry['tasks'])} tasks: {counts}")
        if attempts:
            print(tabulate(entry["tasks"], headers="keys"))
