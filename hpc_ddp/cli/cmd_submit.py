"""``hpc-ddp submit CONFIG [KEY=VALUE ...]``: validate, render, write the run dir, submit.

Exit codes: 0 submitted (or dry run shown), 2 usage or config error, 1 failed submission.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hpc_ddp.config.load import find_site_profile, load_job_config
from hpc_ddp.config.preflight import preflight_job
from hpc_ddp.errors import ConfigError
from hpc_ddp.launch.submission import (
    Prepared,
    choose_backend,
    describe_local_plan,
    launch,
    prepare,
    report,
    runs_dir_from,
    test_only,
)
from hpc_ddp.launch.wait import wait_for
from hpc_ddp.layout import RUNS_DIR_ENV


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


def _sbatch_on_path() -> str | None:
    import shutil  # not at the top: shutil loads the compression modules, ~3 ms of every submit

    return shutil.which("sbatch")


def run(args: argparse.Namespace) -> int:
    """Submit (or show) one job."""
    if not args.config:
        raise ConfigError(
            "submit needs a job config. HINT: `hpc-ddp submit jobs/x.yaml`; to go on with a "
            "stopped run, `hpc-ddp resume RUN_DIR`."
        )
    config_path = Path(args.config)
    site = find_site_profile(args.site, os.environ, Path.home())
    cfg = load_job_config(config_path, args.overrides, site_profile=site)
    preflight_job(cfg, str(config_path))  # what would fail on the nodes, checked from here
    backend = choose_backend(args.backend, _sbatch_on_path() if args.backend == "auto" else None)
    if backend == "local" and args.test_only:
        raise ConfigError("--test-only asks Slurm; HINT: use --backend slurm on a Slurm cluster.")
    client = args.slurm
    prepared = prepare(
        cfg,
        backend=backend,
        config_path=config_path,
        runs_dir=runs_dir_from(args.runs_dir, os.environ),
        python=sys.executable,
        invocation=["hpc-ddp", "submit", *sys.argv[2:]]
        if sys.argv[1:2] == ["submit"]
        else ["hpc-ddp", "submit", args.config, *args.overrides],
        client=client,
    )
    if args.dry_run:
        return _show_dry_run(prepared, args.json)
    if args.test_only:
        print(test_only(prepared, client))
        return 0
    launched = launch(prepared, client)
    report(launched, args.json)
    return wait_for(launched, client) if args.wait else 0


def _show_dry_run(prepared: Prepared, as_json: bool) -> int:
    backend = prepared.backend
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
        print(prepared.script or "", end="")
        print(f"# backend: {backend}; would run: {' '.join(prepared.sbatch_argv)}")
        print(f"# run directory: {prepared.paths.root}")
    return 0
