"""A real two-node Slurm cluster on this machine, for trying hpc-ddp and for its tests.

``up`` installs Debian's Slurm and munge when they are missing, writes every file into one state
directory it owns, starts munged, slurmctld and one slurmd per node (``n1``, ``n2``, both on
loopback), and waits until both nodes are idle. ``down`` stops only the daemons whose pid files
it wrote and removes the line it added to ``/etc/hosts``. Both are idempotent.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.devcluster.conf import (
    NODE_NAMES,
    ClusterLayout,
    add_hosts_entry,
    parse_sinfo_states,
    remove_hosts_entry,
    render_slurm_conf,
)
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import DevClusterError
from hpc_ddp.layout import DEV_CLUSTER_DIR_ENV

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/var/lib/hpc-ddp/dev-cluster")
STATE_DIR_ENV = DEV_CLUSTER_DIR_ENV
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
REQUIRED_COMMANDS = ("slurmctld", "slurmd", "sbatch", "munged")
HOSTS_FILE = Path("/etc/hosts")


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did: where the config is, whether it started anything, how long it took."""

    conf: Path
    started: tuple[str, ...]
    seconds: float


def state_dir_from(env: Mapping[str, str], explicit: str | None = None) -> Path:
    """The state directory: an explicit path, else ``$HPC_DDP_DEV_CLUSTER_DIR``, else default."""
    return Path(explicit or env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def layout_for(state_dir: Path) -> ClusterLayout:
    """The layout of the dev cluster in ``state_dir`` on this host."""
    # slurmctld insists that SlurmctldHost is the short hostname of the machine it runs on.
    return ClusterLayout(state_dir=state_dir, hostname=socket.gethostname().split(".")[0])


def slurm_env(layout: ClusterLayout) -> dict[str, str]:
    """The environment Slurm clients need to talk to this cluster."""
    return {**os.environ, "SLURM_CONF": str(layout.conf)}


def pid_alive(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process runs (and is not a zombie), else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return None
    # The state is the field after the parenthesised command name; Z is a zombie.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return None if state in ("Z", "X") else pid


def ensure_installed(env: Mapping[str, str]) -> bool:
    """Install Slurm and munge with apt-get when a command is missing; True if it installed."""
    if all(shutil.which(cmd, path=env.get("PATH")) for cmd in REQUIRED_COMMANDS):
        return False
    if os.geteuid() != 0:
        raise DevClusterError(
            "Slurm is not installed and installing it needs root. "
            f"HINT: run `sudo apt-get install {' '.join(PACKAGES)}`, then `hpc-ddp dev-cluster up`."
        )
    if not shutil.which("apt-get"):
        raise DevClusterError(
            "Slurm is not installed and there is no apt-get. "
            "HINT: the dev cluster supports Debian and Ubuntu; elsewhere install Slurm yourself."
        )
    apt_env = {**env, "DEBIAN_FRONTEND": "noninteractive"}
    # Only the package lists are refreshed; the machine's policy-rc.d (if any) is left as it is,
    # so the packages' own services are not started: we start our own daemons below.
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(argv, env=apt_env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DevClusterError(
                f"`{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr.strip()}\n"
                "HINT: check the package mirror and retry."
            )
    return True


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    write_text_atomic(path, text)
    return True


def _edit_hosts(edit: str) -> None:
    text = HOSTS_FILE.read_text()
    new = add_hosts_entry(text) if edit == "add" else remove_hosts_entry(text)
    if new != text:
        # /etc/hosts is often a bind mount: rewrite it in place, never rename over it.
        with HOSTS_FILE.open("r+") as f:
            f.seek(0)
            f.write(new)
            f.truncate()


def _prepare_dirs(layout: ClusterLayout) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    layout.state_dir.chmod(0o755)
    # munged refuses a socket directory that others cannot reach ("Socket is inaccessible").
    layout.munge_dir.mkdir(exist_ok=True)
    layout.munge_dir.chmod(0o755)
    (layout.ctld_dir / "state").mkdir(parents=True, exist_ok=True)
    for node in NODE_NAMES:
        (layout.node_dir(node) / "spool").mkdir(parents=True, exist_ok=True)
    if not layout.munge_key.exists():
        layout.munge_key.write_bytes(secrets.token_bytes(1024))
    layout.munge_key.chmod(0o400)


def _start(name: str, argv: list[str], pid_file: Path, env: Mapping[str, str]) -> None:
    done = subprocess.run(
        argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    deadline = time.monotonic() + 10
    while pid_alive(pid_file) is None:
        if done.returncode != 0 or time.monotonic() > deadline:
            raise DevClusterError(
                f"{name} did not start (`{' '.join(argv)}` exited {done.returncode}):\n"
                f"{done.stderr.strip()}\nHINT: see the logs under {pid_file.parent}."
            )
        time.sleep(0.05)


def _daemon_argv(layout: ClusterLayout) -> dict[str, list[str]]:
    m = layout.munge_dir
    argvs = {
        "munged": [
            "munged",
            "--force",
            f"--key-file={layout.munge_key}",
            f"--socket={layout.munge_socket}",
            f"--pid-file={layout.munge_pid}",
            f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}",
        ],
        "slurmctld": ["slurmctld", "-f", str(layout.conf)],
    }
    for node in NODE_NAMES:
        argvs[f"slurmd-{node}"] = ["slurmd", "-f", str(layout.conf), "-N", node]
    return argvs


def wait_idle(layout: ClusterLayout, timeout_s: float = 60.0) -> None:
    """Wait until every node reports idle (or mixed/allocated: it runs jobs, so it is up)."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    env = slurm_env(layout)
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        states = parse_sinfo_states(done.stdout)
        if all(states.get(n, "").rstrip("*~#") in ("idle", "mix", "alloc") for n in NODE_NAMES):
            return
        time.sleep(0.2)
    raise DevClusterError(
        f"nodes did not become idle within {timeout_s:.0f} s: {states or 'no answer from sinfo'}. "
        f"HINT: see {layout.ctld_dir / 'slurmctld.log'} and "
        f"{layout.state_dir / 'nodes'}/*/slurmd.log."
    )


def up(state_dir: Path, env: Mapping[str, str]) -> UpResult:
    """Bring the dev cluster up (idempotent) and return where its ``slurm.conf`` is."""
    t0 = time.monotonic()
    ensure_installed(env)
    layout = layout_for(state_dir)
    _prepare_dirs(layout)
    conf_changed = _write_if_changed(layout.conf, render_slurm_conf(layout))
    _edit_hosts("add")
    pid_files = layout.pid_files()
    if conf_changed:
        # A daemon running with an old config would disagree with its peers: restart them all.
        _stop_daemons(layout, names=[n for n in pid_files if n != "munged"])
    started = []
    for name, argv in _daemon_argv(layout).items():
        if pid_alive(pid_files[name]) is None:
            _start(name, argv, pid_files[name], env)
            started.append(name)
    wait_idle(layout)
    return UpResult(conf=layout.conf, started=tuple(started), seconds=time.monotonic() - t0)


def _stop_daemons(layout: ClusterLayout, names: list[str], timeout_s: float = 15.0) -> list[str]:
    stopped = []
    pid_files = layout.pid_files()
    for name in names:
        pid = pid_alive(pid_files[name])
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid_files[name]) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid_files[name]) == pid:
            os.kill(pid, signal.SIGKILL)
        stopped.append(name)
    return stopped


def _cancel_all_jobs(layout: ClusterLayout) -> None:
    env = slurm_env(layout)
    done = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, check=False
    )
    jobs = done.stdout.split()
    if done.returncode != 0 or not jobs:
        return
    subprocess.run(["scancel", *jobs], env=env, capture_output=True, check=False)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = subprocess.run(
            ["squeue", "-h", "-t", "R,CG", "-o", "%i"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if left.returncode != 0 or not left.stdout.split():
            return
        time.sleep(0.2)


def down(state_dir: Path, *, purge: bool = False) -> list[str]:
    """Stop the daemons this cluster started and undo its ``/etc/hosts`` line.

    Running jobs are cancelled first so no ``slurmstepd`` outlives its daemons. With ``purge``
    the state directory is removed too. Returns the names of the daemons it stopped.
    """
    layout = layout_for(state_dir)
    if pid_alive(layout.ctld_pid) is not None:
        _cancel_all_jobs(layout)
    order = [f"slurmd-{n}" for n in NODE_NAMES] + ["slurmctld", "munged"]
    stopped = _stop_daemons(layout, order)
    if HOSTS_FILE.exists():
        _edit_hosts("remove")
    if purge and layout.state_dir.exists():
        shutil.rmtree(layout.state_dir)
    return stopped


def status(state_dir: Path) -> tuple[dict[str, int | None], str]:
    """Each daemon's pid (None when not running) and ``sinfo``'s view of the cluster."""
    layout = layout_for(state_dir)
    pids = {name: pid_alive(path) for name, path in layout.pid_files().items()}
    if pids["slurmctld"] is None:
        return pids, "slurmctld is not running"
    done = subprocess.run(
        ["sinfo"], env=slurm_env(layout), capture_output=True, text=True, check=False
    )
    return pids, (done.stdout or done.stderr).rstrip()
