"""``hpc-ddp doctor [CONFIG] [KEY=VALUE ...] [--nodes N]``: check an allocation before training.

A short job on the resources a job would get (its partition, account, GPUs, tasks per node,
modules, setup lines and container: from CONFIG, your site profile and the overrides, else the
built-in defaults) in which every task reports what it would really run with and the nodes
test each other: the master port, the clock, the run directory's file system and the
all-reduce bandwidth (:mod:`hpc_ddp.doctor.exam` on the tasks, :mod:`hpc_ddp.doctor.judgement`
judging). It prints one table (node, rank, check, value, verdict), the notes behind each verdict
and a line that names the slow or broken node.

The doctor job is CONFIG's job with its training replaced by the checks, a time limit of at
most :data:`DOCTOR_TIME_S` and no requeue, launched like ``submit`` launches (prepare, launch,
wait) into ``RUNS_DIR/doctor/doctor-<name>-<stamp>`` (``status`` does not list it; its logs stay
there). Without Slurm the same checks run in N local processes.

Exit codes: 0 every check passed, 1 a check failed or was slow (or the job did not finish),
2 a usage or config error.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpc_ddp.api.doctor import DEFAULT_TIMEOUT_S, findings_text, finish_doctor, start_doctor
from hpc_ddp.cli.options import add_backend_option, add_site_option
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "config",
        nargs="?",
        help="job config whose resources to check (default: the built-in defaults and your "
        "site profile)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="e.g. slurm.partition=gpu"
    )
    parser.add_argument("--nodes", type=int, help="nodes to check (default: the config's)")
    add_backend_option(parser)
    add_site_option(parser)
    parser.add_argument(
        "--runs-dir", help=f"runs directory; the doctor writes under its doctor/ (${RUNS_DIR_ENV})"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds any one check may wait for the other ranks (default {DEFAULT_TIMEOUT_S})",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")


def run(args: argparse.Namespace) -> int:
    """Run the doctor job, print its findings; 0 when every check passed."""
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes} is not a node count. HINT: use 1 or more.")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout:g} is not positive. HINT: e.g. --timeout 60.")
    started = start_doctor(
        args.config,
        args.overrides,
        nodes=args.nodes,
        timeout_s=args.timeout,
        backend=args.backend,
        site=args.site,
        runs_dir=args.runs_dir,
        backends=args.backends,
        invocation=["hpc-ddp", "doctor", *sys.argv[2:]],
    )
    launched, slurm = started.launched, started.cfg.slurm
    print(
        f"doctor: {launched.prepared.backend} job {launched.job_id}, {slurm.ntasks} rank(s) on "
        f"{slurm.nodes} node(s); run dir {launched.paths.root}",
        file=sys.stderr,
    )
    result = finish_doctor(started)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(findings_text(result.findings))
        print(result.summary)
    return 0 if result.ok else 1
