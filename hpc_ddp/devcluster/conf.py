"""Pure parts of the local dev cluster: what it is, where its files and ports are, the text of its
config files (``slurm.conf``, ``gres.conf``, ``slurmdbd.conf``), and its ``/etc/hosts`` line.

Nothing here starts a process or touches a file; :mod:`hpc_ddp.devcluster.cluster` does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, unquote

from hpc_ddp.errors import DevClusterError

HOSTS_MARKER = "# hpc-ddp dev-cluster"
LEGACY_OWNER = ""
"""The owner of a marked ``/etc/hosts`` line written before lines named their clusters."""

SLOTS = 60
"""How many dev clusters can run side by side: each slot has its own ports and job ids."""
PORT_BASE = 17000
PORTS_PER_SLOT = 50
"""Slot ``s`` owns ports ``[PORT_BASE + 50 s, PORT_BASE + 50 s + 50)``: all 60 slots lie in
17000-19999, below the MASTER_PORTs hpc-ddp derives (20000 and up) and below the kernel's
ephemeral range, so neither a training job nor an outgoing connection takes a daemon's port."""
_NODE_PORT_OFFSET = 10
MAX_NODES = PORTS_PER_SLOT - _NODE_PORT_OFFSET
JOB_IDS_PER_SLOT = 1_000_000
"""Slot ``s`` numbers its jobs from about ``s * 1_000_000`` (``FirstJobId``, see
:meth:`ClusterLayout.first_job_id`), so job ids tell the clusters apart."""
MASTER_PORT_SLOTS = 12763
"""``hpc_ddp.backends.ports.PORT_SLOTS`` (a layer above this one, so not imported): a job's
derived MASTER_PORT is a permutation of its id modulo this. tests/devcluster/test_conf.py
checks that the two agree."""
_GOLDEN = (1 + 5**0.5) / 2
GPU_DEVICE_MAJOR = 195
"""The major number of ``/dev/nvidiaN``: slurmd accepts only character devices as GPU files."""


@dataclass(frozen=True)
class ClusterSpec:
    """What a dev cluster is, chosen at ``up`` and kept in its state directory.

    ``slot`` picks its ports and job ids (see :func:`slot_for`); ``slurmd_timeout_s`` is how long
    the controller waits for a silent node before marking it DOWN (Slurm's default is 300 s;
    node-loss tests want a few seconds); ``cred_expire_s`` is munge's credential lifetime, and
    a requeued job is held ``cred_expire_s + 1`` s (10 keeps the tests quick; Slurm's default,
    120, is what a real cluster's requeue costs: the fault benchmark measures against it).
    """

    nodes: int = 2
    gpus_per_node: int = 2
    accounting: bool = False
    slurmd_timeout_s: int = 300
    slot: int = 0
    cred_expire_s: int = 10

    def __post_init__(self) -> None:
        checks = [
            ("nodes", self.nodes, 1, MAX_NODES),
            ("gpus_per_node", self.gpus_per_node, 0, 16),
            ("slurmd_timeout_s", self.slurmd_timeout_s, 2, 65533),
            ("slot", self.slot, 0, SLOTS - 1),
            ("cred_expire_s", self.cred_expire_s, 1, 86400),
        ]
        for name, value, low, high in checks:
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise DevClusterError(
                    f"dev cluster {name}={value!r} is out of range. "
                    f"HINT: choose a whole number from {low} to {high}."
                )

    def to_json(self) -> str:
        """The text saved as ``cluster.json`` in the state directory."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "cluster.json") -> ClusterSpec:
        """Read back :meth:`to_json`; a broken file raises :class:`DevClusterError`."""
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise DevClusterError(
                f"{source} does not describe a dev cluster ({exc}). "
                "HINT: run `hpc-ddp dev-cluster down --purge` for that state dir and `up` again."
            ) from exc


def message_timeout_s(spec: ClusterSpec) -> int:
    """``MessageTimeout`` for ``spec``: Slurm's 10 s, less for a short ``SlurmdTimeout``."""
    return max(2, min(10, spec.slurmd_timeout_s // 2))


def slot_for(state_dir: Path, default_dir: Path) -> int:
    """The slot of the cluster in ``state_dir``: 0 for the default directory, else a hash.

    Two non-default directories may hash to one slot (1 in 59); give one an explicit slot then.
    """
    if state_dir == default_dir:
        return 0
    digest = hashlib.blake2b(str(state_dir).encode(), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % (SLOTS - 1)


def pick_slot(preferred: int, taken: Collection[int]) -> int:
    """``preferred`` unless another running cluster holds it, else the first free slot above 0
    (0 is the default directory's). Raises :class:`DevClusterError` when every slot is taken."""
    if preferred not in taken:
        return preferred
    for slot in range(1, SLOTS):
        if slot not in taken:
            return slot
    raise DevClusterError(
        f"all {SLOTS} dev cluster slots are taken by running clusters. "
        "HINT: take one down with `hpc-ddp dev-cluster down --state-dir DIR`."
    )


@dataclass(frozen=True)
class ClusterLayout:
    """Where every file and port of one dev cluster is: files under one state directory, ports
    in the block of its slot."""

    state_dir: Path
    hostname: str
    spec: ClusterSpec = field(default_factory=ClusterSpec)
    cpus_per_node: int = 4
    mem_per_node_mb: int = 4000

    @property
    def cred_expire_s(self) -> int:
        """munge's credential lifetime (:attr:`ClusterSpec.cred_expire_s`)."""
        return self.spec.cred_expire_s

    @property
    def node_names(self) -> tuple[str, ...]:
        """``n1`` .. ``nN``: the same names in every dev cluster (they all resolve to loopback)."""
        return tuple(f"n{i}" for i in range(1, self.spec.nodes + 1))

    @property
    def cluster_name(self) -> str:
        # Slot 0 keeps the name it always had: slurmctld refuses a state dir saved under another.
        return "hpcddp-dev" if self.spec.slot == 0 else f"hpcddp-dev{self.spec.slot}"

    @property
    def first_port(self) -> int:
        return PORT_BASE + PORTS_PER_SLOT * self.spec.slot

    @property
    def ctld_port(self) -> int:
        return self.first_port

    @property
    def dbd_port(self) -> int:
        return self.first_port + 1

    @property
    def db_port(self) -> int:
        return self.first_port + 2

    def node_port(self, node: str) -> int:
        return self.first_port + _NODE_PORT_OFFSET + self.node_names.index(node)

    @property
    def first_job_id(self) -> int:
        """Slurm's ``FirstJobId`` for this cluster.

        Every dev cluster shares one loopback, and hpc-ddp derives a job's MASTER_PORT from its
        id modulo :data:`MASTER_PORT_SLOTS`: ids congruent modulo that
        collide. So slot 0 starts at residue 1 and every other slot starts in the middle half
        of the residues (spread by the golden ratio): the default cluster and any other can
        each run over 3000 jobs before one's MASTER_PORT could be the other's.
        """
        slot = self.spec.slot
        if slot == 0:
            return 1
        half = MASTER_PORT_SLOTS // 2
        residue = MASTER_PORT_SLOTS // 4 + round((slot - 1) * half / _GOLDEN) % half
        base = slot * JOB_IDS_PER_SLOT
        return base + (residue - base) % MASTER_PORT_SLOTS

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` every client and daemon of this cluster reads (``SLURM_CONF``)."""
        return self.state_dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        """Slurm reads ``gres.conf`` from the directory of ``slurm.conf``."""
        return self.state_dir / "gres.conf"

    @property
    def dbd_conf(self) -> Path:
        """slurmdbd reads ``slurmdbd.conf`` from the directory of ``$SLURM_CONF``."""
        return self.state_dir / "slurmdbd.conf"

    @property
    def spec_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_pid(self) -> Path:
        return self.munge_dir / "munged.pid"

    @property
    def ctld_dir(self) -> Path:
        return self.state_dir / "ctld"

    @property
    def ctld_pid(self) -> Path:
        return self.ctld_dir / "slurmctld.pid"

    @property
    def db_dir(self) -> Path:
        """MariaDB's data, socket, pid and log, and slurmdbd's pid and log."""
        return self.state_dir / "db"

    @property
    def db_data(self) -> Path:
        return self.db_dir / "data"

    @property
    def db_socket(self) -> Path:
        return self.db_dir / "mysqld.sock"

    @property
    def db_pid(self) -> Path:
        return self.db_dir / "mariadbd.pid"

    @property
    def dbd_pid(self) -> Path:
        return self.db_dir / "slurmdbd.pid"

    def node_dir(self, node: str) -> Path:
        """Spool, pid, log and fake GPU devices of one slurmd."""
        return self.state_dir / "nodes" / node

    def node_pid(self, node: str) -> Path:
        return self.node_dir(node) / "slurmd.pid"

    def gpu_devices(self, node: str) -> list[Path]:
        """The fake ``nvidiaN`` character devices of one node."""
        return [self.node_dir(node) / "dev" / f"nvidia{i}" for i in range(self.spec.gpus_per_node)]

    def pid_files(self) -> dict[str, Path]:
        """Every daemon this cluster starts, by name, with its pid file, in start order."""
        files = {"munged": self.munge_pid}
        if self.spec.accounting:
            files |= {"mariadbd": self.db_pid, "slurmdbd": self.dbd_pid}
        files["slurmctld"] = self.ctld_pid
        for node in self.node_names:
            files[f"slurmd-{node}"] = self.node_pid(node)
        return files


def render_slurm_conf(layout: ClusterLayout) -> str:
    """Return the text of the ``slurm.conf`` for ``layout``.

    Settings follow what was seen to work on Debian's Slurm 22.05 without systemd or cgroups:
    linuxproc process tracking, CPU-only cons_tres, fast scheduling, short credential expiry
    (a requeued job may start again ``cred_expire + 1`` seconds later), and three partitions so
    preemption can be exercised for real: ``low`` is requeued by jobs in ``high``.
    """
    d = layout.state_dir
    spec = layout.spec
    lines = [
        f"# Generated by hpc-ddp dev-cluster for {d}. Regenerated by every `up`.",
        f"ClusterName={layout.cluster_name}",
        f"SlurmctldHost={layout.hostname}(127.0.0.1)",
        f"SlurmctldPort={layout.ctld_port}",
        f"FirstJobId={layout.first_job_id}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket},cred_expire={layout.cred_expire_s}",
        f"StateSaveLocation={layout.ctld_dir}/state",
        f"SlurmctldPidFile={layout.ctld_pid}",
        f"SlurmctldLogFile={layout.ctld_dir}/slurmctld.log",
        f"SlurmdSpoolDir={d}/nodes/%n/spool",
        f"SlurmdPidFile={d}/nodes/%n/slurmd.pid",
        f"SlurmdLogFile={d}/nodes/%n/slurmd.log",
        # A node whose slurmd stops answering is DOWN after this long (and its jobs end, or
        # lose the node with --no-kill). The controller pings every third of it.
        f"SlurmdTimeout={spec.slurmd_timeout_s}",
        # The controller retries a connection to a silent node once a second for
        # min(MessageTimeout, 10) s per ping, and marks it DOWN only after a ping ends: a short
        # SlurmdTimeout needs a short MessageTimeout to take effect (read at slurmctld start).
        f"MessageTimeout={message_timeout_s(spec)}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1",
        # Lets each node advertise more CPUs than the host has, so two nodes fit on two cores.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "KillWait=5",
        "MinJobAge=3600",
        "InactiveLimit=0",
        "JobRequeue=1",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "SlurmctldParameters=preempt_send_user_signal",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={layout.ctld_dir}/jobcomp.log",
        *_accounting_lines(layout),
    ]
    if spec.gpus_per_node:
        lines.append("GresTypes=gpu")
    gres = f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else ""
    for node in layout.node_names:
        lines.append(
            f"NodeName={node} NodeHostname={layout.hostname} NodeAddr=127.0.0.1 "
            f"Port={layout.node_port(node)} CPUs={layout.cpus_per_node} "
            f"RealMemory={layout.mem_per_node_mb}{gres} State=UNKNOWN"
        )
    lines += [
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
        "PriorityTier=1 PreemptMode=REQUEUE",
        "PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 "
        "PreemptMode=REQUEUE GraceTime=10",
        "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def _accounting_lines(layout: ClusterLayout) -> list[str]:
    if not layout.spec.accounting:
        return ["AccountingStorageType=accounting_storage/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={layout.dbd_port}",
        # The munge socket for talking to slurmdbd is read from here, not from AuthInfo.
        f"AccountingStoragePass={layout.munge_socket}",
    ]


def render_gres_conf(layout: ClusterLayout) -> str:
    """Return ``gres.conf``: each node's fake GPUs, one character device each.

    Slurm then gives a job's tasks ``CUDA_VISIBLE_DEVICES`` as it would on a GPU node; nothing
    opens the devices. Without GPUs the file only turns autodetection off.
    """
    lines = ["# Generated by hpc-ddp dev-cluster. Regenerated by every `up`.", "AutoDetect=off"]
    if layout.spec.gpus_per_node:
        last = layout.spec.gpus_per_node - 1
        for node in layout.node_names:
            files = layout.node_dir(node) / "dev" / f"nvidia[0-{last}]"
            lines.append(f"NodeName={node} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(layout: ClusterLayout) -> str:
    """Return ``slurmdbd.conf``: slurmdbd on loopback, storing into this cluster's own MariaDB."""
    return (
        "# Generated by hpc-ddp dev-cluster. Regenerated by every `up`.\n"
        "AuthType=auth/munge\n"
        f"AuthInfo=socket={layout.munge_socket}\n"
        "DbdHost=localhost\n"
        "DbdAddr=127.0.0.1\n"
        f"DbdPort={layout.dbd_port}\n"
        "SlurmUser=root\n"
        f"PidFile={layout.dbd_pid}\n"
        f"LogFile={layout.db_dir / 'slurmdbd.log'}\n"
        "StorageType=accounting_storage/mysql\n"
        "StorageHost=127.0.0.1\n"
        f"StoragePort={layout.db_port}\n"
        "StorageUser=root\n"
        "StorageLoc=slurm_acct_db\n"
    )


def _natural(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match[1], int(match[2])) if match else (name, -1)


def hosts_owners(hosts_text: str) -> dict[str, tuple[str, ...]]:
    """The dev clusters a marked ``/etc/hosts`` line serves: ``{state dir: node names}``.

    A marked line from before lines named their clusters belongs to :data:`LEGACY_OWNER`.
    """
    owners: dict[str, tuple[str, ...]] = {}
    for line in hosts_text.splitlines():
        if HOSTS_MARKER not in line:
            continue
        names, _, tail = line.partition(HOSTS_MARKER)
        entries = tail.lstrip(":").split()
        if not entries:
            owners[LEGACY_OWNER] = tuple(names.split()[1:])
        for entry in entries:
            owner, _, node_list = entry.rpartition("=")
            owners[unquote(owner)] = tuple(n for n in node_list.split(",") if n)
    return owners


def render_hosts(hosts_text: str, owners: Mapping[str, Sequence[str]]) -> str:
    """Return ``/etc/hosts`` text whose one marked line resolves every node name of ``owners``
    to loopback, and names each owner with its nodes so it can be taken out again; with no
    owners, no marked line. Lines without the marker are kept as they are.

    MASTER_ADDR is the first node's name, so ``n1`` must resolve on every task; every dev
    cluster names its nodes ``n1``..``nN``, so the line holds the union of their names.
    """
    kept = [line for line in hosts_text.splitlines(keepends=True) if HOSTS_MARKER not in line]
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    names = sorted({n for nodes in owners.values() for n in nodes}, key=_natural)
    if not names:
        return text
    entries = " ".join(
        f"{quote(owner, safe='/._-+~@,')}={','.join(nodes)}"
        for owner, nodes in sorted(owners.items())
    )
    return f"{text}127.0.0.1 {' '.join(names)} {HOSTS_MARKER}: {entries}\n"


def parse_sinfo_states(text: str) -> dict[str, str]:
    """Parse ``sinfo -h -N -o '%N %t'`` output into ``{node: short state}``.

    A node listed in several partitions appears once per partition; the states agree.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


REQUEUE_SETTLE_S = 2.0
"""How long after a requeue a held job may be let go early (``scontrol update StartTime=now``).

Not in the second of the requeue itself: the nodes revoked the old run's credential then,
slurmd compares credential times in whole seconds, and a start in that second is killed
("Job credential revoked"), the job FAILED. Slurm's own hold is ``cred_expire`` + 1 s."""


def releasable_early(fields: Mapping[str, str], now: float) -> bool:
    """Whether a job (``scontrol show job`` fields) is a requeued one held for its begin time
    that may start at ``now`` (seconds since the epoch) without its start being killed.

    A requeue resets ``SubmitTime`` (the controller's local time, as ``now`` is read here).
    """
    if fields.get("JobState") != "PENDING" or fields.get("Reason") != "BeginTime":
        return False
    requeued = datetime.fromisoformat(fields["SubmitTime"]).timestamp()
    return now >= requeued + REQUEUE_SETTLE_S
