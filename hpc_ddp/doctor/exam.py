"""``hpc-ddp doctor`` on each task: what this task would really run with, and whether the
allocation's nodes can work together. The login side reads the reports back
(:mod:`hpc_ddp.cli.cmd_doctor`); :mod:`hpc_ddp.doctor.judgement` judges them.

The doctor job is the user's job with this module as its entry point
(``entrypoint: hpc_ddp.doctor.exam:main``), so it runs through the same script, ``srun`` line,
modules, setup lines, container and interpreter as the job itself would. Each task writes
``RUN_DIR/doctor/rank-N.json`` after each phase:

1. this task: Python, torch (CUDA, cuDNN, NCCL), the GPUs it sees and the device and backend
   the job would use; on each node's first rank also the run directory's file system (free
   space, writable, shared: the login side's token read back) and the network link;
2. the master port: rank 0 listens on the port the job would get (derived, or ``dist.port``)
   and every other rank connects to it and says hello; rank 0 answers each whether all ranks
   came, so nobody starts a process group that cannot form;
3. in the process group (the backend the job would use): the clock offset of every other
   node's first rank against rank 0 (NTP-style round trips), a send/receive round trip
   between rank 0 and each of them (names a slow node), and all-reduces of a few sizes.

Every wait is bounded by ``dist.timeout_s`` (the doctor's ``--timeout``), and a task exits 0
whatever it found, so that srun never ends the other tasks' checks early. Nothing here judges:
a task only measures and records.

In an allocation that is already running (a relaunch checking its nodes first),
``srun ... python -m hpc_ddp.doctor.exam RUN_DIR OUT_DIR`` runs the same checks with the run's
own config and writes the reports to ``OUT_DIR`` (a fresh one per run of the checks: rank 0's
word on its port is kept there); :func:`hpc_ddp.doctor.judgement.read_reports` and
:func:`hpc_ddp.doctor.judgement.evaluate` then give the findings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_ddp.config.load import load_resolved_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.doctor.judgement import (
    ALLREDUCE_BYTES,
    ALLREDUCE_ITERS,
    LOOPBACK_STREAM_BYTES,
    P2P_BYTES,
    TOKEN_FILE,
    best_offset,
    report_path,
)
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.layout import RUN_DIR_ENV, RunPaths
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env
from hpc_ddp.runtime.handoff import describe

log = logging.getLogger(__name__)

MASTER_FILE = "master.json"
"""Rank 0's word on its port (``{"port", "error"}``), so that no rank waits for a listener
that failed."""
CLOCK_ROUNDS = 5
P2P_REPEATS = 3
ALLREDUCE_REPEATS = 3
SECONDS_PER_NODE = 2.0
"""Added to the group's timeout per node: rank 0 measures the nodes one after another while
the other ranks wait for it in the next collective."""


def main() -> int:
    """The doctor job's entry point on every task (``hpc-ddp run RUN_DIR`` calls it)."""
    paths = RunPaths(Path(os.environ[RUN_DIR_ENV]))
    examine(paths, load_resolved_config(paths.config), os.environ)
    return 0


def examine(
    paths: RunPaths, cfg: JobConfig, env: Mapping[str, str], *, out_dir: Path | None = None
) -> dict[str, Any]:
    """Run this task's checks (see the module docstring) and write its report to ``out_dir``
    (default ``RUN_DIR/doctor``); returns the report."""
    with contextlib.suppress(ValueError, KeyError):  # no session catches it: must not kill us
        name = cfg.requeue.signal.upper()
        signal.signal(
            signal.Signals[name if name.startswith("SIG") else f"SIG{name}"], signal.SIG_IGN
        )
    exam = _Exam(paths, cfg, env, out_dir or paths.doctor)
    exam.run()
    return exam.facts


class _Exam:
    """One task's checks and what they found so far (``facts``, the report being written)."""

    def __init__(self, paths: RunPaths, cfg: JobConfig, env: Mapping[str, str], out: Path):
        self.paths, self.cfg, self.env, self.out = paths, cfg, env, out
        self.timeout_s = float(cfg.dist.timeout_s)
        self.dist: DistEnv = derive_dist_env(env, port=cfg.dist.port)
        d = self.dist
        self.node = d.node_name or socket.gethostname()
        self.facts: dict[str, Any] = {
            "rank": d.rank,
            "local_rank": d.local_rank,
            "node": self.node,
            "world_size": d.world_size,
        }

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(report_path(self.out, self.dist.rank), json.dumps(self.facts))

    def run(self) -> None:
        self._software()
        if self.dist.local_rank == 0:
            self._run_dir()
            self._guarded("link", self._link)
        self.save()
        if self.dist.world_size == 1:
            return
        port, go = self._port()
        self.save()
        if not go:
            self.facts["group"] = "skipped: not every rank could join the process group"
        else:
            self._group(port)
        self.save()

    def _guarded(self, what: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:  # a check that breaks is a finding, never the end of the job
            log.warning("doctor: the %s check failed: %s", what, describe(exc))

    # --- phase 1: this task --------------------------------------------------------------

    def _software(self) -> None:
        f = self.facts
        f["python"], f["executable"] = platform.python_version(), sys.executable
        try:
            import torch
        except Exception as exc:
            f["torch_error"] = describe(exc)
            return
        f["torch"], f["cuda_build"] = torch.__version__, torch.version.cuda
        cudnn: Any = torch.backends.cudnn  # untyped in torch's stubs
        nccl: Any = torch.cuda.nccl
        with contextlib.suppress(Exception):
            if cudnn.is_available():
                f["cudnn"] = cudnn_version(int(cudnn.version()))
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                version = nccl.version()  # (2, 21, 5), or one int in older torch
                f["nccl"] = (
                    ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
                )
        self._gpus(torch)

    def _gpus(self, torch: Any) -> None:
        from hpc_ddp.runtime.procgroup import (
            check_grant,
            choose_backend,
            choose_device,
            gpu_grant,
        )

        f, env = self.facts, self.env
        visible = env.get("CUDA_VISIBLE_DEVICES")
        f["visible_devices"] = visible
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        f["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(count)]
        try:
            grant = gpu_grant(self.dist, env)
            check_grant(grant, count, visible, torch.version.cuda)
            backend = choose_backend(self.cfg.dist.backend, count > 0, grant.asked)
            usable = count if grant.asked is not False or backend == "nccl" else 0
            f["backend"] = backend
            f["device"] = choose_device(self.dist, usable, grant.per_task, visible)
        except HpcDdpError as exc:
            f["gpu_error"] = str(exc)

    def _run_dir(self) -> None:
        f, root = self.facts, self.paths.root
        try:
            usage = shutil.disk_usage(root)
            f["free_bytes"], f["total_bytes"] = usage.free, usage.total
        except OSError as exc:
            f["write_error"] = f"cannot stat {root}: {exc.strerror or exc}"
            return
        probe = self.out / f".probe-{self.node}-{self.dist.rank}"
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            write_text_atomic(probe, "probe\n")
            if probe.read_text() != "probe\n":
                raise OSError("the file read back differs from what was written")
            probe.unlink()
        except OSError as exc:
            f["write_error"] = (
                f"cannot write in {self.out}: {exc.strerror or exc}. HINT: the run directory "
                "must be writable from every node (check the mount and your quota)"
            )
        with contextlib.suppress(OSError):
            os.listdir(self.out)  # makes an NFS client look again rather than trust its cache
            f["token"] = (self.out / TOKEN_FILE).read_text().strip()

    def _link(self) -> None:
        f = self.facts
        iface = route_iface(self.dist.master_addr)
        ib = infiniband_rates()
        f["link"] = {
            "iface": iface,
            "rated_bytes_s": nic_rate(iface),
            "loopback_bytes_s": loopback_stream_rate(LOOPBACK_STREAM_BYTES),
            "ib_bytes_s": ib,
        }

    # --- phase 2: the master port ----------------------------------------------------------

    def _ready(self) -> bool:
        return "torch" in self.facts and "gpu_error" not in self.facts

    def _port(self) -> tuple[int | None, bool]:
        """(the port, whether every rank may now form the process group)."""
        from hpc_ddp.runtime.procgroup import resolve_master_port

        f = self.facts
        f["port_role"] = "listen" if self.dist.is_main else "connect"
        try:
            port = resolve_master_port(self.dist, self.paths.rendezvous, timeout_s=self.timeout_s)
        except HpcDdpError as exc:
            f["port_error"] = str(exc)
            self._tell_master(None, str(exc))
            return None, False
        f["port"] = port
        try:
            if self.dist.is_main:
                return port, self._serve(port)
            return port, self._reach(port)
        except _PortFault as exc:
            f["port_error"] = str(exc)
            return port, False

    def _tell_master(self, port: int | None, error: str | None) -> None:
        if self.dist.is_main:
            write_text_atomic(self.out / MASTER_FILE, json.dumps({"port": port, "error": error}))

    def _master_error(self) -> str | None:
        with contextlib.suppress(OSError, ValueError):
            os.listdir(self.out)
            return json.loads((self.out / MASTER_FILE).read_text()).get("error")  # type: ignore[no-any-return]
        return None

    def _serve(self, port: int) -> bool:
        """Rank 0: listen, take every other rank's hello, answer all of them."""
        try:
            listener = listen(port)
        except OSError as exc:
            error = (
                f"rank 0 cannot listen on port {port}: {exc.strerror or exc}. HINT: another "
                "process on this node holds it; a derived port moves on by itself, a fixed "
                "dist.port does not: choose another or leave it unset"
            )
            self._tell_master(port, error)
            raise _PortFault(error) from None
        self._tell_master(port, None)
        deadline = time.monotonic() + self.timeout_s
        hellos: dict[int, tuple[socket.socket, dict[str, Any]]] = {}
        with listener:
            listener.settimeout(0.2)
            while len(hellos) < self.dist.world_size - 1 and time.monotonic() < deadline:
                got = _accept_hello(listener, deadline)
                if got is not None:
                    hellos[int(got[1]["rank"])] = got
        self.facts["reached"] = sorted(hellos)
        go = len(hellos) == self.dist.world_size - 1 and self._ready()
        go = go and all(h.get("ready") for _, h in hellos.values())
        for conn, _ in hellos.values():
            with contextlib.suppress(OSError), conn:
                conn.sendall(json.dumps({"go": go}).encode() + b"\n")
                conn.settimeout(2.0)
                conn.recv(1)  # the peer closes first: the wait state stays on its side
        return go

    def _reach(self, port: int) -> bool:
        """Every other rank: connect to rank 0's port, say hello, wait for its answer."""
        addr, deadline = self.dist.master_addr, time.monotonic() + self.timeout_s
        began = time.monotonic()
        conn = self._connect(addr, port, deadline)
        self.facts["port_s"] = time.monotonic() - began
        with conn:
            hello = {"rank": self.dist.rank, "node": self.node, "ready": self._ready()}
            conn.sendall(json.dumps(hello).encode() + b"\n")
            conn.settimeout(0.5)
            data = b""
            while b"\n" not in data:
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    self._check_master(f"{addr}:{port} took the connection", deadline)
                    continue
                if not chunk:
                    raise _PortFault(f"{addr}:{port} closed the connection without an answer")
                data += chunk
        return bool(json.loads(data.split(b"\n", 1)[0]).get("go"))

    def _connect(self, addr: str, port: int, deadline: float) -> socket.socket:
        while True:
            try:
                return socket.create_connection((addr, port), timeout=2.0)
            except OSError as exc:
                self._check_master(f"cannot connect to {addr}:{port} ({exc})", deadline)
                time.sleep(0.2)

    def _check_master(self, what: str, deadline: float) -> None:
        """Give up at the deadline, or at once when rank 0 said it could not listen."""
        error = self._master_error()
        if error is not None:
            raise _PortFault(f"{what}; {error.split('. HINT:')[0]}")
        if time.monotonic() >= deadline:
            raise _PortFault(
                f"{what}, and rank 0 did not answer within {self.timeout_s:g} s. HINT: check "
                f"that this node can reach {self.dist.master_addr} on that port (firewall, "
                "routing) and see rank 0's log"
            )

    # --- phase 3: the process group ------------------------------------------------------------

    def _group(self, port: int | None) -> None:
        from hpc_ddp.runtime.procgroup import destroy_process_group, init_process_group

        f = self.facts
        f["group"] = "started"
        self.save()  # a task that dies in there leaves this word behind
        dist = (
            self.dist
            if port is None
            else replace(self.dist, master_port=port, port_source="config")
        )
        nodes = len(set(self.dist.nodelist)) or 1
        timeout = int(self.timeout_s + SECONDS_PER_NODE * nodes)
        cfg = replace(self.cfg.dist, timeout_s=timeout)
        try:
            info = init_process_group(dist, cfg, self.paths.root, self.env)
            self._measure(info.backend)
            f["group"] = "done"
        except Exception as exc:
            f["group"] = describe(exc)
        finally:
            destroy_process_group(together=f["group"] == "done")

    def _measure(self, backend: str) -> None:
        import torch.distributed as tdist

        from hpc_ddp.runtime.procgroup import collective_device

        device = collective_device(backend)
        layout: list[Any] = [None] * self.dist.world_size
        tdist.all_gather_object(layout, (self.dist.rank, self.dist.local_rank, self.node))
        master_node = layout[0][2]
        leaders = [(r, n) for r, lr, n in layout if lr == 0 and n != master_node]
        for leader, node in leaders:
            self._clock_with(leader, device)
            self._p2p_with(leader, node, device, backend)
        self._allreduce(device, backend)

    def _clock_with(self, leader: int, device: Any) -> None:
        import torch
        import torch.distributed as tdist

        t = torch.zeros(1, dtype=torch.float64, device=device)
        if self.dist.is_main:
            for _ in range(CLOCK_ROUNDS):
                tdist.recv(t, leader)
                _sync(device)
                t.fill_(time.time())
                tdist.send(t, leader)
        elif self.dist.rank == leader:
            samples = []
            for _ in range(CLOCK_ROUNDS):
                sent = time.time()
                t.fill_(sent)
                tdist.send(t, 0)
                tdist.recv(t, 0)
                peer = float(t.item())  # waits for the data, on a GPU too
                samples.append((sent, peer, time.time()))
            # rank 0's clock minus ours is its offset: ours against rank 0 is the opposite
            offset, error = best_offset(samples)
            self.facts["clock_offset_s"], self.facts["clock_error_s"] = -offset, error

    def _p2p_with(self, leader: int, node: str, device: Any, backend: str) -> None:
        import torch
        import torch.distributed as tdist

        nbytes = P2P_BYTES[backend]
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        if self.dist.is_main:
            best = math.inf
            for _ in range(P2P_REPEATS):
                began = time.perf_counter()
                tdist.send(buf, leader)
                tdist.recv(buf, leader)
                _sync(device)
                best = min(best, time.perf_counter() - began)
            self.facts.setdefault("p2p", []).append([node, leader, nbytes, best])
        elif self.dist.rank == leader:
            for _ in range(P2P_REPEATS):
                tdist.recv(buf, 0)
                tdist.send(buf, 0)
            _sync(device)

    def _allreduce(self, device: Any, backend: str) -> None:
        import torch
        import torch.distributed as tdist

        results = []
        for nbytes, iters in zip(ALLREDUCE_BYTES[backend], ALLREDUCE_ITERS[backend], strict=True):
            x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
            tdist.all_reduce(x)  # warm-up: connections, buffers
            _sync(device)
            best = math.inf
            for _ in range(ALLREDUCE_REPEATS):
                tdist.barrier()
                began = time.perf_counter()
                for _ in range(iters):
                    tdist.all_reduce(x)
                _sync(device)
                took = torch.tensor([(time.perf_counter() - began) / iters], device=device)
                tdist.all_reduce(took, op=tdist.ReduceOp.MAX)  # the slowest rank's time counts
                best = min(best, float(took.item()))
            results.append([nbytes, best])
            del x
        if self.dist.is_main:
            self.facts["allreduce"] = results


def cudnn_version(code: int) -> str:
    """cuDNN's version number as people write it: 90100 -> 9.1.0, 8902 -> 8.9.2."""
    major, rest = (code // 10000, code % 10000) if code >= 90000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


class _PortFault(Exception):
    """The port check failed on this rank (the message says how)."""


def _sync(device: Any) -> None:
    """Wait for the GPU's queued work (NCCL's calls return before the data has moved)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _accept_hello(
    listener: socket.socket, deadline: float
) -> tuple[socket.socket, dict[str, Any]] | None:
    """One connection and its hello line, or None (nothing yet, or a peer that said nothing
    sensible)."""
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        return None
    conn.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
    try:
        data = b""
        while b"\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                raise ValueError("closed before its hello")
            data += chunk
        hello = json.loads(data.split(b"\n", 1)[0])
        int(hello["rank"])
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None
    return conn, hello


def listen(port: int) -> socket.socket:
    """A socket listening on ``port`` on every address (IPv6 and IPv4 where the host can)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(
            ("::", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024
        )
    return socket.create_server(("0.0.0.0", port), backlog=1024)


# --- the node's network, for the bandwidth expectations -------------------------------------


def route_iface(host: str) -> str | None:
    """The interface this node reaches ``host`` through (``lo`` for itself on loopback), or
    None when it cannot tell. A UDP ``connect`` sends nothing; it only asks the routing table."""
    try:
        ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    if local.startswith("127."):
        return "lo"
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == local:
            return name
    return None


def _ipv4_of(iface: str) -> str | None:
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", iface[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def nic_rate(iface: str | None, sys_net: Path = Path("/sys/class/net")) -> float | None:
    """The rated speed of ``iface`` in bytes/s (``speed`` is in Mb/s; -1 or unreadable for
    loopback and many virtual NICs: None)."""
    if iface is None or iface == "lo":
        return None
    try:
        mbits = int((sys_net / iface / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return mbits * 1e6 / 8 if mbits > 0 else None


def infiniband_rates(sys_ib: Path = Path("/sys/class/infiniband")) -> list[float]:
    """Line rates (bytes/s) of this node's active InfiniBand (or RoCE) ports."""
    rates = []
    for port in sorted(sys_ib.glob("*/ports/*")):
        try:
            if "ACTIVE" not in (port / "state").read_text():
                continue
            rates.append(float((port / "rate").read_text().split()[0]) * 1e9 / 8)
        except (OSError, ValueError, IndexError):
            continue
    return rates


def loopback_stream_rate(nbytes: int, repeats: int = 2) -> float | None:
    """Bytes/s of one TCP stream over this node's loopback (the best of ``repeats``)."""
    best: float | None = None
    for _ in range(repeats):
        rate = _one_stream(nbytes)
        if rate is not None:
            best = rate if best is None else max(best, rate)
    return best


def _one_stream(nbytes: int, chunk: int = 1 << 20) -> float | None:
    try:
        server = socket.create_server(("127.0.0.1", 0))
    except OSError:
        return None
    received = [0]

    def drain() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                buf = bytearray(chunk)
                while received[0] < nbytes:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    received[0] += n

    with server:
        server.settimeout(10.0)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            with socket.create_connection(server.getsockname(), timeout=10.0) as client:
                data = bytes(chunk)
                began = time.perf_counter()
                for _ in range(nbytes // chunk):
                    client.sendall(data)
                reader.join(10.0)
                took = time.perf_counter() - began
        except OSError:
            return None
    return received[0] / took if received[0] == nbytes and took > 0 else None


if __name__ == "__main__":
    # In a running allocation: srun ... python -m hpc_ddp.doctor.exam RUN_DIR [OUT_DIR]
    _paths = RunPaths(Path(sys.argv[1]))
    _out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    examine(_paths, load_resolved_config(_paths.config), os.environ, out_dir=_out)
