"""``hpc-ddp run RUN_DIR``: the on-node entry point the rendered script starts with srun."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("run_dir", help="the run (or sweep) directory written by submit")


def run(args: argparse.Namespace) -> int:
    """Run this task's share of the job."""
    from hpc_ddp.job.task import run_job

    return run_job(Path(args.run_dir), os.environ)
