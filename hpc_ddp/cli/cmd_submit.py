"""``hpc-ddp submit CONFIG [KEY=VALUE ...]``: validate, render, write the run dir, submit.

What :func:`hpc_ddp.submit` does, planned and launched in two steps (the plan is what
``--dry-run`` shows); this verb prints it, and with ``--wait`` follows the run.

Exit codes: 0 submitted (or dry run shown), 2 usage or config error, 1 failed submission.
"""

from __future__ import annotations

import argparse
import sys

from hpc_ddp.api.job import Job, dry_run_json, follow, launch, plan_submit, sbatch_test_only
from hpc_ddp.cli.options import add_backend_option, add_site_option
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV


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


def run(args: argparse.Namespace) -> int:
    """Submit (or show) one job: :func:`hpc_ddp.api.job.plan_submit`, then
    :func:`~hpc_ddp.api.job.launch` (what ``hpc_ddp.submit()`` does), printed."""
    if not args.config:
        raise ConfigError(
            "submit needs a job config. HINT: `hpc-ddp submit jobs/x.yaml`; to go on with a "
            "stopped run, `hpc-ddp resume RUN_DIR`."
        )
    prepared = plan_submit(
        args.config,
        args.overrides,
        backend=args.backend,
        runs_dir=args.runs_dir,
        site=args.site,
        backends=args.backends,
        invocation=["hpc-ddp", "submit", *sys.argv[2:]]
        if sys.argv[1:2] == ["submit"]
        else ["hpc-ddp", "submit", args.config, *args.overrides],
        for_test_only=args.test_only,
    )
    if args.dry_run:  # the backend's plan: the script and command, else its plan in words
        if args.json:
            import json  # only here: a dry run in text loads no JSON writer

            print(json.dumps(dry_run_json(prepared)))
            return 0
        print(prepared.plan.script or "", end="")
        print(prepared.plan.summary)
        for line in prepared.lemons.lines() if prepared.lemons is not None else ():
            print(f"# {line}")
        if prepared.lead is not None:
            print(f"# {prepared.lead.describe()}")
        if prepared.grace is not None:
            print(f"# warning: {prepared.grace}")
        print(f"# run directory: {prepared.paths.root}")
        return 0
    if args.test_only:
        print(sbatch_test_only(prepared, backends=args.backends))
        return 0
    job = launch(prepared, backends=args.backends)
    report(job, args.json)
    return follow(job) if args.wait else 0


def report(job: Job, as_json: bool) -> None:
    """Print the job id, the run directory and where its logs go (or one JSON object): what
    ``submit`` and ``resume`` say about the job they started."""
    launched = job.launched
    assert launched is not None  # started here
    paths, backend = launched.paths, launched.prepared.backend
    if as_json:
        import json

        from hpc_ddp.output import SUBMIT

        shown = {
            "schema": SUBMIT,
            "dry_run": False,
            "backend": backend,
            "job_id": launched.job_id,
            "run_dir": str(paths.root),
            "logs": str(paths.logs),
        }
        print(json.dumps(shown))
        return
    print(f"submitted {launched.prepared.cfg.name} as {backend} job {launched.job_id}")
    print(f"  run dir: {paths.root}")
    print(f"  logs:    {paths.logs}/ (rank-N.out, rank-N.err)")
    print(f"  watch:   hpc-ddp status {paths.root}")
