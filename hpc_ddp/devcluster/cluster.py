"""A real Slurm cluster on this machine, for trying hpc-ddp and for its tests.

``up`` installs Debian's Slurm and munge (and, with accounting, MariaDB and slurmdbd) when they are
missing, writes every file into one state directory it owns, starts munged, the accounting
daemons, slurmctld and one slurmd per node (``n1`` .. ``nN``, all on loopback), and waits until
every node is idle. ``down`` stops only the daemons whose pid files it wrote and takes its names
out of the ``/etc/hosts`` line. Both are idempotent.

Several clusters can run at once, each in its own state directory: its slot (saved with the rest
of its :class:`~hpc_ddp.devcluster.conf.ClusterSpec` in ``cluster.json``) gives it its own ports
and job ids. :func:`kill_node` and :func:`revive_node` take one node away and bring it back, as a
node failure would; :func:`forget_jobs` restarts the controller without its state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.devcluster import packages
from hpc_ddp.devcluster.conf import (
    GPU_DEVICE_MAJOR,
    LEGACY_OWNER,
    ClusterLayout,
    ClusterSpec,
    hosts_owners,
    parse_sinfo_states,
    pick_slot,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
    render_slurmdbd_conf,
    slot_for,
)
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import DevClusterError
from hpc_ddp.rundir.layout import DEV_CLUSTER_DIR_ENV

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/var/lib/hpc-ddp/dev-cluster")
STATE_DIR_ENV = DEV_CLUSTER_DIR_ENV
HOSTS_FILE = Path("/etc/hosts")
SLOTS_LOCK = Path("/run/lock/hpc-ddp-dev-cluster-slots.lock")
"""Held while a cluster picks a free slot and comes up on it (:func:`up_on_free_slot`)."""
_DB_DAEMONS = ("mariadbd", "slurmdbd")


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did: where the config is, what it started or installed, how long it took."""

    conf: Path
    started: tuple[str, ...]
    seconds: float
    installed: tuple[str, ...] = ()


def state_dir_from(env: Mapping[str, str], explicit: str | None = None) -> Path:
    """The state directory: an explicit path, else ``$HPC_DDP_DEV_CLUSTER_DIR``, else default."""
    return Path(explicit or env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def _hostname() -> str:
    # slurmctld insists that SlurmctldHost is the short hostname of the machine it runs on.
    return socket.gethostname().split(".")[0]


def saved_spec(state_dir: Path) -> ClusterSpec | None:
    """The spec the cluster in ``state_dir`` was last brought up with, if any."""
    path = ClusterLayout(state_dir=state_dir, hostname="").spec_file
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return ClusterSpec.from_json(text, str(path))


def resolve_spec(
    state_dir: Path,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    accounting: bool | None = None,
    slurmd_timeout_s: int | None = None,
    slot: int | None = None,
    cred_expire_s: int | None = None,
) -> ClusterSpec:
    """The spec ``up`` uses: the saved one (else the defaults, with the slot of ``state_dir``),
    with every argument that is not None instead of what it had."""
    base = saved_spec(state_dir) or ClusterSpec(slot=slot_for(state_dir, DEFAULT_STATE_DIR))
    return ClusterSpec(
        nodes=base.nodes if nodes is None else nodes,
        gpus_per_node=base.gpus_per_node if gpus_per_node is None else gpus_per_node,
        accounting=base.accounting if accounting is None else accounting,
        slurmd_timeout_s=base.slurmd_timeout_s if slurmd_timeout_s is None else slurmd_timeout_s,
        slot=base.slot if slot is None else slot,
        cred_expire_s=base.cred_expire_s if cred_expire_s is None else cred_expire_s,
    )


def layout_for(state_dir: Path, spec: ClusterSpec | None = None) -> ClusterLayout:
    """The layout of the dev cluster in ``state_dir`` on this host (its saved spec by default)."""
    return ClusterLayout(
        state_dir=state_dir, hostname=_hostname(), spec=spec or resolve_spec(state_dir)
    )


def slurm_env(layout: ClusterLayout) -> dict[str, str]:
    """The environment Slurm clients need to talk to this cluster."""
    return {**os.environ, "SLURM_CONF": str(layout.conf)}


def pid_alive(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process runs (and is not a zombie), else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _running(pid) else None


def _running(pid: int) -> bool:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state is the field after the parenthesised command name; Z is a zombie.
    return stat_line.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _needs(spec: ClusterSpec) -> list[packages.Need]:
    return [packages.SLURM, *([packages.ACCOUNTING] if spec.accounting else [])]


def ensure_installed(env: Mapping[str, str], spec: ClusterSpec | None = None) -> bool:
    """Install Slurm and munge (and the accounting packages, for a spec with accounting) with
    apt-get when a command is missing; True if it installed anything."""
    return bool(packages.ensure(_needs(spec or ClusterSpec()), env))


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    write_text_atomic(path, text)
    path.chmod(mode)
    return True


def _write_configs(layout: ClusterLayout) -> bool:
    """Write every config file of the cluster; True if a daemon's config changed."""
    changed = _write_if_changed(layout.conf, render_slurm_conf(layout))
    changed |= _write_if_changed(layout.gres_conf, render_gres_conf(layout))
    if layout.spec.accounting:
        # slurmdbd refuses a slurmdbd.conf that others may read (it may hold a password).
        changed |= _write_if_changed(layout.dbd_conf, render_slurmdbd_conf(layout), 0o600)
    _write_if_changed(layout.spec_file, layout.spec.to_json())
    return changed


def _ensure_char_device(path: Path, minor: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == minor:
            return
        path.unlink()
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(GPU_DEVICE_MAJOR, minor))


def _prepare_dirs(layout: ClusterLayout) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    layout.state_dir.chmod(0o755)
    # munged refuses a socket directory that others cannot reach ("Socket is inaccessible").
    layout.munge_dir.mkdir(exist_ok=True)
    layout.munge_dir.chmod(0o755)
    (layout.ctld_dir / "state").mkdir(parents=True, exist_ok=True)
    for node in layout.node_names:
        (layout.node_dir(node) / "spool").mkdir(parents=True, exist_ok=True)
        devices = layout.gpu_devices(node)
        if devices:
            devices[0].parent.mkdir(exist_ok=True)
        for minor, device in enumerate(devices):
            # slurmd checks that a GPU's file is a character device; a plain file is refused.
            _ensure_char_device(device, minor)
    if layout.spec.accounting:
        layout.db_dir.mkdir(exist_ok=True)
    if not layout.munge_key.exists():
        layout.munge_key.write_bytes(secrets.token_bytes(1024))
    layout.munge_key.chmod(0o400)


def _init_db(layout: ClusterLayout, env: Mapping[str, str]) -> None:
    """Create MariaDB's system tables in the cluster's own data directory, once."""
    if (layout.db_data / "mysql").is_dir():
        return
    if layout.db_data.exists():
        shutil.rmtree(layout.db_data)  # a half-made data dir from an interrupted first start
    _run_checked(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={layout.db_data}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        env,
        f"see {layout.db_dir}",
    )


def _run_checked(argv: list[str], env: Mapping[str, str], hint: str) -> None:
    done = subprocess.run(
        argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise DevClusterError(
            f"`{' '.join(argv)}` exited {done.returncode}:\n{done.stderr.strip()}\nHINT: {hint}."
        )


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True)
class _Daemon:
    """How to start one daemon and how to know it is ready."""

    argv: list[str]
    pid_file: Path
    detach: bool = False
    """True for a daemon that stays in the foreground: started in a new session, its output
    going to ``log``, so that it outlives the command that started it."""
    log: Path | None = None
    port: int | None = None
    """A port the daemon must accept connections on before it counts as started."""
    timeout_s: float = 10.0


def _daemons(layout: ClusterLayout) -> dict[str, _Daemon]:
    m = layout.munge_dir
    found = {
        "munged": _Daemon(
            [
                "munged",
                "--force",
                f"--key-file={layout.munge_key}",
                f"--socket={layout.munge_socket}",
                f"--pid-file={layout.munge_pid}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            layout.munge_pid,
        )
    }
    if layout.spec.accounting:
        found["mariadbd"] = _Daemon(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={layout.db_data}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={layout.db_port}",
                f"--socket={layout.db_socket}",
                f"--pid-file={layout.db_pid}",
                "--innodb-buffer-pool-size=128M",
            ],
            layout.db_pid,
            detach=True,
            log=layout.db_dir / "mariadbd.log",
            port=layout.db_port,
            timeout_s=60.0,
        )
        # slurmdbd creates its tables on its first start before it listens.
        found["slurmdbd"] = _Daemon(
            ["slurmdbd"], layout.dbd_pid, port=layout.dbd_port, timeout_s=60.0
        )
    found["slurmctld"] = _Daemon(["slurmctld", "-f", str(layout.conf)], layout.ctld_pid)
    for node in layout.node_names:
        found[f"slurmd-{node}"] = _Daemon(
            ["slurmd", "-f", str(layout.conf), "-N", node], layout.node_pid(node)
        )
    return found


def _start(name: str, daemon: _Daemon, env: Mapping[str, str]) -> None:
    if daemon.detach:
        assert daemon.log is not None
        with daemon.log.open("ab") as out:
            # setsid -f forks: the daemon is not our child and outlives this process.
            returncode = subprocess.run(
                ["setsid", "-f", *daemon.argv],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                check=False,
            ).returncode
        error = ""
    else:
        done = subprocess.run(
            daemon.argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        returncode, error = done.returncode, done.stderr.strip()
    deadline = time.monotonic() + daemon.timeout_s
    while not _ready(daemon):
        if returncode != 0 or time.monotonic() > deadline:
            where = daemon.log or daemon.pid_file.parent
            raise DevClusterError(
                f"{name} did not start (`{' '.join(daemon.argv)}` exited {returncode}):\n"
                f"{error}\nHINT: see the logs under {where}; another dev cluster may use its "
                "ports: bring this one up with another --slot."
            )
        time.sleep(0.05)


def _ready(daemon: _Daemon) -> bool:
    if pid_alive(daemon.pid_file) is None:
        return False
    return daemon.port is None or _port_open(daemon.port)


def wait_idle(
    layout: ClusterLayout, timeout_s: float = 60.0, *, resume_drained: bool = False
) -> None:
    """Wait until every node reports idle (or mixed/allocated: it runs jobs, so it is up);
    ``resume_drained``: resume a node that reports drained meanwhile."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    resumed: set[str] = set()
    while time.monotonic() < deadline:
        states = node_states(layout)
        if resume_drained and any(
            st.startswith(("drain", "drng")) for n, st in states.items() if n not in resumed
        ):
            resumed |= set(resume_drained_nodes(layout, skip=resumed))
        up_states = ("idle", "mix", "alloc")
        if all(states.get(n, "").rstrip("*~#") in up_states for n in layout.node_names):
            return
        time.sleep(0.2)
    raise DevClusterError(
        f"nodes did not become idle within {timeout_s:.0f} s: {states or 'no answer from sinfo'}. "
        f"HINT: see {layout.ctld_dir / 'slurmctld.log'} and "
        f"{layout.state_dir / 'nodes'}/*/slurmd.log."
    )


def resume_drained_nodes(
    layout: ClusterLayout, reason: str | None = None, *, skip: Iterable[str] = ()
) -> dict[str, str]:
    """Resume the nodes that report drained (``reason``: only those whose drain reason holds
    it), but those in ``skip``; each resumed node's drain reason, by node.

    A node of a fresh controller's saved state, or one a test's job left drained for "Kill task
    failed" (a step that did not end in time at its job's end), would otherwise keep every
    later job of the cluster waiting for a node that never comes."""
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%E"],
        env=slurm_env(layout), capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    drained: dict[str, str] = {}
    for line in done.stdout.splitlines():  # a node shows once per partition
        node, state, why = [*line.split("|", 2), "", ""][:3]
        if not state.startswith("drain") or node in skip:
            continue
        if reason is None or reason in why:
            drained[node] = why
    if drained:
        subprocess.run(
            ["scontrol", "update", f"NodeName={','.join(sorted(drained))}", "State=RESUME"],
            env=slurm_env(layout), capture_output=True, check=False, timeout=30,
        )  # fmt: skip
    return drained


def node_states(layout: ClusterLayout) -> dict[str, str]:
    """Each node's state as ``sinfo`` abbreviates it (``idle``, ``alloc``, ``down*``); empty
    when the controller does not answer."""
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"],
        env=slurm_env(layout),
        capture_output=True,
        text=True,
        check=False,
    )
    return parse_sinfo_states(done.stdout)


def up(state_dir: Path, env: Mapping[str, str], spec: ClusterSpec | None = None) -> UpResult:
    """Bring the dev cluster in ``state_dir`` up (idempotent) and return where its
    ``slurm.conf`` is. ``spec`` defaults to the one it was last brought up with, else to
    :class:`ClusterSpec` with the slot of ``state_dir``."""
    t0 = time.monotonic()
    spec = spec or resolve_spec(state_dir)
    installed = packages.ensure(_needs(spec), env)
    layout = layout_for(state_dir, spec)
    previous = saved_spec(state_dir)
    if previous is not None and previous != spec:
        # Stop what the old shape started (a node it had, slurmdbd it ran) but munged.
        old = layout_for(state_dir, previous).pid_files()
        _stop_daemons({k: v for k, v in old.items() if k != "munged"})
        if previous.slot != spec.slot:
            # The saved jobs carry the old slot's cluster name and ids: slurmctld refuses to
            # start on state saved under another ClusterName.
            shutil.rmtree(layout.ctld_dir / "state", ignore_errors=True)
    _prepare_dirs(layout)
    daemon_env = {**env, "SLURM_CONF": str(layout.conf)}
    pid_files = layout.pid_files()
    if _write_configs(layout):
        # A daemon running with an old config would disagree with its peers: restart them all
        # (the database keeps running: it has no config of ours).
        _stop_daemons({k: v for k, v in pid_files.items() if k not in ("munged", "mariadbd")})
    started = []
    for name, daemon in _daemons(layout).items():
        if pid_alive(daemon.pid_file) is not None:
            continue
        if name == "mariadbd":
            _init_db(layout, daemon_env)
        _start(name, daemon, daemon_env)
        started.append(name)
    _update_hosts(layout, present=True)
    # A new controller's saved state may hold a node drained by an earlier run's job whose step
    # outlived it ("Kill task failed"): a dev cluster comes up clean.
    wait_idle(layout, resume_drained="slurmctld" in started)
    return UpResult(
        conf=layout.conf,
        started=tuple(started),
        seconds=time.monotonic() - t0,
        installed=tuple(installed),
    )


def running_slots(but: Path | None = None) -> set[int]:
    """The slots of the dev clusters running on this host (those ``/etc/hosts`` names), but the
    one in ``but``."""
    owners = hosts_owners(HOSTS_FILE.read_text()) if HOSTS_FILE.exists() else {}
    slots = set()
    for owner in owners:
        state_dir = DEFAULT_STATE_DIR if owner == LEGACY_OWNER else Path(owner)
        if state_dir == but or pid_alive(ClusterLayout(state_dir, "").ctld_pid) is None:
            continue
        with contextlib.suppress(DevClusterError):
            spec = saved_spec(state_dir)
            slots.add(spec.slot if spec else slot_for(state_dir, DEFAULT_STATE_DIR))
    return slots


def up_on_free_slot(state_dir: Path, env: Mapping[str, str], spec: ClusterSpec) -> UpResult:
    """:func:`up` on ``spec``'s slot, or on a free one when another running cluster holds it
    (:func:`~hpc_ddp.devcluster.conf.pick_slot`).

    Under a host-wide lock, so that clusters coming up at once (one per test worker) cannot
    pick the same slot: a cluster holds its slot from its ``up`` on, when its names reach
    ``/etc/hosts``."""
    SLOTS_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with SLOTS_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        slot = pick_slot(spec.slot, running_slots(but=state_dir))
        return up(state_dir, env, dataclasses.replace(spec, slot=slot))


def _stop_pid(pid_file: Path, sig: signal.Signals, timeout_s: float) -> bool:
    """Signal the process in ``pid_file`` and wait until it is gone (SIGKILL after timeout)."""
    pid = pid_alive(pid_file)
    if pid is None:
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(pid):
        os.kill(pid, signal.SIGKILL)
        while _running(pid):
            time.sleep(0.05)
    return True


def _stop_daemons(pid_files: Mapping[str, Path], timeout_s: float = 30.0) -> list[str]:
    """Stop the given daemons, last started first; return the names of those that ran."""
    return [
        name
        for name, pid_file in reversed(list(pid_files.items()))
        if _stop_pid(pid_file, signal.SIGTERM, timeout_s)
    ]


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
    """Stop the daemons this cluster started and take its names out of ``/etc/hosts``.

    Running jobs are cancelled first so no ``slurmstepd`` outlives its daemons. With ``purge``
    the state directory is removed too. Returns the names of the daemons it stopped.
    """
    layout = layout_for(state_dir)
    if pid_alive(layout.ctld_pid) is not None:
        _cancel_all_jobs(layout)
    stopped = _stop_daemons(layout.pid_files())
    if HOSTS_FILE.exists():
        _update_hosts(layout, present=False)
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


@contextlib.contextmanager
def _locked_hosts() -> Iterator[tuple[str, Callable[[str], None]]]:
    """``/etc/hosts``'s text and a function that rewrites it, under an exclusive lock so that
    two clusters coming up at once do not lose each other's names."""
    with HOSTS_FILE.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)

        def rewrite(new: str) -> None:
            # /etc/hosts is often a bind mount: rewrite it in place, never rename over it.
            f.seek(0)
            f.write(new)
            f.truncate()
            f.flush()

        yield f.read(), rewrite


def _update_hosts(layout: ClusterLayout, *, present: bool) -> None:
    """Add (or take out) this cluster's node names in the marked ``/etc/hosts`` line, keeping
    the names of every other dev cluster that still runs."""
    me = str(layout.state_dir)
    with _locked_hosts() as (text, rewrite):
        owners = hosts_owners(text)
        legacy = owners.pop(LEGACY_OWNER, None)
        if legacy:
            # Written by a version that did not name its cluster: the default one, as a rule.
            owners.setdefault(str(DEFAULT_STATE_DIR), legacy)
        owners = {
            d: names
            for d, names in owners.items()
            if d != me and pid_alive(ClusterLayout(Path(d), "").ctld_pid) is not None
        }
        if present:
            owners[me] = layout.node_names
        new = render_hosts(text, owners)
        if new != text:
            rewrite(new)


def _processes() -> dict[int, tuple[int, str]]:
    """Every process on this host: ``{pid: (ppid, command name)}``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat_line[stat_line.index("(") + 1 : stat_line.rindex(")")]
        found[int(entry.name)] = (int(stat_line.rsplit(")", 1)[-1].split()[1]), name)
    return found


def node_step_pids(layout: ClusterLayout, node: str) -> list[int]:
    """The pids of the ``slurmstepd`` processes of ``node`` and everything they started.

    A slurmstepd works in its node's directory (``SlurmdSpoolDir`` is under it), which tells the
    nodes apart although they share one host, and one dev cluster's apart from another's.
    """
    procs = _processes()
    node_dir = str(layout.node_dir(node))
    roots = set()
    for pid, (_, name) in procs.items():
        with contextlib.suppress(OSError):
            if name.startswith("slurmstepd") and os.readlink(f"/proc/{pid}/cwd") == node_dir:
                roots.add(pid)
    found = set(roots)
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return sorted(found)


def kill_node(state_dir: Path, node: str) -> list[int]:
    """Take ``node`` away as a crash would: SIGKILL its slurmd, then its slurmstepds and their
    tasks. The controller notices nothing until its next ping fails and marks the node DOWN
    ``SlurmdTimeout`` after the node's last answer. Returns the pids it killed."""
    layout = layout_for(state_dir)
    if node not in layout.node_names:
        raise DevClusterError(
            f"no node {node!r} in the dev cluster in {state_dir}. "
            f"HINT: its nodes are {', '.join(layout.node_names)}."
        )
    killed = []
    pid = pid_alive(layout.node_pid(node))
    if pid is not None:
        _stop_pid(layout.node_pid(node), signal.SIGKILL, timeout_s=5)
        killed.append(pid)
    # SIGSTOP first so that no task starts a new process between the listing and the kill.
    victims = node_step_pids(layout, node)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, sig)
    return killed + victims


def revive_node(
    state_dir: Path,
    node: str,
    env: Mapping[str, str],
    timeout_s: float = 60,
    *,
    resume_drained: bool = False,
) -> None:
    """Start ``node``'s slurmd again and wait until the controller has it back (idle);
    ``resume_drained``: resume a node that reports drained meanwhile (:func:`wait_idle`)."""
    layout = layout_for(state_dir)
    daemon = _daemons(layout)[f"slurmd-{node}"]
    if pid_alive(daemon.pid_file) is None:
        _start(f"slurmd-{node}", daemon, {**env, "SLURM_CONF": str(layout.conf)})
    wait_idle(layout, timeout_s, resume_drained=resume_drained)


def forget_jobs(state_dir: Path, env: Mapping[str, str]) -> None:
    """Restart the controller without its saved jobs, as after the loss of its job state: it
    forgets every job and numbers new jobs from ``FirstJobId`` again, so a job id can name a
    second job. The nodes, munge and the accounting daemons go on: only ``sacct`` still knows
    the old jobs.

    Jobs still queued or running are cancelled first: a step the controller no longer knows
    outlives it on its node and keeps a new job of the same id from starting there (22.05:
    "Job N already running, do not launch second copy", the new job requeued and held)."""
    layout = layout_for(state_dir)
    _cancel_all_jobs(layout)
    daemon_env = {**env, "SLURM_CONF": str(layout.conf)}
    # Under the hosts lock: another cluster that comes up or goes down meanwhile takes a
    # cluster whose controller is not running for a dead one, and drops its node names from
    # /etc/hosts (seen: the accounting cluster's names gone for the rest of a suite run).
    with _locked_hosts():
        _stop_pid(layout.ctld_pid, signal.SIGTERM, timeout_s=30)
        # The jobs' state files, the last job id with them (`slurmctld -c` would keep that
        # id, and lose the nodes' state too: they are not idle again for 5 s).
        saved = layout.ctld_dir / "state"
        for path in saved.glob("job_state*"):
            path.unlink()
        for path in saved.glob("hash.*"):
            shutil.rmtree(path)
        _start("slurmctld", _daemons(layout)["slurmctld"], daemon_env)
    # The nodes register again at once when asked (else at the controller's next ping, ~5 s).
    subprocess.run(
        ["scontrol", "reconfigure"], env=daemon_env, capture_output=True, check=False, timeout=30
    )
    wait_idle(layout)


def node_state(layout: ClusterLayout, node: str) -> str:
    """The controller's full state of ``node`` (``scontrol show node``), e.g. ``IDLE`` or
    ``DOWN+NOT_RESPONDING``; empty when the controller does not answer."""
    done = subprocess.run(
        ["scontrol", "show", "node", "-o", node],
        env=slurm_env(layout),
        capture_output=True,
        text=True,
        check=False,
    )
    for field in done.stdout.split():
        if field.startswith("State="):
            return field.removeprefix("State=")
    return ""
