"""``hpc-ddp status [RUN_DIR | JOB_ID ...]``: one row per run, from squeue and the run dir.

Works without Slurm accounting: squeue first, then ``sacct`` when it answers, then
``scontrol show job`` (kept for MinJobAge), then what the run directory's ledger says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.errors import RunDirError, SlurmError
from hpc_ddp.ledger import Attempt, EndCause, read_ledger
from hpc_ddp.postmortem import failed_rank
from hpc_ddp.rundir import RunPaths, checkpoint_steps, last_metric, read_manifest
from hpc_ddp.slurm_client import SlurmClient

RUNS_DIR_ENV = "HPC_DDP_RUNS_DIR"
COLUMNS = ["run", "job", "state", "nodes", "elapsed", "attempts", "causes", "ckpt step", "loss"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("targets", nargs="*", help="run directories or job ids (default: all runs)")
    parser.add_argument(
        "--runs-dir", help=f"where to look for runs (default ${RUNS_DIR_ENV} or ./runs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--attempts", action="store_true", help="also list every attempt")


def resolve_targets(targets: Sequence[str], runs_dir: Path) -> list[Path]:
    """Run directories for the given run dirs or job ids (all runs when none given)."""
    if not targets:
        if not runs_dir.is_dir():
            return []
        return sorted(p for p in runs_dir.iterdir() if (p / "manifest.json").exists())
    found: list[Path] = []
    for t in targets:
        path = Path(t)
        if path.is_dir():
            found.append(path)
            continue
        match = [
            p
            for p in (runs_dir.iterdir() if runs_dir.is_dir() else [])
            if (p / "manifest.json").exists() and read_manifest(p).job_id == t
        ]
        if not match:
            raise RunDirError(
                f"{t!r} is neither a run directory nor a job id found under {runs_dir}. "
                "HINT: pass the run directory printed by `hpc-ddp submit`, or --runs-dir."
            )
        found.extend(match)
    return found


def _state_from_ledger(attempts: list[Attempt]) -> str:
    if not attempts:
        return "UNKNOWN"
    last = attempts[-1]
    if last.cause is None:
        return "RUNNING?" if last.ended is None else "UNKNOWN"
    return {"finished": "COMPLETED", "crash": "FAILED", "cancelled": "CANCELLED"}.get(
        last.cause.value, last.cause.value.upper()
    )


def _fmt_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


_FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY"})


def _failed_rank(paths: RunPaths, state: str, attempts: list[Attempt]) -> str | None:
    """srun's account of the rank that failed first, for a run whose last attempt crashed.

    A rank killed outright leaves no word of its own; the ledger then holds a peer's
    "connection reset", which names the wrong rank. srun's log names the right one.
    """
    crashed = bool(attempts) and attempts[-1].cause in (None, EndCause.CRASH)
    if state not in _FAILED_STATES or not crashed:
        return None
    failure = failed_rank(paths.logs)
    return None if failure is None else failure.describe()


def run_status(run_dir: Path, client: SlurmClient, live: dict[str, Any]) -> dict[str, Any]:
    """One status row (a plain dict) for ``run_dir``; ``live`` is squeue's view by job id."""
    manifest = read_manifest(run_dir)
    paths = RunPaths(run_dir)
    attempts = read_ledger(paths.ledger)
    info = live.get(manifest.job_id or "")
    if info is not None:
        state, nodes, elapsed = info.state.value, info.nodes, info.elapsed_s
    else:
        state, nodes, elapsed = _state_from_ledger(attempts), "-", None
        if manifest.backend == "slurm" and manifest.job_id:
            try:
                fields = client.show_job(manifest.job_id)
                state = fields.get("JobState", state)
                nodes = fields.get("NodeList", nodes)
            except SlurmError:
                pass  # purged from the controller: the ledger is what is left
        if elapsed is None and attempts:
            ends = [a.ended for a in attempts if a.ended is not None]
            elapsed = (max(ends) if ends else time.time()) - attempts[0].started
    steps = checkpoint_steps(paths)
    return {
        "run": str(run_dir),
        "job": manifest.job_id,
        "backend": manifest.backend,
        "state": state,
        "nodes": nodes,
        "elapsed": _fmt_elapsed(elapsed),
        "attempts": len(attempts),
        "causes": ",".join(a.cause.value if a.cause else "running" for a in attempts) or "-",
        "ckpt step": steps[-1] if steps else None,
        "loss": last_metric(paths, "loss"),
        "failed_rank": _failed_rank(paths, state, attempts),
        "attempt_list": [
            {
                "attempt": a.attempt,
                "cause": a.cause.value if a.cause else None,
                "steps_done": a.steps_done,
                "checkpoint": a.checkpoint,
                "nodelist": a.nodelist,
            }
            for a in attempts
        ],
    }


def run(args: argparse.Namespace) -> int:
    """Print the status table (or JSON)."""
    runs_dir = Path(args.runs_dir or os.environ.get(RUNS_DIR_ENV) or "runs")
    dirs = resolve_targets(args.targets, runs_dir)
    client = SlurmClient()
    job_ids = [j for d in dirs if (j := read_manifest(d).job_id)]
    try:
        live: dict[str, Any] = client.job_states(job_ids) if job_ids else {}
    except SlurmError:
        live = {}
    sweeps = [d for d in dirs if (d / "tasks").is_dir()]
    if sweeps:
        return _show_sweeps(sweeps, client, args)
    rows = [run_status(d, client, live) for d in dirs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no runs under {runs_dir}", file=sys.stderr)
        return 0
    print(tabulate([[r[c] for c in COLUMNS] for r in rows], headers=COLUMNS))
    for r in rows:
        if r["failed_rank"]:
            print(f"{r['run']}: failed first: {r['failed_rank']} (srun, in logs/batch-*.err)")
    if args.attempts:
        for r in rows:
            print(f"\n{r['run']}")
            print(tabulate(r["attempt_list"], headers="keys"))
    return 0


def wait_for_jobs(client: SlurmClient, job_ids: Sequence[str], poll_s: float = 1.0) -> int:
    """Wait until every job has left the queue; 0 when all completed."""
    # squeue keeps finished jobs listed for MinJobAge: wait for a finished state, not absence.
    while any(not info.state.finished for info in client.job_states(job_ids).values()):
        time.sleep(poll_s)
    states = []
    for job in job_ids:
        try:
            states.append(client.show_job(job).get("JobState", "UNKNOWN"))
        except SlurmError:
            states.append("UNKNOWN")
    print(
        f"finished: {', '.join(f'{j} {s}' for j, s in zip(job_ids, states, strict=False))}",
        file=sys.stderr,
    )
    return 0 if all(s == "COMPLETED" for s in states) else 1


def _show_sweeps(sweeps: list[Path], client: SlurmClient, args: argparse.Namespace) -> int:
    """A compact per-state count for each sweep; every task's row with ``--attempts``."""
    from hpc_ddp.results import gather_results, row_dict, sweep_summary

    out = []
    for sweep_dir in sweeps:
        jobs = read_manifest(sweep_dir).array_jobs
        try:
            live: dict[str, Any] | None = client.job_states(jobs) if jobs else {}
        except SlurmError:
            live = None  # states from the ledgers alone, not from an empty queue
        rows = gather_results(sweep_dir, live)
        out.append((sweep_dir, sweep_summary(rows), [row_dict(r) for r in rows]))
    if args.json:
        print(json.dumps([{"sweep": str(d), "summary": s, "tasks": t} for d, s, t in out]))
        return 0
    for sweep_dir, summary, tasks in out:
        counts = ", ".join(f"{n} {state}" for state, n in summary.items() if n)
        print(f"{sweep_dir}: {len(tasks)} tasks: {counts}")
        if args.attempts:
            print(tabulate(tasks, headers="keys"))
    return 0
