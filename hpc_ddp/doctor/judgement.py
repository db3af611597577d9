"""The doctor's judgement: what each task observed (:class:`RankReport`), weighed into one
:class:`Finding` per check and node, with the node to blame. Pure.

The tasks only measure (:mod:`hpc_ddp.doctor.exam`); everything that decides lives here, so the
login side (``hpc-ddp doctor``) and a relaunch inside an allocation judge alike, and every rule
is testable with reports written by hand, the NCCL ones included.

Bus bandwidth is nccl-tests' figure for an all-reduce: ``algbw = bytes / time`` and
``busbw = algbw * 2(n-1)/n``, the rate each rank's link carries in a ring all-reduce, so that
it compares with the link's own speed whatever the number of ranks. What the link should give
(:func:`expected_busbw`, :func:`expected_p2p`) is derived from what the nodes report, and the
derivation is shown beside the number:

- gloo (TCP): the link's rate is the slower of the NIC's rated speed (``/sys/class/net``, 90%
  for TCP's headers) and a TCP stream over the node's own loopback (the host's TCP stack bounds
  any NIC; on a dev cluster whose "nodes" share one host it is the link). gloo's ring
  all-reduce reached 0.2-0.3 of that stream on loopback here (2 ranks, 32 MiB), its
  send/receive pairs more: :data:`GLOO_ALLREDUCE_SHARE`, :data:`GLOO_P2P_SHARE`.

A link slower than itself reports its own lower speed, so the nodes' links are also compared
with each other (the ``network`` row): a NIC that negotiated down, or a node of another kind,
is named even when every measurement agrees with its own link.
- NCCL: within a node, published nccl-tests all-reduce figures for the GPU's NVLink generation
  or its PCIe generation (:data:`INTRA_NODE_BUSBW`); across nodes, the node's active
  InfiniBand ports (``/sys/class/infiniband``; 90% of line rate, as nccl-tests reach) or its
  Ethernet NIC through NCCL's socket transport (half of it), whichever the nodes have least of.

A measurement under :data:`SLOW_FRACTION` of its expectation is ``SLOW``. Only the largest
all-reduce is judged: small messages measure latency, not the link.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN_FILE = "login.token"
"""Written by the login side before the job starts; every node reads it back."""


OK, SLOW, FAIL, INFO = "ok", "SLOW", "FAIL", "-"
"""Verdicts: ``ok``; ``SLOW`` (works, below what the link should give); ``FAIL`` (broken);
``-`` (a fact shown, nothing judged)."""
PASSING = (OK, INFO)

ALLREDUCE_BYTES: Mapping[str, tuple[int, ...]] = {
    "gloo": (256 << 10, 4 << 20, 32 << 20),
    "nccl": (1 << 20, 64 << 20, 512 << 20),
}
"""Message sizes of the all-reduce test per backend: latency, middle, bandwidth (judged)."""
ALLREDUCE_ITERS: Mapping[str, tuple[int, ...]] = {"gloo": (20, 10, 5), "nccl": (20, 20, 10)}
"""Timed iterations per size: about a second in all on a healthy link, seconds on a bad one."""
P2P_BYTES: Mapping[str, int] = {"gloo": 16 << 20, "nccl": 256 << 20}
"""Bytes rank 0 and each other node's first rank send each other, to name a slow node."""
LOOPBACK_STREAM_BYTES = 32 << 20

SLOW_FRACTION = 0.5
"""A bandwidth under this share of its expectation is SLOW: a link at half its rated width or
speed, NCCL fallen back from InfiniBand to sockets, a congested or failing port."""
GLOO_ALLREDUCE_SHARE = 0.2
"""gloo's all-reduce bus bandwidth as a share of the link's TCP stream rate (the lowest share
seen on loopback here, 0.2-0.3 with the host's two cores busy)."""
GLOO_P2P_SHARE = 0.25
"""gloo's send/receive round trip as a share of the link's TCP stream rate (measured 0.3-1 on
loopback here; judged conservatively, as the two sides share the host's cores)."""
TCP_SHARE = 0.9
"""A TCP stream's payload rate as a share of a NIC's rated speed."""
IB_SHARE = 0.9
"""nccl-tests' all-reduce bus bandwidth across nodes as a share of the InfiniBand line rate."""
NCCL_SOCKET_SHARE = 0.5
"""NCCL's socket transport (no InfiniBand) as a share of the Ethernet NIC's rated speed."""
GB = 1e9

INTRA_NODE_BUSBW: tuple[tuple[str, float, str], ...] = (
    ("v100-sxm", 130 * GB, "NVLink 2 (V100 SXM2): nccl-tests all-reduce ~130 GB/s"),
    ("a100-sxm", 230 * GB, "NVLink 3 (A100 SXM4): nccl-tests all-reduce ~230 GB/s"),
    ("a800", 150 * GB, "NVLink 3, 400 GB/s (A800): nccl-tests all-reduce ~150 GB/s"),
    ("h800", 150 * GB, "NVLink 4, 400 GB/s (H800): nccl-tests all-reduce ~150 GB/s"),
    ("gh200", 360 * GB, "NVLink 4 (GH200): nccl-tests all-reduce ~360 GB/s"),
    ("h100", 360 * GB, "NVLink 4 (H100 SXM5): nccl-tests all-reduce ~360 GB/s"),
    ("h200", 360 * GB, "NVLink 4 (H200 SXM): nccl-tests all-reduce ~360 GB/s"),
    ("b200", 700 * GB, "NVLink 5 (B200): ~700 GB/s, about twice NVLink 4"),
)
"""Per GPU name (lower case, first match): the all-reduce bus bandwidth 8 GPUs of one node
reach in published nccl-tests runs. A name with ``pcie`` or ``nvl`` is a PCIe card instead."""
PCIE_BUSBW = (
    (("h100", "h200", "l40s", "rtx 6000 ada"), 40 * GB, "PCIe Gen5 x16: ~40 GB/s all-reduce"),
    ((), 20 * GB, "PCIe Gen4 x16: ~20 GB/s all-reduce"),
)
"""PCIe cards (and GPUs not in :data:`INTRA_NODE_BUSBW`): by generation, first match."""

MIN_FREE_BYTES = 1 << 30
"""Free space under this in the run directory's file system fails: no checkpoint fits."""
MAX_SKEW_S = 1.0
"""Clock skew over this fails: the faults work compares heartbeat and ledger times written on
different nodes, and a log whose times jump between nodes misleads whoever reads it."""


@dataclass(frozen=True)
class Finding:
    """One row of the doctor's table."""

    node: str
    """The node the row is about; ``all`` for the whole job (the all-reduce)."""
    rank: int | None
    """The rank that observed it; None for the whole job."""
    check: str
    value: str
    verdict: str
    note: str = ""
    """Why it failed and what to do, or how an expectation was derived."""
    blame: str | None = None
    """The node at fault when it is not ``node`` (every other node failed to reach rank 0's)."""

    @property
    def passed(self) -> bool:
        """``ok`` or a fact: nothing to fix."""
        return self.verdict in PASSING

    @property
    def culprit(self) -> str:
        """The node this row blames."""
        return self.blame or self.node

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping (``--json``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Link:
    """What a node knows about its network, for the bandwidth expectations."""

    iface: str | None = None
    """The interface that reaches the master address (``lo`` on a single host)."""
    rated_bytes_s: float | None = None
    """The NIC's rated speed (``/sys/class/net/IFACE/speed``); None when unknown or virtual."""
    loopback_bytes_s: float | None = None
    """A TCP stream measured over this node's loopback."""
    ib_bytes_s: tuple[float, ...] = ()
    """Line rates of the node's active InfiniBand ports."""


@dataclass(frozen=True)
class RankReport:
    """What one task observed (``RUN_DIR/doctor/rank-N.json``), written by the task."""

    rank: int
    local_rank: int
    node: str
    world_size: int
    python: str = ""
    executable: str = ""
    torch: str | None = None
    """``torch.__version__``; None when torch could not be imported (``torch_error``)."""
    torch_error: str | None = None
    cuda_build: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    visible_devices: str | None = None
    """``CUDA_VISIBLE_DEVICES`` as the task saw it (None: unset)."""
    gpu_names: tuple[str, ...] = ()
    backend: str | None = None
    device: str | None = None
    gpu_error: str | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    write_error: str | None = None
    token: str | None = None
    """The login side's token as this node read it from the run directory (None: not seen)."""
    port: int | None = None
    port_role: str | None = None
    """``listen`` (rank 0) or ``connect`` (every other rank)."""
    port_error: str | None = None
    port_s: float | None = None
    """How long reaching the port took (connect); for rank 0, the ranks that reached it."""
    reached: tuple[int, ...] = ()
    """Rank 0: the ranks whose hello it got."""
    group: str | None = None
    """``started``, ``done``, ``skipped: ...`` or the error that ended the group checks."""
    clock_offset_s: float | None = None
    clock_error_s: float | None = None
    allreduce: tuple[tuple[int, float], ...] = ()
    """Rank 0: (bytes, seconds per all-reduce, the slowest rank's) per size."""
    p2p: tuple[tuple[str, int, int, float], ...] = ()
    """Rank 0: (node, rank, bytes each way, seconds per round trip) per other node."""
    link: Link = field(default_factory=Link)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankReport:
        """A report read back from JSON (lists become tuples; unknown keys are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: _tuples(v) for k, v in data.items() if k in known and k != "link"}
        link = data.get("link") or {}
        link_fields = {f.name for f in dataclasses.fields(Link)}
        values["link"] = Link(**{k: _tuples(v) for k, v in link.items() if k in link_fields})
        return cls(**values)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


# --- numbers --------------------------------------------------------------------------------


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce of ``nbytes`` on ``world`` ranks (bytes/s):
    ``algbw * 2(n-1)/n``; 0 for one rank, which moves nothing."""
    if seconds <= 0 or world < 2:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world


def p2p_bandwidth(nbytes: int, round_trip_s: float) -> float:
    """Bytes per second of a round trip that carried ``nbytes`` each way."""
    return 2 * nbytes / round_trip_s if round_trip_s > 0 else 0.0


def clock_offset(sent: float, peer: float, received: float) -> tuple[float, float]:
    """NTP's estimate from one round trip: (the peer's clock minus ours, the error bound).

    ``sent`` and ``received`` are our clock around the exchange, ``peer`` the peer's clock in
    between: ``peer - (sent + received) / 2``, give or take half the round trip.
    """
    return peer - (sent + received) / 2, (received - sent) / 2


def best_offset(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """The offset of the round trip with the smallest error bound (the least queued one)."""
    return min((clock_offset(*s) for s in samples), key=lambda o: o[1])


def human_bytes(n: float) -> str:
    """``32 MiB``, ``412.3 GiB``: sizes as the table shows them."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def gbps(bytes_s: float) -> str:
    """``12.34 GB/s`` (decimal, as nccl-tests prints)."""
    return f"{bytes_s / GB:.3g} GB/s"


# --- expectations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """What a link should give, and how that was worked out (shown to the user)."""

    bytes_s: float
    how: str


def tcp_rate(link: Link) -> Expectation | None:
    """The rate a TCP stream can reach on ``link``: the slower of its NIC and its loopback."""
    stream = link.loopback_bytes_s
    nic = None if link.rated_bytes_s is None else link.rated_bytes_s * TCP_SHARE
    if link.iface == "lo" or (nic is None and stream is not None):
        if stream is None:
            return None
        where = "loopback" if link.iface == "lo" else f"{link.iface or 'the NIC'} (speed unknown)"
        return Expectation(stream, f"{where}: a TCP stream measured at {gbps(stream)}")
    if nic is None:
        return None
    if stream is not None and stream < nic:
        return Expectation(stream, f"{link.iface}: the host's TCP stream ({gbps(stream)})")
    return Expectation(nic, f"{link.iface}: {gbps(nic / TCP_SHARE)} rated, 90% for TCP")


def _slowest(rates: Sequence[tuple[str, Expectation | None]]) -> tuple[str, Expectation] | None:
    known = [(node, e) for node, e in rates if e is not None]
    return min(known, key=lambda ne: ne[1].bytes_s) if known else None


def intra_node_busbw(gpu_name: str) -> Expectation:
    """The all-reduce bus bandwidth GPUs of this model reach within one node."""
    name = gpu_name.lower()
    pcie = "pcie" in name or "nvl" in name
    if not pcie:
        for key, rate, how in INTRA_NODE_BUSBW:
            if key in name:
                return Expectation(rate, how)
    for keys, rate, how in PCIE_BUSBW:
        if not keys or any(k in name for k in keys):
            known = pcie or bool(keys)
            return Expectation(rate, how if known else f"{how} ({gpu_name}: assumed)")
    raise AssertionError("the last PCIe entry matches every name")


def network_busbw(link: Link) -> Expectation | None:
    """What NCCL's all-reduce can carry across nodes through this node's network."""
    if link.ib_bytes_s:
        total = sum(link.ib_bytes_s)
        ports = len(link.ib_bytes_s)
        return Expectation(
            total * IB_SHARE,
            f"{ports} InfiniBand port(s), {gbps(total)} in all, 90% as nccl-tests reach",
        )
    if link.rated_bytes_s is not None and link.iface != "lo":
        rated = link.rated_bytes_s
        how = f"{link.iface}: {gbps(rated)} rated, NCCL's socket transport at half of it"
        return Expectation(rated * NCCL_SOCKET_SHARE, how)
    return None


def expected_busbw(backend: str, reports: Sequence[RankReport]) -> Expectation | None:
    """What the job's all-reduce should reach (bus bandwidth), from every node's report."""
    leaders = _node_leaders(reports)
    if backend == "gloo":
        slowest = _slowest([(r.node, tcp_rate(r.link)) for r in leaders])
        if slowest is None:
            return None
        node, rate = slowest
        return Expectation(
            rate.bytes_s * GLOO_ALLREDUCE_SHARE,
            f"{GLOO_ALLREDUCE_SHARE:g} x the slowest link, {node}'s {rate.how}",
        )
    options: list[Expectation] = []
    per_node = max((sum(1 for r in reports if r.node == n.node) for n in leaders), default=1)
    names = [n for r in reports for n in r.gpu_names[:1]]
    if per_node > 1 and names:
        options.append(intra_node_busbw(names[0]))
    if len(leaders) > 1:
        slowest = _slowest([(r.node, network_busbw(r.link)) for r in leaders])
        if slowest is None:
            return None  # across nodes with no known network speed: nothing sensible to say
        node, net = slowest
        options.append(Expectation(net.bytes_s, f"{node}'s {net.how}"))
    return min(options, key=lambda e: e.bytes_s) if options else None


def expected_p2p(backend: str, here: RankReport, master: RankReport) -> Expectation | None:
    """What a send/receive between rank 0 and ``here`` (another node's first rank) should
    reach."""
    if backend == "gloo":
        slowest = _slowest([(r.node, tcp_rate(r.link)) for r in (here, master)])
        if slowest is None:
            return None
        node, rate = slowest
        return Expectation(
            rate.bytes_s * GLOO_P2P_SHARE, f"{GLOO_P2P_SHARE:g} x {node}'s {rate.how}"
        )
    nets = [
        network_busbw(dataclasses.replace(r.link, ib_bytes_s=r.link.ib_bytes_s[:1]))
        for r in (here, master)
    ]
    known = [n for n in nets if n is not None]
    if not known:
        return None
    net = min(known, key=lambda e: e.bytes_s)
    return Expectation(net.bytes_s, f"one GPU pair uses one port: {net.how}")


def bandwidth_verdict(measured: float, expected: Expectation | None) -> str:
    """``SLOW`` under :data:`SLOW_FRACTION` of the expectation; ``-`` with none to judge by."""
    if expected is None:
        return INFO
    return OK if measured >= SLOW_FRACTION * expected.bytes_s else SLOW


def _node_leaders(reports: Sequence[RankReport]) -> list[RankReport]:
    """Each node's first rank (the one that ran the node's checks), in rank order."""
    seen: dict[str, RankReport] = {}
    for r in sorted(reports, key=lambda r: (r.local_rank, r.rank)):
        seen.setdefault(r.node, r)
    return list(seen.values())


# --- the table ------------------------------------------------------------------------------

CHECKS = (
    "report",
    "python",
    "torch",
    "gpus",
    "run dir free",
    "run dir shared",
    "network",
    "master port",
    "clock skew",
    "p2p bandwidth",
    "group checks",
)
"""The rows of one rank, in table order; the job-wide all-reduce rows come last."""


def evaluate(
    reports: Sequence[RankReport],
    world_size: int,
    *,
    token: str | None = None,
    missing: Mapping[int, tuple[str, str]] | None = None,
) -> list[Finding]:
    """Every finding of one doctor run, in table order.

    ``token``: what the login side wrote into the run directory before the job started (each
    node must have read it back); None when the caller wrote none. ``missing``: for ranks that
    left no report, (node, why) as the caller knows it (srun's account, the local backend's).
    """
    by_rank = {r.rank: r for r in reports}
    master = by_rank.get(0)
    out: list[Finding] = []
    for rank in range(world_size):
        r = by_rank.get(rank)
        if r is None:
            node, why = (missing or {}).get(rank, ("?", ""))
            note = why or f"see logs/rank-{rank}.err: the task did not start, or was killed"
            out.append(Finding(node, rank, "report", "none", FAIL, note))
            continue
        out += _software(r, master)
        out.append(_gpus(r))
        if r.local_rank == 0:
            out += _run_dir(r, token)
            out.append(_network(r, reports))
        if world_size > 1:
            out.append(_port(r, reports))
            out += _clock(r, master)
        out += _group(r)
    if master is not None and world_size > 1:
        out += _p2p(master, by_rank)
        out += _allreduce(master, reports)
    order = {check: i for i, check in enumerate(CHECKS)}
    return sorted(out, key=lambda f: (f.rank is None, f.rank or 0, order.get(f.check, 99)))


def _software(r: RankReport, master: RankReport | None) -> list[Finding]:
    python = f"{r.python} ({r.executable})"
    rows = [Finding(r.node, r.rank, "python", python, OK)]
    if r.torch is None:
        rows.append(
            Finding(
                r.node, r.rank, "torch", "cannot import", FAIL,
                f"{r.torch_error}. HINT: install torch into the environment the job runs in "
                "(env.setup, env.modules or the container), the same on every node",
            )
        )  # fmt: skip
    else:
        extras = [f"CUDA {r.cuda_build}" if r.cuda_build else "CPU build"]
        extras += [f"cuDNN {r.cudnn}"] if r.cudnn else []
        extras += [f"NCCL {r.nccl}"] if r.nccl else []
        rows.append(Finding(r.node, r.rank, "torch", f"{r.torch} ({', '.join(extras)})", OK))
    if master is None or r.rank == 0:
        return rows
    mine = ((r.python, r.executable), (r.torch, r.cuda_build))
    theirs = ((master.python, master.executable), (master.torch, master.cuda_build))
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b and rows[i].verdict == OK:
            rows[i] = dataclasses.replace(
                rows[i],
                verdict=FAIL,
                note=f"differs from rank 0's on {master.node} ({_shown(master, i)}). HINT: "
                "every node must run the same environment: check env.setup and env.modules",
            )
    return rows


def _shown(r: RankReport, i: int) -> str:
    """What the python (0) or torch (1) row of ``r`` shows, for comparisons."""
    return f"{r.python} at {r.executable}" if i == 0 else f"torch {r.torch}, CUDA {r.cuda_build}"


def _gpus(r: RankReport) -> Finding:
    shown = "unset" if r.visible_devices is None else repr(r.visible_devices)
    if r.gpu_names:
        names = sorted(set(r.gpu_names))
        seen = f"{len(r.gpu_names)} x {', '.join(names)}"
    else:
        seen = "no GPU"
    value = f"{seen} (CUDA_VISIBLE_DEVICES {shown})"
    if r.device:
        value += f" -> {r.device}, {r.backend}"
    if r.gpu_error:
        return Finding(r.node, r.rank, "gpus", value, FAIL, r.gpu_error)
    return Finding(r.node, r.rank, "gpus", value, OK if r.torch is not None else INFO)


def _run_dir(r: RankReport, token: str | None) -> list[Finding]:
    rows = []
    if r.free_bytes is not None and r.total_bytes is not None:
        value = f"{human_bytes(r.free_bytes)} free of {human_bytes(r.total_bytes)}"
        if r.write_error:
            rows.append(Finding(r.node, r.rank, "run dir free", value, FAIL, r.write_error))
        elif r.free_bytes < MIN_FREE_BYTES:
            note = (
                f"under {human_bytes(MIN_FREE_BYTES)}: checkpoints will not fit. HINT: free "
                "space there, or use a --runs-dir on a larger file system"
            )
            rows.append(Finding(r.node, r.rank, "run dir free", value, FAIL, note))
        else:
            rows.append(Finding(r.node, r.rank, "run dir free", f"{value}, writable", OK))
    elif r.write_error:
        rows.append(Finding(r.node, r.rank, "run dir free", "unknown", FAIL, r.write_error))
    if token is not None:
        if r.token == token:
            rows.append(Finding(r.node, r.rank, "run dir shared", "sees the login side's file", OK))
        else:
            why = "does not see" if r.token is None else "sees an older"
            note = (
                f"this node {why} doctor/login.token, written before the job started. HINT: "
                "put the runs directory on a file system every node mounts (not /tmp)"
            )
            rows.append(Finding(r.node, r.rank, "run dir shared", "no", FAIL, note))
    return rows


def link_rate(link: Link) -> float | None:
    """What a node's network can carry, for comparing nodes: its InfiniBand ports together,
    else its NIC's rated speed; None on loopback or when unknown."""
    if link.ib_bytes_s:
        return sum(link.ib_bytes_s)
    return None if link.iface == "lo" else link.rated_bytes_s


def _network(r: RankReport, reports: Sequence[RankReport]) -> Finding:
    link = r.link
    parts = [f"{link.iface or 'unknown'}" + (" (one host)" if link.iface == "lo" else "")]
    if link.rated_bytes_s is not None:
        parts.append(f"{link.rated_bytes_s * 8 / GB:g} Gb/s rated")
    if link.ib_bytes_s:
        parts.append(
            f"{len(link.ib_bytes_s)} InfiniBand port(s), {sum(link.ib_bytes_s) * 8 / GB:g} Gb/s"
        )
    value = ", ".join(parts)
    mine = link_rate(link)
    rates = {x.node: link_rate(x.link) for x in _node_leaders(reports)}
    known = {node: rate for node, rate in rates.items() if rate is not None}
    if mine is None or len(known) < 2:
        return Finding(r.node, r.rank, "network", value, INFO)
    best = max(known, key=lambda n: known[n])
    if mine < SLOW_FRACTION * known[best]:
        note = (
            f"under half of {best}'s ({known[best] * 8 / GB:g} Gb/s): a link that negotiated a "
            "lower speed or width, or a node of another kind. HINT: ask the administrators, "
            "or leave the node out (slurm.extra: {exclude: NODE})"
        )
        return Finding(r.node, r.rank, "network", value, SLOW, note)
    return Finding(r.node, r.rank, "network", value, OK)


def _port(r: RankReport, reports: Sequence[RankReport]) -> Finding:
    master_node = next((x.node for x in reports if x.rank == 0), None)
    if r.port_role == "listen":
        if r.port_error:
            value = f"cannot listen on {r.port}" if r.port else "no port"
            return Finding(r.node, r.rank, "master port", value, FAIL, r.port_error)
        value = f"listening on {r.port}; {len(r.reached)} of {r.world_size - 1} other ranks came"
        return Finding(r.node, r.rank, "master port", value, OK)
    if r.port_error is None and r.port_role == "connect":
        ms = 1000 * (r.port_s or 0.0)
        value = f"reached {master_node or 'rank 0'}:{r.port} in {ms:.0f} ms"
        return Finding(r.node, r.rank, "master port", value, OK)
    others = [x for x in reports if x.rank != 0]
    everyone = bool(others) and all(x.port_error for x in others)
    # Every other rank failing points at rank 0's side (its port, its host's firewall).
    blame = master_node if everyone and master_node is not None else None
    value = f"no answer on {master_node}:{r.port}" if r.port is not None else "port unknown"
    return Finding(r.node, r.rank, "master port", value, FAIL, r.port_error or "", blame)


def _clock(r: RankReport, master: RankReport | None) -> list[Finding]:
    if r.local_rank != 0 or master is None:
        return []
    if r.node == master.node:
        return []
    if r.clock_offset_s is None:
        return []
    offset, error = r.clock_offset_s, r.clock_error_s or 0.0
    value = f"{offset * 1000:+.3f} ms vs {master.node} (+-{error * 1000:.3f} ms)"
    if abs(offset) - error > MAX_SKEW_S:
        note = (
            f"over {MAX_SKEW_S:g} s. HINT: this node's clock is not synchronised (NTP/chrony): "
            "tell the cluster's administrators"
        )
        return [Finding(r.node, r.rank, "clock skew", value, FAIL, note)]
    return [Finding(r.node, r.rank, "clock skew", value, OK)]


def _group(r: RankReport) -> list[Finding]:
    if r.group is not None and r.group.startswith("skipped"):
        # One row for the job (rank 0's), not one per rank: the rows above say who failed.
        return [Finding("all", None, "group checks", r.group, INFO)] if r.rank == 0 else []
    if r.group in (None, "done"):
        return []
    if r.group == "started":
        note = "the task ended in the middle of them (killed, or NCCL's watchdog aborted it)"
        return [Finding(r.node, r.rank, "group checks", "unfinished", FAIL, note)]
    return [Finding(r.node, r.rank, "group checks", "failed", FAIL, r.group or "")]


def _p2p(master: RankReport, by_rank: Mapping[int, RankReport]) -> list[Finding]:
    backend = master.backend or "gloo"
    rows = []
    for node, rank, nbytes, seconds in master.p2p:
        here = by_rank.get(rank)
        rate = p2p_bandwidth(nbytes, seconds)
        expected = None if here is None else expected_p2p(backend, here, master)
        verdict = bandwidth_verdict(rate, expected)
        value = f"{gbps(rate)} with {master.node} ({human_bytes(nbytes)} each way)"
        rows.append(Finding(node, rank, "p2p bandwidth", value, verdict, _expected_note(expected)))
    if len(rows) > 1 and all(f.verdict == SLOW for f in rows):
        rows = [dataclasses.replace(f, blame=master.node) for f in rows]  # the common end
    return rows


def _allreduce(master: RankReport, reports: Sequence[RankReport]) -> list[Finding]:
    backend = master.backend or "gloo"
    if not master.allreduce:
        return []
    largest = max(n for n, _ in master.allreduce)
    expected = expected_busbw(backend, reports)
    rows = []
    for nbytes, seconds in master.allreduce:
        bus = bus_bandwidth(nbytes, seconds, master.world_size)
        value = f"busbw {gbps(bus)} (algbw {gbps(nbytes / seconds if seconds > 0 else 0)})"
        check = f"all-reduce {human_bytes(nbytes)}"
        if nbytes == largest:
            verdict = bandwidth_verdict(bus, expected)
            rows.append(Finding("all", None, check, value, verdict, _expected_note(expected)))
        else:
            rows.append(Finding("all", None, check, value, INFO))
    return rows


def _expected_note(expected: Expectation | None) -> str:
    if expected is None:
        return "no expectation: the link's speed is unknown"
    slow = gbps(SLOW_FRACTION * expected.bytes_s)
    return f"expected {gbps(expected.bytes_s)}, SLOW under {slow}: {expected.how}"


def culprits(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    """The nodes to blame, each with its failing rows, in table order."""
    out: dict[str, list[Finding]] = {}
    for f in findings:
        if not f.passed:
            out.setdefault(f.culprit, []).append(f)
    return out


def summary(findings: Sequence[Finding], nodes: Sequence[str]) -> str:
    """One line: everything passed, or which nodes are broken or slow and in what."""
    blamed = culprits(findings)
    if not blamed:
        return f"doctor: every check passed on {len(nodes)} node(s): {', '.join(nodes)}"
    parts = []
    for node, rows in blamed.items():
        word = "broken" if any(f.verdict == FAIL for f in rows) else "slow"
        what = ", ".join(dict.fromkeys(f.check for f in rows))
        parts.append(
            f"{node} is {word} ({what})" if node != "all" else f"the job is {word} ({what})"
        )
    return "doctor: " + "; ".join(parts)


def report_path(out_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its report."""
    return out_dir / f"rank-{rank}.json"


def read_reports(out_dir: Path, world_size: int) -> list[RankReport]:
    """Every report the ranks left in ``out_dir`` (an unreadable one counts as missing)."""
    reports = []
    for rank in range(world_size):
        try:
            data = json.loads(report_path(out_dir, rank).read_text())
            reports.append(RankReport.from_dict(data))
        except (OSError, ValueError, TypeError):
            continue
    return reports
