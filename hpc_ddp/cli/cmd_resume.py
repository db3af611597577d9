"""``hpc-ddp resume RUN_DIR [KEY=VALUE ...]``: submit a run's job again, in its run directory,
to go on from its newest good checkpoint.

For a run that crashed, was cancelled, ran out of requeues, failed to requeue or was lost with
its node. A run still queued or running is refused (two jobs must never share a run
directory); a finished one, or one whose state Slurm could not confirm, needs ``--force``.
Overrides apply over the run's resolved config, e.g. ``requeue.max_requeues=10`` or, with
``--force`` on a finished run, ``train.epochs=20`` to train further.

Exit codes: 0 resubmitted (or dry run shown), 2 refused or bad input, 1 failed submission
(with ``--wait``: the run did not finish).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpc_ddp.cli.resuming import ResumeRequest, resume_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory to go on with")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="over the run's resolved config"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="resume a finished run too, or one whose state Slurm could not confirm",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the script and command only")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--wait", action="store_true", help="wait until the job has finished")


def run(args: argparse.Namespace) -> int:
    """Resume one run."""
    request = ResumeRequest(
        Path(args.run_dir),
        tuple(args.overrides),
        force=args.force,
        dry_run=args.dry_run,
        wait=args.wait,
        as_json=args.json,
    )
    return resume_run(request, args.slurm)
