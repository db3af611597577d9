"""``hpc-ddp sweep SWEEP_FILE [KEY=VALUE ...]``: expand, validate, write one sweep directory,
submit one job array. ``hpc-ddp sweep --resubmit-failed SWEEP_DIR``: submit the failed tasks again.

Exit codes: 0 submitted (or shown), 2 usage or config error, 1 failed submission. With
``--resubmit-failed``: 0 also when nothing is left to resubmit; 2 when nothing was resubmitted
because tasks of the sweep are still queued or running (e.g. another ``--resubmit-failed``
just submitted them: the message names its array).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.config.load import find_site_profile
from hpc_ddp.config.preflight import preflight_points
from hpc_ddp.errors import ConfigError, RunDirError, RunsDirError, SlurmError, TargetError
from hpc_ddp.launch.submission import new_run_dir, runs_dir_from, stamp_of
from hpc_ddp.layout import RUNS_DIR_ENV
from hpc_ddp.slurm.arrayjobs import format_index_ranges
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.sweep.arrays import SLURM_DEFAULT_MAX_ARRAY_SIZE, PreparedArray, sweep_name
from hpc_ddp.sweep.spec import SweepSpec, load_sweep
from hpc_ddp.sweep.submit import prepare_sweep, resubmit_failed, submit_sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("sweep_file", nargs="?", help="sweep YAML (a base job plus `sweep:`)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides of the base job, e.g. slurm.time=30 (swept keys win)",
    )
    parser.add_argument(
        "--resubmit-failed",
        metavar="SWEEP_DIR",
        help="submit the failed and cancelled tasks of SWEEP_DIR again, in their directories",
    )
    parser.add_argument(
        "--site",
        help="site profile YAML (default $HPC_DDP_SITE, else $XDG_CONFIG_HOME/hpc-ddp/site.yaml)",
    )
    parser.add_argument(
        "--runs-dir",
        help=f"where the sweep directory is created (default ${RUNS_DIR_ENV} or ./runs)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the points and the script; submit nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    """Submit (or show) a sweep, or resubmit its failed tasks."""
    invocation = ["hpc-ddp", "sweep", *sys.argv[2:]] if sys.argv[1:2] == ["sweep"] else []
    client = args.slurm
    if args.resubmit_failed:
        if args.sweep_file or args.overrides:
            raise ConfigError(
                "--resubmit-failed takes a sweep directory and nothing else. HINT: "
                f"hpc-ddp sweep --resubmit-failed {shlex.quote(args.resubmit_failed)}"
            )
        return _resubmit(Path(args.resubmit_failed), client, invocation, args)
    if not args.sweep_file:
        raise ConfigError(
            "no sweep file given. HINT: hpc-ddp sweep SWEEP_FILE [KEY=VALUE ...] "
            "(see jobs/sweep-lr.yaml), or --resubmit-failed SWEEP_DIR"
        )
    sweep_file = Path(args.sweep_file)
    site = find_site_profile(args.site, os.environ, Path.home())
    spec = load_sweep(sweep_file, args.overrides, site)
    preflight_points((f"{sweep_file}: point {p.index}", p.config) for p in spec.points)
    runs_dir = runs_dir_from(args.runs_dir, os.environ)
    origin = (
        "--runs-dir" if args.runs_dir else f"${RUNS_DIR_ENV}" if os.environ.get(RUNS_DIR_ENV)
        else "the default runs directory"
    )  # fmt: skip
    check_runs_dir(runs_dir, origin)
    invocation = invocation or ["hpc-ddp", "sweep", args.sweep_file, *args.overrides]
    if args.dry_run:
        return _dry_run(
            spec,
            sweep_file=sweep_file,
            runs_dir=runs_dir,
            client=client,
            invocation=invocation,
            as_json=args.json,
        )
    try:
        submission = submit_sweep(
            spec,
            sweep_file=sweep_file,
            runs_dir=runs_dir,
            python=sys.executable,
            invocation=invocation,
            client=client,
        )
    except OSError as exc:  # the checks above passed, and then the disk said no
        raise RunDirError(
            f"writing the sweep directory under {runs_dir} failed: {exc}. HINT: check the "
            "space and permissions there, or choose another --runs-dir"
        ) from None
    sweep_dir = submission.sweep_dir
    if args.json:
        print(
            json.dumps(
                {
                    "sweep_dir": str(sweep_dir),
                    "points": len(spec.points),
                    "array_jobs": [r.job_id for r in submission.arrays],
                    "arrays": [
                        {"job_id": r.job_id, "points": r.points, "array": r.array}
                        for r in submission.arrays
                    ],
                }
            )
        )
        return 0
    arrays = submission.arrays
    print(
        f"submitted sweep {sweep_name(spec)}: {len(spec.points)} points as "
        + ", ".join(f"array job {r.job_id} (--array={r.array})" for r in arrays)
    )
    print(f"  sweep dir: {sweep_dir}")
    print(f"  tasks:     {sweep_dir}/tasks/<index>/ (config.yaml, logs/, metrics.jsonl)")
    print(f"  watch:     hpc-ddp status {sweep_dir}   (squeue -j {arrays[0].job_id})")
    print(f"  results:   hpc-ddp results {sweep_dir}")
    return 0


def check_runs_dir(runs_dir: Path, origin: str) -> None:
    """Refuse a runs directory that is a file, lies under one, or cannot be written to.

    ``origin`` names where it came from (``--runs-dir``) in the message.
    """
    for path in (runs_dir, *runs_dir.absolute().parents):
        if not path.exists():
            continue  # it will be created
        if not path.is_dir():
            what = "is a file" if path == runs_dir else f"lies under the file {path}"
            raise RunsDirError(
                f"{origin} {runs_dir}: {what}, not a directory. HINT: give a directory for "
                "the sweep directories (it is created if missing)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunsDirError(
                f"{origin} {runs_dir}: {path} is not writable. HINT: choose a directory you "
                "can write to"
            )
        return


def points_table(spec: SweepSpec) -> str:
    """The points as a table: index, name and each swept key (blank where a point leaves it)."""
    keys = list(dict.fromkeys(k for p in spec.points for k, _ in p.overrides))
    rows = []
    for p in spec.points:
        values = dict(p.overrides)
        rows.append(
            [p.index, p.config.name, *(_cell(values[k]) if k in values else "" for k in keys)]
        )
    return tabulate(rows, headers=["#", "name", *keys], disable_numparse=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def _dry_run(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    runs_dir: Path,
    client: SlurmClient,
    invocation: list[str],
    as_json: bool,
) -> int:
    name = sweep_name(spec)
    now = datetime.now(timezone.utc)
    sweep_dir = new_run_dir(runs_dir.resolve(), name, stamp_of(now))
    try:
        max_array_size, note = client.max_array_size(), ""
    except SlurmError:
        max_array_size = SLURM_DEFAULT_MAX_ARRAY_SIZE
        note = f"# Slurm not reachable: assumed MaxArraySize={max_array_size} (Slurm's default)"
    arrays = prepare_sweep(
        spec,
        sweep_file=sweep_file,
        sweep_dir=sweep_dir,
        max_array_size=max_array_size,
        python=sys.executable,
        invocation=invocation,
        client=client,
        now=now,
    )
    if as_json:
        print(
            json.dumps(
                {
                    "sweep_dir": str(sweep_dir),
                    "metric": {"name": spec.metric, "mode": spec.mode},
                    "max_parallel": spec.max_parallel,
                    "points": [
                        {"index": p.index, "name": p.config.name, "overrides": dict(p.overrides)}
                        for p in spec.points
                    ],
                    "arrays": [_array_json(a) for a in arrays],
                }
            )
        )
        return 0
    print(points_table(spec))
    print()
    _print_arrays(arrays)
    throttle = f", at most {spec.max_parallel} at once" if spec.max_parallel else ""
    print(f"# {len(spec.points)} points in {len(arrays)} job array(s){throttle}")
    print(f"# ranked by {spec.metric} ({spec.mode})")
    print(f"# sweep directory: {sweep_dir}")
    if note:
        print(note)
    return 0


def _array_json(a: PreparedArray) -> dict[str, Any]:
    return {
        "points": list(a.plan.points),
        "offset": a.plan.offset,
        "array": a.array,
        "script_name": a.script_name,
        "script": a.script,
        "command": list(a.argv),
    }


def _print_arrays(arrays: list[PreparedArray]) -> None:
    for a in arrays:
        if len(arrays) > 1:
            print(f"# ---- {a.script_name}: --array={a.array}, task t runs point t+{a.plan.offset}")
        print(a.script, end="")
        print(f"# would run: {shlex.join(a.argv)}")


def _resubmit(
    sweep_dir: Path, client: SlurmClient, invocation: list[str], args: argparse.Namespace
) -> int:
    result = resubmit_failed(
        sweep_dir,
        client=client,
        python=sys.executable,
        invocation=invocation or ["hpc-ddp", "sweep", "--resubmit-failed", str(sweep_dir)],
        dry_run=args.dry_run,
    )
    if not result.points and result.live and not args.dry_run:
        raise _still_live(sweep_dir, result.live)
    if args.json:
        print(
            json.dumps(
                {
                    "sweep_dir": str(sweep_dir),
                    "points": result.points,
                    "array_jobs": [r.job_id for r in result.records],
                    "arrays": [_array_json(a) for a in result.arrays] if args.dry_run else [],
                }
            )
        )
        return 0
    if not result.points:
        print(f"nothing to resubmit: no task of {sweep_dir} has failed or been cancelled")
        return 0
    listed = ", ".join(map(str, result.points))
    if args.dry_run:
        print(f"# would resubmit {len(result.points)} task(s): {listed}")
        _print_arrays(result.arrays)
        return 0
    jobs = ", ".join(f"array job {r.job_id} (--array={r.array})" for r in result.records)
    print(f"resubmitted {len(result.points)} task(s) of {sweep_dir} ({listed}) as {jobs}")
    print(f"  watch:   hpc-ddp status {sweep_dir}")
    print(f"  results: hpc-ddp results {sweep_dir}")
    return 0


def _still_live(sweep_dir: Path, live: dict[int, str]) -> TargetError:
    """Nothing to resubmit while tasks run: the refusal naming their arrays (exit 2)."""
    arrays = ", ".join(dict.fromkeys(ref.split("_", 1)[0] for ref in live.values()))
    shown = ", ".join(list(dict.fromkeys(live.values()))[:8])
    more = " ..." if len(set(live.values())) > 8 else ""
    return TargetError(
        f"nothing resubmitted: {len(live)} task(s) of {sweep_dir} (points "
        f"{format_index_ranges(live)}) are still queued or running in array job(s) {arrays} "
        f"({shown}{more}), and no task has failed; two jobs must never write one task "
        f"directory. HINT: `hpc-ddp status {sweep_dir}` follows them; resubmit once they have "
        f"ended, or `hpc-ddp cancel {sweep_dir}` first."
    )
