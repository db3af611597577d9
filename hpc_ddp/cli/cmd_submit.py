"""``hpc-ddp submit CONFIG [KEY=VALUE ...]``: validate, render, write the run dir, submit.

Exit codes: 0 submitted (or dry run shown), 2 usage or config error, 1 failed submission.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hpc_ddp.cli.launching import check_local_job, describe_local_plan, report, submit_local
from hpc_ddp.config.load import find_site_profile, load_job_config
from hpc_ddp.config.preflight import preflight_job
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir import RUNS_DIR_ENV
from hpc_ddp.runsdir import runs_dir_from
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.submission import Prepared, materialize, prepare, schedule_slurm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("config", nargs="?", help="job config YAML (see jobs/)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.lr=0.05"
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "slurm", "local"],
        default="auto",
        help="auto: Slurm when sbatch is on PATH, else local processes (default)",
    )
    parser.add_argument(
        "--site",
        help="site profile YAML (default $HPC_DDP_SITE, else $XDG_CONFIG_HOME/hpc-ddp/site.yaml)",
    )
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
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="instead of CONFIG: submit RUN_DIR's job again (same as `hpc-ddp resume RUN_DIR`)",
    )
    parser.add_argument(
        "--force", action="store_true", help="with --resume: also a finished or unconfirmed run"
    )


def choose_backend(requested: str, sbatch_path: str | None) -> str:
    """``auto`` means Slurm when ``sbatch`` is on PATH, else the local backend."""
    if requested != "auto":
        return requested
    return "slurm" if sbatch_path else "local"


def _sbatch_on_path() -> str | None:
    import shutil  # not at the top: shutil loads the compression modules, ~3 ms of every submit

    return shutil.which("sbatch")


def run(args: argparse.Namespace) -> int:
    """Submit (or show) one job."""
    if args.resume:
        return _resume(args)
    if not args.config:
        raise ConfigError("submit needs a job config. HINT: `hpc-ddp submit jobs/x.yaml`.")
    config_path = Path(args.config)
    site = find_site_profile(args.site, os.environ, Path.home())
    cfg = load_job_config(config_path, args.overrides, site_profile=site)
    preflight_job(cfg, str(config_path))  # what would fail on the nodes, checked from here
    backend = choose_backend(args.backend, _sbatch_on_path() if args.backend == "auto" else None)
    if backend == "local" and args.test_only:
        raise ConfigError("--test-only asks Slurm; HINT: use --backend slurm on a Slurm cluster.")
    if backend == "local":
        check_local_job(cfg)  # a dry run says so too, rather than show a job that cannot start
    client = args.slurm
    runs_dir = runs_dir_from(args.runs_dir, os.environ)
    prepared = prepare(
        cfg,
        config_path=config_path,
        runs_dir=runs_dir,
        python=sys.executable,
        invocation=["hpc-ddp", "submit", *sys.argv[2:]]
        if sys.argv[1:2] == ["submit"]
        else ["hpc-ddp", "submit", args.config, *args.overrides],
        client=client,
    )
    if args.dry_run:
        return _show_dry_run(prepared, backend, args.json)
    if args.test_only:
        return _test_only(prepared, client)
    if backend == "local":
        return submit_local(prepared, wait=args.wait, as_json=args.json)
    prepared = materialize(prepared)  # the directory it really got (another submit may race)
    manifest = schedule_slurm(prepared, client)
    report(prepared, "slurm", manifest.job_id, args.json)
    if args.wait:
        from hpc_ddp.cli.waiting import wait_for_jobs

        return wait_for_jobs(client, [manifest.job_id or ""], run_dirs=[prepared.paths.root])
    return 0


def _resume(args: argparse.Namespace) -> int:
    # Imported here: it pulls in the status machinery, which a plain submit never needs.
    from hpc_ddp.cli.resuming import ResumeRequest, resume_run

    # argparse gives the first KEY=VALUE to the CONFIG positional when --resume replaces it.
    overrides = [*([args.config] if args.config else []), *args.overrides]
    if args.config and "=" not in args.config:
        raise ConfigError(
            f"give a job config or --resume RUN_DIR, not both ({args.config!r}). HINT: overrides "
            "after --resume apply over the run's resolved config: KEY=VALUE."
        )
    if args.test_only or args.backend != "auto":
        raise ConfigError("--resume keeps the run's backend and cannot --test-only.")
    request = ResumeRequest(
        Path(args.resume),
        tuple(overrides),
        force=args.force,
        dry_run=args.dry_run,
        wait=args.wait,
        as_json=args.json,
    )
    return resume_run(request, args.slurm)


def _show_dry_run(prepared: Prepared, backend: str, as_json: bool) -> int:
    local = backend == "local"
    if as_json:
        shown: dict[str, object] = {"backend": backend, "run_dir": str(prepared.paths.root)}
        if local:  # no sbatch runs: submitit's controller starts the processes
            folder = str(prepared.paths.root / "submitit")
            shown["command"] = [sys.executable, "-m", "submitit.local._local", folder]
            shown["plan"] = describe_local_plan(prepared.cfg, prepared.paths.root)[2:]
        else:
            shown.update(command=list(prepared.sbatch_argv), script=prepared.script)
        print(json.dumps(shown))
    elif local:
        print(describe_local_plan(prepared.cfg, prepared.paths.root))
        print(f"# run directory: {prepared.paths.root}")
    else:
        print(prepared.script, end="")
        print(f"# backend: {backend}; would run: {' '.join(prepared.sbatch_argv)}")
        print(f"# run directory: {prepared.paths.root}")
    return 0


def _test_only(prepared: Prepared, client: SlurmClient) -> int:
    prepared = materialize(prepared)
    try:
        message = client.submit(prepared.paths.script, test_only=True).message
    finally:
        import shutil

        shutil.rmtree(prepared.paths.root, ignore_errors=True)
    print(message)
    return 0
