"""``hpc-ddp cancel RUN_DIR | SWEEP_DIR | SWEEP_DIR/tasks/N | JOB_ID | ARRAYJOB_TASK ...``:
cancel runs' Slurm jobs (local: stop the tasks).

What each target cancels, and the checks that nothing is signalled that is not provably the
target's (a copied run directory's job, a job that already ended, a reused pid), are
:mod:`hpc_ddp.api.cancel`'s, shared with the Python API's ``Job.cancel()``; this verb prints
what each target came to.

A local run is stopped as Slurm stops a job: SIGTERM, then SIGKILL to whatever still runs after
``--kill-wait`` seconds (default 30, Slurm's ``KillWait``); the verb returns once every process
of the run has ended, and says whether it had to kill.

Exit codes: 0 when every target was cancelled, had already ended or is unknown to Slurm; 2 when
a target's job is not that run's (nothing of it was cancelled) or a target is wrong; 1 when
Slurm failed, or a process of a local run still runs after SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from hpc_ddp.api.cancel import cancel_targets, default_kill_wait
from hpc_ddp.api.targets import runs_dir_of
from hpc_ddp.rundir.layout import RUNS_DIR_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "targets",
        nargs="+",
        help="run directories, sweep directories (every array), sweep task directories "
        "(SWEEP_DIR/tasks/N), job ids or array tasks (1234_5)",
    )
    parser.add_argument("--runs-dir", help=f"where to look for job ids (default ${RUNS_DIR_ENV})")
    kill_wait = default_kill_wait()
    parser.add_argument(
        "--kill-wait",
        type=_seconds,
        default=kill_wait,
        metavar="S",
        help="local runs: seconds from the SIGTERM to the SIGKILL of whatever still runs "
        f"(default {kill_wait:g}, as Slurm's KillWait)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (docs/json.md) once every target is done: its results, "
        "one per target, each with its outcome (cancelled, already_finished, unknown or "
        "not_this_run)",
    )


def run(args: argparse.Namespace) -> int:
    """Cancel every target (:func:`hpc_ddp.api.cancel.cancel_targets`) and say what each
    came to, as it is done.

    Exit 0 when every target was cancelled, had already ended or is unknown to Slurm; 2 when
    a target's job is not that run's (nothing of that target was signalled); 1 when a local
    run's process survived SIGKILL.
    """
    from hpc_ddp.output import CANCEL, document

    runs_dir = runs_dir_of(args.runs_dir)
    refused = survived = False
    shown = []
    results = cancel_targets(
        args.targets, runs_dir=runs_dir, backends=args.backends, kill_wait_s=args.kill_wait
    )
    for result in results:
        refused |= result.outcome == "not_this_run"
        survived |= result.outcome == "still_running"
        shown.append(result.to_dict())
        if not args.json:
            bad = result.outcome in ("not_this_run", "still_running")
            print(result.message, file=sys.stderr if bad else sys.stdout, flush=True)
    if args.json:  # one object once every target is done, as every verb's --json
        print(json.dumps(document(CANCEL, {"results": shown})))
    return 2 if refused else 1 if survived else 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number of seconds")
    return value
