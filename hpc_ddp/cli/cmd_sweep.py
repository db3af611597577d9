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

from hpc_ddp.api.sweep import (
    SweepPlan,
    arrays_text,
    at_once,
    choose_sweep_backend,
    launch_sweep,
    load_sweep_spec,
    plan_json,
    plan_sweep,
    points_table,
    resubmission_json,
    resubmit,
    submitted_json,
    sweep_runs_dir,
)
from hpc_ddp.cli.options import add_backend_option, add_site_option
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV


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
    if args.resubmit_failed:
        if args.sweep_file or args.overrides:
            raise ConfigError(
                "--resubmit-failed takes a sweep directory and nothing else. HINT: "
                f"hpc-ddp sweep --resubmit-failed {shlex.quote(args.resubmit_failed)}"
            )
        return _resubmit(Path(args.resubmit_failed), invocation, args)
    if not args.sweep_file:
        raise ConfigError(
            "no sweep file given. HINT: hpc-ddp sweep SWEEP_FILE [KEY=VALUE ...] "
            "(see jobs/sweep-lr.yaml), or --resubmit-failed SWEEP_DIR"
        )
    backend = choose_sweep_backend(args.backend)
    spec = load_sweep_spec(args.sweep_file, args.overrides, site=args.site)
    runs_dir = sweep_runs_dir(args.runs_dir)
    invocation = invocation or ["hpc-ddp", "sweep", args.sweep_file, *args.overrides]
    if args.dry_run:
        plan = plan_sweep(spec, sweep_file=args.sweep_file, runs_dir=runs_dir,
                          backends=args.backends, invocation=invocation,
                          backend=backend)  # fmt: skip
        return _dry_run(plan, as_json=args.json)
    sweep = launch_sweep(spec, sweep_file=args.sweep_file, runs_dir=runs_dir,
                         backends=args.backends, invocation=invocation,
                         backend=backend)  # fmt: skip
    if args.json:
        print(json.dumps(submitted_json(sweep, len(spec.points))))
        return 0
    sweep_dir = sweep.sweep_dir
    if not sweep.array_jobs:  # a local sweep: its controller starts the points
        print(
            f"started sweep {spec.name}: {len(spec.points)} points as local runs, "
            f"{at_once(spec, backend)} at once"
        )
        print(f"  sweep dir: {sweep_dir}")
        print(f"  tasks:     {sweep_dir}/tasks/<index>/ (as each starts: config.yaml, logs/, ...)")
        print(f"  watch:     hpc-ddp status {sweep_dir}")
        print(f"  results:   hpc-ddp results {sweep_dir}")
        return 0
    arrays = sweep.arrays()
    print(
        f"submitted sweep {spec.name}: {len(spec.points)} points as "
        + ", ".join(f"array job {r.job_id} (--array={r.array})" for r in arrays)
    )
    print(f"  sweep dir: {sweep_dir}")
    print(f"  tasks:     {sweep_dir}/tasks/<index>/ (as each starts: config.yaml, logs/, ...)")
    print(f"  watch:     hpc-ddp status {sweep_dir}   (squeue -j {arrays[0].job_id})")
    print(f"  results:   hpc-ddp results {sweep_dir}")
    return 0


def _dry_run(plan: SweepPlan, *, as_json: bool) -> int:
    spec = plan.spec
    if as_json:
        print(json.dumps(plan_json(plan)))
        return 0
    print(points_table(spec))
    if not plan.arrays:  # a local sweep: its controller would start the points
        print(f"# backend: local; {len(spec.points)} points as local runs, {plan.at_once} at once")
    else:
        print()
        print(arrays_text(plan.arrays), end="")
        throttle = f", at most {spec.max_parallel} at once" if spec.max_parallel else ""
        print(f"# {len(spec.points)} points in {len(plan.arrays)} job array(s){throttle}")
    print(f"# ranked by {spec.metric} ({spec.mode})")
    print(f"# sweep directory: {plan.sweep_dir}")
    if plan.note:
        print(plan.note)
    return 0


def _resubmit(sweep_dir: Path, invocation: list[str], args: argparse.Namespace) -> int:
    result = resubmit(
        sweep_dir, backends=args.backends, invocation=invocation, dry_run=args.dry_run
    )
    if args.json:
        print(json.dumps(resubmission_json(sweep_dir, result, dry_run=bool(args.dry_run))))
        return 0
    if not result.points:
        print(f"nothing to resubmit: no task of {sweep_dir} has failed or been cancelled")
        return 0
    listed = ", ".join(map(str, result.points))
    if args.dry_run:
        print(f"# would resubmit {len(result.points)} task(s): {listed}")
        print(arrays_text(result.arrays), end="")
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
