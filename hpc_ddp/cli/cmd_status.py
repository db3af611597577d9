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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.errors import RunDirError, RunsDirError, SlurmError
from hpc_ddp.local.process import controller_cmdline_matches, identify, read_identity
from hpc_ddp.rundir import (
    Manifest,
    RunPaths,
    check_runs_dir,
    checkpoint_steps,
    damaged_checkpoint,
    last_metric,
    read_manifest,
)
from hpc_ddp.runtime.ledger import Attempt, EndCause, read_ledger
from hpc_ddp.slurm.client import JobInfo, JobState, SlurmClient
from hpc_ddp.slurm.postmortem import failed_rank, has_logs, startup_failure
from hpc_ddp.state.verdict import SlurmView, Source, judge

RUNS_DIR_ENV = "HPC_DDP_RUNS_DIR"
COLUMNS = ["run", "job", "state", "nodes", "elapsed", "attempts", "causes", "ckpt step", "loss"]
DAMAGED = "DAMAGED"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("targets", nargs="*", help="run directories or job ids (default: all runs)")
    parser.add_argument(
        "--runs-dir", help=f"where to look for runs (default ${RUNS_DIR_ENV} or ./runs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--attempts", action="store_true", help="also list every attempt")


# --- which runs -------------------------------------------------------------------------------


def list_runs(runs_dir: Path) -> list[Path]:
    """Every run and sweep directory (one with a ``manifest.json``) under ``runs_dir``."""
    check_runs_dir(runs_dir, write=False)
    if not runs_dir.exists():
        return []
    try:
        entries = sorted(runs_dir.iterdir())
    except OSError as exc:
        raise RunsDirError(
            f"cannot list --runs-dir {str(runs_dir)!r}: {exc.strerror or exc}. HINT: pass a "
            "readable directory with --runs-dir (or $HPC_DDP_RUNS_DIR)."
        ) from None
    found = []
    for p in entries:
        try:
            if (p / "manifest.json").exists():
                found.append(p)
        except OSError:  # a run directory we may not look into: listed, then shown DAMAGED
            found.append(p)
    return found


def resolve_targets(targets: Sequence[str], runs_dir: Path) -> list[Path]:
    """Run directories for the given run dirs or job ids (all runs when none given).

    A job id is matched against every readable manifest under ``runs_dir``; damaged ones are
    skipped (and named if nothing matched), so one bad run never hides the others.
    """
    if not targets:
        return list_runs(runs_dir)
    found: list[Path] = []
    listing: list[Path] | None = None
    for t in targets:
        path = Path(t)
        if path.is_dir():
            if not (path / "manifest.json").exists():
                read_manifest(path)  # raises: "no manifest.json" with its hint
            found.append(path)
            continue
        listing = list_runs(runs_dir) if listing is None else listing
        match, damaged = [], []
        for p in listing:
            try:
                if read_manifest(p).job_id == t:
                    match.append(p)
            except RunDirError:
                damaged.append(p.name)
        if not match:
            skipped = (
                f" ({len(damaged)} run(s) with a damaged manifest were skipped: "
                f"{', '.join(damaged[:5])}{' ...' if len(damaged) > 5 else ''})"
                if damaged
                else ""
            )
            raise RunDirError(
                f"{t!r} is neither a run directory nor a job id found under {runs_dir}"
                f"{skipped}. HINT: pass the run directory printed by `hpc-ddp submit`, or "
                "--runs-dir."
            )
        found.extend(match)
    return found


# --- what Slurm says --------------------------------------------------------------------------


def ask_slurm(client: SlurmClient, job_ids: Sequence[str], plain: Sequence[str]) -> SlurmView:
    """squeue for every job id; sacct (once) for the ``plain`` run jobs squeue no longer holds."""
    try:
        live = client.job_states(job_ids) if job_ids else {}
    except SlurmError as exc:
        return SlurmView(None, _said(exc))
    gone = [j for j in plain if j not in live]
    if not gone:
        return SlurmView(live, accounting={})
    try:
        accounting = client.sacct_states(gone)
    except SlurmError as exc:
        return SlurmView(live, _said(exc), None)
    return SlurmView(live, accounting=accounting)


def _said(exc: SlurmError) -> str:
    """``squeue failed (exit 1): <Slurm's words>`` from a :class:`SlurmError`'s message."""
    lines = str(exc).splitlines()
    said = next((x.removeprefix("Slurm said: ") for x in lines if x.startswith("Slurm said:")), "")
    return f"{lines[0].rstrip('.')}: {said}" if said else lines[0]


# --- one row ----------------------------------------------------------------------------------


def _fmt_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


_FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY"})
_MAY_RUN = frozenset({Source.UNREACHABLE, Source.LOCAL_RUNNING})
"""Sources under which an open attempt may still be running (its elapsed time runs on)."""


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


def _checkpoints(paths: RunPaths) -> tuple[int | None, str | None]:
    """(newest step whose file looks whole, a note on damaged ones)."""
    steps = checkpoint_steps(paths)
    damaged: list[tuple[int, str]] = []
    for step in reversed(steps):
        why = damaged_checkpoint(paths.checkpoints / f"step-{step:08d}.pt")
        if why is None:
            return step, _damage_note(damaged, len(steps))
        damaged.append((step, why))
    return None, _damage_note(damaged, len(steps))


def _damage_note(damaged: list[tuple[int, str]], total: int) -> str | None:
    if not damaged:
        return None
    step, why = damaged[0]
    if len(damaged) == total:
        return (
            f"all {total} checkpoint(s) damaged (newest step {step}: {why}): a requeue cannot "
            "resume. HINT: `hpc-ddp checkpoints RUN_DIR` says more; move checkpoints/ aside to "
            "start over"
        )
    return f"{len(damaged)} newest checkpoint(s) damaged (step {step}: {why}); resume skips them"


def _local_alive(run_dir: Path, job_id: str | None) -> bool:
    """True while a local run's controller runs: the process recorded in ``local.json`` (or,
    for older runs, the pid if it is this run's submitit controller). A bare pid check would
    call any later process that got the same pid this run."""
    expected = read_identity(run_dir)
    if expected is not None:
        return identify(expected.pid) == expected
    if not job_id or not job_id.isdigit() or int(job_id) <= 1:
        return False
    now = identify(int(job_id))
    return now is not None and controller_cmdline_matches(now.cmdline, run_dir.resolve())


def run_status(run_dir: Path, view: SlurmView) -> dict[str, Any]:
    """One status row (a plain dict) for ``run_dir``; a damaged run is a DAMAGED row."""
    try:
        return _row(run_dir, read_manifest(run_dir), view)
    except (RunDirError, OSError) as exc:
        return damaged_row(run_dir, exc)


def damaged_row(run_dir: Path, exc: BaseException) -> dict[str, Any]:
    """The row of a run whose files cannot be read: its state is DAMAGED, the note says why."""
    text = str(exc) if isinstance(exc, RunDirError) else f"{type(exc).__name__}: {exc}"
    return {
        "run": str(run_dir), "job": None, "backend": None, "state": DAMAGED, "nodes": "-",
        "elapsed": "-", "attempts": None, "causes": "-", "ckpt step": None, "loss": None,
        "failed_rank": None, "note": text, "attempt_list": [],
    }  # fmt: skip


def _row(run_dir: Path, manifest: Manifest, view: SlurmView) -> dict[str, Any]:
    paths = RunPaths(run_dir)
    attempts = read_ledger(paths.ledger)
    job = manifest.job_id or ""
    record: Any = None
    if manifest.backend == "local":
        source = Source.LOCAL_RUNNING if _local_alive(run_dir, job) else Source.LOCAL_ENDED
        slurm_state = None
    else:
        scripts = [str(Path(manifest.run_dir) / "job.sbatch"), str(paths.script.resolve())]
        slurm_state, source, record = view.of(job, scripts)
    detail = view.error if source is Source.UNREACHABLE else ""
    if source is Source.REUSED:
        detail = f"script {record.command}"
    verdict = judge(slurm_state, source, attempts, lambda: startup_failure(paths.logs), detail)
    notes = [verdict.note] if verdict.note else []
    if source is Source.GONE_NO_ACCOUNTING and view.error:
        notes.append(view.error)
    if not attempts and verdict.state in _FAILED_STATES and not has_logs(paths.logs):
        notes.append("the batch script left no log in logs/ (it never started?)")
    nodes, elapsed = "-", None
    if source is Source.SQUEUE:
        nodes, elapsed = record.nodes or "-", record.elapsed_s
    elif source is Source.SACCT:
        elapsed = record.elapsed_s
    if attempts:
        if nodes == "-":
            nodes = attempts[-1].nodelist or "-"
        ends = [a.ended for a in attempts if a.ended is not None]
        if elapsed is None and attempts[-1].is_open and source in _MAY_RUN:
            elapsed = time.time() - attempts[0].started
        elif elapsed is None and ends:  # ended (or gone): up to the last end anyone saw
            elapsed = max(ends) - attempts[0].started
    step, ckpt_note = _checkpoints(paths)
    if ckpt_note:
        notes.append(ckpt_note)
    return {
        "run": str(run_dir),
        "job": manifest.job_id,
        "backend": manifest.backend,
        "state": verdict.state,
        "nodes": nodes,
        "elapsed": _fmt_elapsed(elapsed),
        "attempts": len(attempts),
        "causes": ",".join(a.cause.value if a.cause else "running" for a in attempts) or "-",
        "ckpt step": step,
        "loss": last_metric(paths, "loss"),
        "failed_rank": _failed_rank(paths, verdict.state, attempts),
        "note": "; ".join(notes) or None,
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


# --- the command ------------------------------------------------------------------------------


def _sweep_entry(sweep_dir: Path, view: SlurmView) -> dict[str, Any]:
    from hpc_ddp.sweep.results import gather_results, row_dict, sweep_summary

    rows = gather_results(sweep_dir, view.live)  # live None: states from the ledgers alone
    tasks = [row_dict(r) for r in rows]
    return {"sweep": str(sweep_dir), "summary": sweep_summary(rows), "tasks": tasks}


def run(args: argparse.Namespace) -> int:
    """Print the status table (or JSON): plain runs first, then one line per sweep."""
    runs_dir = Path(args.runs_dir or os.environ.get(RUNS_DIR_ENV) or "runs")
    dirs = resolve_targets(args.targets, runs_dir)
    manifests: dict[Path, Manifest | RunDirError] = {}
    for d in dirs:
        try:
            manifests[d] = read_manifest(d)
        except RunDirError as exc:
            manifests[d] = exc
    good = {d: m for d, m in manifests.items() if isinstance(m, Manifest)}
    sweeps = [d for d in good if (d / "tasks").is_dir()]
    plain = [
        m.job_id for d, m in good.items() if d not in sweeps and m.backend != "local" and m.job_id
    ]
    arrays = [j for d in sweeps for j in good[d].array_jobs]
    view = ask_slurm(SlurmClient(), list(dict.fromkeys([*plain, *arrays])), plain)
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
    if args.json:
        print(json.dumps([*rows, *entries], indent=2))
        return 0
    if not rows and not entries:
        print(f"no runs under {runs_dir}", file=sys.stderr)
        return 0
    if rows:
        print(tabulate([[r[c] for c in COLUMNS] for r in rows], headers=COLUMNS))
    for r in rows:
        if r["failed_rank"]:
            print(f"{r['run']}: failed first: {r['failed_rank']} (srun, in logs/batch-*.err)")
        if r["note"]:
            print(f"{r['run']}: {r['note']}")
    if args.attempts:
        for r in rows:
            print(f"\n{r['run']}")
            print(tabulate(r["attempt_list"], headers="keys"))
    for entry in entries:
        counts = ", ".join(f"{n} {state}" for state, n in entry["summary"].items() if n)
        print(f"{entry['sweep']}: {len(entry['tasks'])} tasks: {counts}")
        if args.attempts:
            print(tabulate(entry["tasks"], headers="keys"))
    return 0


# --- waiting ----------------------------------------------------------------------------------

FIRST_POLL_S = 0.5
MAX_POLL_S = 15.0
"""Polls start fast (short jobs end in about a second) and back off to this: a long job's
wait then costs slurmctld one small squeue every 15 s."""


def job_state_of(live: dict[str, JobInfo], job_id: str) -> JobState | None:
    """One job's state in squeue's rows; for an array, the first task that did not complete."""
    rows = [i for i in live.values() if job_id in (i.job_id, i.ref, i.array_job_id)]
    if not rows:
        return None
    bad = [i.state for i in rows if i.state is not JobState.COMPLETED]
    return bad[0] if bad else JobState.COMPLETED


def wait_for_jobs(
    client: SlurmClient,
    job_ids: Sequence[str],
    *,
    run_dirs: Sequence[Path] = (),
    first_poll_s: float = FIRST_POLL_S,
    max_poll_s: float = MAX_POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until every job has finished; 0 when all completed.

    With ``run_dirs`` (one per job), "completed" also needs the run's ledger to say finished,
    and the state printed is the one ``status`` shows.
    """
    # squeue keeps finished jobs listed for MinJobAge: wait for a finished state, not absence.
    delay = first_poll_s
    while True:
        live = client.job_states(job_ids)
        if all(info.state.finished for info in live.values()):
            break
        sleep(delay)
        delay = min(max_poll_s, delay * 1.5)
    missing = [j for j in job_ids if job_state_of(live, j) is None]
    try:
        accounting = client.sacct_states(missing) if missing else {}
    except SlurmError:
        accounting = None
    view = SlurmView(live, accounting=accounting)
    states = []
    for i, job in enumerate(job_ids):
        if i < len(run_dirs):
            states.append(run_status(run_dirs[i], view)["state"])
            continue
        state = job_state_of(live, job)
        record = None if accounting is None else accounting.get(job)
        states.append((state or (record.state if record else JobState.UNKNOWN)).value)
    print(
        f"finished: {', '.join(f'{j} {s}' for j, s in zip(job_ids, states, strict=False))}",
        file=sys.stderr,
    )
    return 0 if all(s == "COMPLETED" for s in states) else 1
