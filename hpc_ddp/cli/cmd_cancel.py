"""``hpc-ddp cancel RUN_DIR | JOB_ID ...``: cancel runs' Slurm jobs (local: stop the tasks)."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from hpc_ddp.cli.cmd_status import RUNS_DIR_ENV, resolve_targets
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir import read_manifest
from hpc_ddp.slurm_client import SlurmClient


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("targets", nargs="+", help="run directories or job ids")
    parser.add_argument("--runs-dir", help=f"where to look for job ids (default ${RUNS_DIR_ENV})")


def run(args: argparse.Namespace) -> int:
    """Cancel every target; a cancelled job is never requeued by hpc-ddp."""
    runs_dir = Path(args.runs_dir or os.environ.get(RUNS_DIR_ENV) or "runs")
    client = SlurmClient()
    for run_dir in resolve_targets(args.targets, runs_dir):
        manifest = read_manifest(run_dir)
        if not manifest.job_id:
            raise RunDirError(f"{run_dir}: the manifest has no job id; nothing to cancel.")
        if manifest.backend == "local":
            # submitit's local controller forwards the signal to its task processes.
            try:
                os.kill(int(manifest.job_id), signal.SIGTERM)
            except ProcessLookupError:
                print(f"{run_dir}: local job {manifest.job_id} already ended")
                continue
        else:
            client.cancel(manifest.job_id)
        print(f"cancelled {manifest.backend} job {manifest.job_id} ({run_dir})")
    return 0
