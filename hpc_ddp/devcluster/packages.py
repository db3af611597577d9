"""Debian packages the dev cluster and its container image need, installed when missing.

Only ``apt-get`` is used, and only when a command is missing, so a machine that has them pays
nothing. The packages' own services must not start (we start our own daemons, with our own
files): where the machine has no ``/usr/sbin/policy-rc.d``, one that forbids starting services is
put there for the install and removed after; an existing one is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.errors import DevClusterError

POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
_DENY_ALL = (
    "#!/bin/sh\n# Written by hpc-ddp dev-cluster for one apt-get install; removed after.\n"
    "exit 101\n"
)


@dataclass(frozen=True)
class Need:
    """Debian packages that provide some commands."""

    packages: tuple[str, ...]
    commands: tuple[str, ...]


SLURM = Need(
    ("slurmctld", "slurmd", "slurm-client", "munge"), ("slurmctld", "slurmd", "sbatch", "munged")
)
ACCOUNTING = Need(("slurmdbd", "mariadb-server"), ("slurmdbd", "mariadbd", "mariadb-install-db"))
CHARLIECLOUD = Need(("charliecloud-runtime",), ("ch-run",))
DEBOOTSTRAP = Need(("debootstrap",), ("debootstrap",))

_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def missing(needs: Sequence[Need], env: Mapping[str, str]) -> list[str]:
    """The packages of ``needs`` one of whose commands is not on PATH (or in the sbin dirs)."""
    path = f"{env.get('PATH', '')}:{_SBIN}"
    return [
        pkg
        for need in needs
        if not all(shutil.which(cmd, path=path) for cmd in need.commands)
        for pkg in need.packages
    ]


def ensure(needs: Sequence[Need], env: Mapping[str, str]) -> list[str]:
    """Install the packages of ``needs`` whose commands are missing; return what it installed."""
    packages = missing(needs, env)
    if not packages:
        return []
    if os.geteuid() != 0:
        raise DevClusterError(
            f"{', '.join(packages)} not installed and installing needs root. "
            f"HINT: run `sudo apt-get install --no-install-recommends {' '.join(packages)}`, "
            "then try again."
        )
    if not shutil.which("apt-get", path=env.get("PATH")):
        raise DevClusterError(
            f"{', '.join(packages)} not installed and there is no apt-get. "
            "HINT: the dev cluster supports Debian and Ubuntu; elsewhere install them yourself."
        )
    apt_env = {**env, "DEBIAN_FRONTEND": "noninteractive"}
    wrote_policy = False
    if not POLICY_RC_D.exists():
        POLICY_RC_D.write_text(_DENY_ALL)
        POLICY_RC_D.chmod(0o755)
        wrote_policy = True
    try:
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        ):
            done = subprocess.run(argv, env=apt_env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise DevClusterError(
                    f"`{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr.strip()}\n"
                    "HINT: check the package mirror and retry."
                )
    finally:
        if wrote_policy and POLICY_RC_D.read_text() == _DENY_ALL:
            POLICY_RC_D.unlink()
    return packages
