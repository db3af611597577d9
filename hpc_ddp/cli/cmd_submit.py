"""``hpc-ddp submit CONFIG [KEY=VALUE ...]``: validate, render, write the run dir, submit.

What :func:`hpc_ddp.submit` does, planned and launched in two steps (the plan is what
``--dry-run`` shows); this verb prints it, and with ``--wait`` follows the run.

Exit codes: 0 submitted (or dry run shown), 2 usage or config error, 1 failed submission.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpc_ddp.api.job import launch, plan_submit, sbatch_test_only
from hpc_ddp.cli.options import add_backend_option, add_site_option
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV
from hpc_ddp.submission.submit import Prepared, report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("config", nargs="?", help="job config YAML (see jobs/)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.lr=0.05"
    )
    add_backend_option(parser)
    add_site_option(parser)
    parser.add_argument(
        "--runs-dir",
        help=f"where run directories are created (default ${RUNS_DIR_ENV} or ./runs)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the script and command only")
    mode.add_argument(
        "--test-only", action="store_true", help="ask Slurm (sbatch --test-only) if it can run"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--wait", action="store_true", help="wait until the job has finished")


def needs_slurm(args: argparse.Namespace) -> bool:
    """A dry run asks Slurm nothing (its plan is pure): :func:`hpc_ddp.cli.main.main` then
    builds no Slurm client (``args.slurm`` is None)."""
    return not args.dry_run


def run(args: argparse.Namespace) -> int:
    """Submit (or show) one job: :func:`hpc_ddp.api.job.plan_submit`, then
    :func:`~hpc_ddp.api.job.launch` (what ``hpc_ddp.submit()`` does), printed."""
    if not args.config:
        raise ConfigError(
            "submit needs a job config. HINT: `hpc-ddp submit jobs/x.yaml`; to go on with a "
            "stopped run, `hpc-ddp resume RUN_DIR`."
        )
    client = args.slurm
    prepared = plan_submit(
        args.config,
        args.overrides,
        backend=args.backend,
        runs_dir=args.runs_dir,
        site=args.site,
        slurm=client,
        invocation=["hpc-ddp", "submit", *sys.argv[2:]]
        if sys.argv[1:2] == ["submit"]
        else ["hpc-ddp", "submit", args.config, *args.overrides],
        for_test_only=args.test_only,
    )
    if args.dry_run:
        return _show_dry_run(prepared, args.json)
    if args.test_only:
        print(sbatch_test_only(prepared, slurm=client))
        return 0
    launched = launch(prepared, slurm=client).launched
    assert launched is not None  # started here
    report(launched, args.json)
    if not args.wait:
        return 0
    from hpc_ddp.submission.wait import wait_for  # the run's state: not needed to submit it

    return wait_for(launched, client)


def _show_dry_run(prepared: Prepared, as_json: bool) -> int:
    """The backend's plan (:class:`~hpc_ddp.backends.base.LaunchPlan`): the script it would
    write, if any, and the command it would run, else its plan in words."""
    plan = prepared.plan
    if as_json:
        from hpc_ddp.output import SUBMIT

        shown: dict[str, object] = {
            "schema": SUBMIT,
            "dry_run": True,
            "backend": prepared.backend,
            "run_dir": str(prepared.paths.root),
            "command": list(plan.command),
        }
        if plan.script is None:  # nothing rendered: the plan in words
            shown["plan"] = plan.summary.removeprefix("# ")
        else:
            shown["script"] = plan.script
        print(json.dumps(shown))
        return 0
    print(plan.script or "", end="")
    print(plan.summary)
    print(f"# run directory: {prepared.paths.root}")
    return 0
