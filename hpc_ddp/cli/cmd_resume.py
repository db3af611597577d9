"""``hpc-ddp resume RUN_DIR [KEY=VALUE ...]``: submit a run's job again, in its run directory,
to go on from its newest good checkpoint.

For a run that crashed, was cancelled, ran out of requeues, failed to requeue or was lost with
its node. A run still queued or running is refused (two jobs must never share a run
directory); a finished one, or one whose state Slurm could not confirm, needs ``--force``.
Overrides apply over the run's resolved config, e.g. ``requeue.max_requeues=10`` or, with
``--force`` on a finished run, ``train.epochs=20`` to train further.

The world size (``slurm.nodes x slurm.tasks_per_node``) stays the one the run trained at;
``--elastic`` lets it change (``hpc-ddp resume RUN slurm.nodes=1 --elastic``): the global batch
is kept by rescaling ``train.grad_accum``, the rest of the interrupted epoch is dealt out over
the new ranks, and the ``changed:`` lines say it is sample-exact, not bit-exact.

Of several ``resume`` of one run at once, exactly one submits: the decision and the record
are taken under the run directory's record lock, and every other one then finds that job and
submits nothing.

Exit codes: 0 resubmitted (or dry run shown), 2 refused or bad input (also when another
submission got there first: the message names its job), 1 failed submission (with ``--wait``:
the run did not finish).
"""

from __future__ import annotations

import argparse
import json
import sys

from hpc_ddp.api.job import dry_run_json, follow, launch, plan_resume
from hpc_ddp.cli.cmd_submit import report


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
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="go on at another world size (slurm.nodes, slurm.tasks_per_node) with the same "
        "global batch: train.grad_accum is rescaled; sample-exact, not bit-exact",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the script and command only")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--wait", action="store_true", help="wait until the job has finished")


def run(args: argparse.Namespace) -> int:
    """Resume one run."""
    flags = ["--elastic"] if args.elastic else []
    plan = plan_resume(
        args.run_dir,
        args.overrides,
        force=args.force,
        elastic=args.elastic,
        backends=args.backends,
        invocation=["hpc-ddp", "resume", args.run_dir, *args.overrides, *flags],
    )
    say = sys.stderr if args.json else sys.stdout
    print(
        f"resuming {plan.run_dir} ({plan.state}, {plan.attempts} attempt(s)) {plan.start_words()}",
        file=say,
    )
    for line in plan.changes:
        print(f"  changed: {line}", file=say)
    if plan.skipped:
        print(f"  skipped: {plan.skipped}", file=say)
    prepared = plan.prepared
    if args.dry_run and args.json:  # and where the run stands
        print(json.dumps(dry_run_json(plan)))
        return 0
    if args.dry_run:
        print(prepared.plan.script or "", end="")
        print(prepared.plan.summary)
        for line in prepared.lemons.lines() if prepared.lemons is not None else ():
            print(f"# {line}")
        return 0
    job = launch(plan, backends=args.backends)
    report(job, args.json)
    return follow(job) if args.wait else 0
