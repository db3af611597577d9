"""``hpc-ddp sweep SWEEP_FILE [KEY=VALUE ...]``: expand, validate, write one sweep directory,
submit one job array (``--backend local``: run the points as local runs, ``max_parallel`` at
once). ``hpc-ddp sweep JOB_FILE KEY=A,B ...``: a grid from the command line, as Hydra's
``--multirun`` reads it. ``hpc-ddp sweep --resubmit-failed SWEEP_DIR``: submit the failed tasks
again. Each is :mod:`hpc_ddp.api.sweep`'s (the Python API's ``hpc_ddp.submit_sweep()``); this
verb prints what it did.

Exit codes: 0 submitted (or shown), 2 usage or config error, 1 failed submission. With
``--resubmit-failed``: 0 also when nothing is left to resubmit; 2 when nothing was resubmitted
because tasks of the sweep are still queued or running (e.g. another ``--resubmit-failed``
just submitted them: the message names its array).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.api.sweep import (
    Sweep,
    SweepPlan,
    choose_sweep_backend,
    launch_sweep,
    load_sweep_spec,
    plan_sweep,
    resubmit,
    sweep_runs_dir,
)
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.cli.options import add_backend_option, add_site_option
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.sweep.arrays import PreparedArray, sweep_name
from hpc_ddp.sweep.spec import SweepSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("sweep_file", nargs="?", help="sweep YAML (a base job plus `sweep:`)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides of the base job, e.g. slurm.time=30 (swept keys win); "
        "KEY=A,B,C is a grid axis (a literal comma: KEY='a,b' or KEY=a\\,b)",
    )
    parser.add_argument(
        "--resubmit-failed",
        metavar="SWEEP_DIR",
        help="submit the failed and cancelled tasks of SWEEP_DIR again, in their directories",
    )
    add_backend_option(parser)
    add_site_option(parser)
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
    backend = choose_sweep_backend(args.backend)
    spec = load_sweep_spec(args.sweep_file, args.overrides, site=args.site)
    runs_dir = sweep_runs_dir(args.runs_dir)
    invocation = invocation or ["hpc-ddp", "sweep", args.sweep_file, *args.overrides]
    if backend == "local":
        return _local(spec, args, runs_dir, invocation)
    if args.dry_run:
        plan = plan_sweep(spec, sweep_file=args.sweep_file, runs_dir=runs_dir, slurm=client,
                          invocation=invocation)  # fmt: skip
        return _dry_run(plan, as_json=args.json)
    sweep = launch_sweep(spec, sweep_file=args.sweep_file, runs_dir=runs_dir, slurm=client,
                         invocation=invocation)  # fmt: skip
    sweep_dir = sweep.sweep_dir
    arrays = sweep.arrays()
    if args.json:
        print(json.dumps(submitted_json(sweep, len(spec.points))))
        return 0
    print(
        f"submitted sweep {sweep_name(spec)}: {len(spec.points)} points as "
        + ", ".join(f"array job {r.job_id} (--array={r.array})" for r in arrays)
    )
    print(f"  sweep dir: {sweep_dir}")
    print(f"  tasks:     {sweep_dir}/tasks/<index>/ (as each starts: config.yaml, logs/, ...)")
    print(f"  watch:     hpc-ddp status {sweep_dir}   (squeue -j {arrays[0].job_id})")
    print(f"  results:   hpc-ddp results {sweep_dir}")
    return 0


def _local(spec: SweepSpec, args: argparse.Namespace, runs_dir: Path, invocation: list[str]) -> int:
    """A local sweep: shown (``--dry-run``), or started under its sweep controller."""
    from hpc_ddp.submission.submit import new_run_dir, stamp_of
    from hpc_ddp.sweep.local import local_parallel

    parallel = local_parallel(spec.max_parallel)
    if args.dry_run:
        from datetime import datetime, timezone

        sweep_dir = new_run_dir(runs_dir.resolve(), sweep_name(spec),
                                stamp_of(datetime.now(timezone.utc)))  # fmt: skip
        if args.json:
            print(json.dumps(_plan_json(spec, sweep_dir, "local", parallel, [])))
            return 0
        print(points_table(spec))
        print(f"# backend: local; {len(spec.points)} points as local runs, {parallel} at once")
        print(f"# ranked by {spec.metric} ({spec.mode})")
        print(f"# sweep directory: {sweep_dir}")
        return 0
    sweep = launch_sweep(spec, sweep_file=args.sweep_file, runs_dir=runs_dir, slurm=args.slurm,
                         invocation=invocation, backend="local")  # fmt: skip
    if args.json:
        print(json.dumps(submitted_json(sweep, len(spec.points))))
        return 0
    print(
        f"started sweep {sweep_name(spec)}: {len(spec.points)} points as local runs, "
        f"{parallel} at once"
    )
    _print_where(sweep)
    return 0


def _print_where(sweep: Sweep) -> None:
    sweep_dir = sweep.sweep_dir
    print(f"  sweep dir: {sweep_dir}")
    print(f"  tasks:     {sweep_dir}/tasks/<index>/ (as each starts: config.yaml, logs/, ...)")
    print(f"  watch:     hpc-ddp status {sweep_dir}")
    print(f"  results:   hpc-ddp results {sweep_dir}")


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


def submitted_json(sweep: Sweep, points: int) -> dict[str, Any]:
    """``sweep --json`` once submitted or started (schema ``hpc-ddp.sweep/1``)."""
    from hpc_ddp.output import SWEEP, document

    arrays = sweep.arrays()
    return document(
        SWEEP,
        {
            "dry_run": False,
            "sweep_dir": str(sweep.sweep_dir),
            "backend": sweep.backend,
            "points": points,
            "job_id": read_manifest(sweep.sweep_dir).job_id,
            "array_jobs": [r.job_id for r in arrays],
            "arrays": [{"job_id": r.job_id, "points": r.points, "array": r.array} for r in arrays],
        },
    )


def _plan_json(
    spec: SweepSpec, sweep_dir: Path, backend: str, parallel: int | None, arrays: list[Any]
) -> dict[str, Any]:
    """``sweep --dry-run --json`` (schema ``hpc-ddp.sweep/1``, ``dry_run`` true)."""
    from hpc_ddp.output import SWEEP, document

    return document(
        SWEEP,
        {
            "dry_run": True,
            "sweep_dir": str(sweep_dir),
            "backend": backend,
            "metric": {"name": spec.metric, "mode": spec.mode},
            "max_parallel": parallel,
            "points": [
                {"index": p.index, "name": p.config.name, "values": _values(p.overrides)}
                for p in spec.points
            ],
            "arrays": arrays,
        },
    )


def _values(overrides: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in overrides}


def _dry_run(plan: SweepPlan, *, as_json: bool) -> int:
    spec, sweep_dir, arrays, note = plan.spec, plan.sweep_dir, plan.arrays, plan.note
    if as_json:
        shown = [_array_json(a) for a in arrays]
        print(json.dumps(_plan_json(spec, sweep_dir, "slurm", spec.max_parallel, shown)))
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
    from hpc_ddp.output import SWEEP, document

    result = resubmit(sweep_dir, slurm=client, invocation=invocation, dry_run=args.dry_run)
    if args.json:
        shown = {
            "dry_run": bool(args.dry_run),
            "sweep_dir": str(sweep_dir),
            "backend": Sweep.from_dir(sweep_dir).backend,
            "resubmitted": result.points,
            "job_id": read_manifest(sweep_dir).job_id,
            "array_jobs": [r.job_id for r in result.records],
            "arrays": [_array_json(a) for a in result.arrays] if args.dry_run else [],
        }
        print(json.dumps(document(SWEEP, shown)))
        return 0
    if not result.points:
        print(f"nothing to resubmit: no task of {sweep_dir} has failed or been cancelled")
        return 0
    listed = ", ".join(map(str, result.points))
    if args.dry_run:
        print(f"# would resubmit {len(result.points)} task(s): {listed}")
        _print_arrays(result.arrays)
        return 0
    if not result.records:  # a local sweep: a new sweep controller runs them
        print(f"started {len(result.points)} task(s) of {sweep_dir} ({listed}) again, locally")
        print(f"  watch:   hpc-ddp status {sweep_dir}")
        print(f"  results: hpc-ddp results {sweep_dir}")
        return 0
    jobs = ", ".join(f"array job {r.job_id} (--array={r.array})" for r in result.records)
    print(f"resubmitted {len(result.points)} task(s) of {sweep_dir} ({listed}) as {jobs}")
    print(f"  watch:   hpc-ddp status {sweep_dir}")
    print(f"  results: hpc-ddp results {sweep_dir}")
    return 0
