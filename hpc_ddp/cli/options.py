"""Command-line options that several verbs share, worded once."""

from __future__ import annotations

import argparse


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """``--backend auto|slurm|local`` (the catalog's backends): where the job's processes run."""
    from hpc_ddp.backends.catalog import backend_names

    parser.add_argument(
        "--backend",
        choices=["auto", *backend_names()],
        default="auto",
        help="auto: Slurm when sbatch is on PATH, else local processes (default)",
    )


def add_site_option(parser: argparse.ArgumentParser) -> None:
    """``--site FILE``: the site profile applied under the job file."""
    parser.add_argument(
        "--site",
        help="site profile YAML (default $HPC_DDP_SITE, else $XDG_CONFIG_HOME/hpc-ddp/site.yaml)",
    )
