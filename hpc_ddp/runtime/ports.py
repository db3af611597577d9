"""Making sure the derived master port is free, and telling every rank which one was taken.

An edge (sockets and files). :func:`~hpc_ddp.runtime.distenv.derive_master_port` already keeps jobs
with nearby ids apart, but two unrelated jobs on one node can still derive the same port, and
something else may already listen there. So rank 0, which runs on the master node, probes the
derived port and, if it is taken, the job's deterministic fallbacks; it publishes the port it
chose in the run directory, and the other ranks read it from there:

    RUN_DIR/rendezvous/master_port.<job_ref>.<attempt>

The key names the attempt, so a file left by an earlier attempt is never read. A port fixed by
``dist.port`` or by torchrun is used as given.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from pathlib import Path

from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import DistEnvError
from hpc_ddp.runtime.distenv import DistEnv, derive_master_port

log = logging.getLogger(__name__)

MAX_CANDIDATES = 16
"""How many ports rank 0 tries (the derived one, then hashed fallbacks) before giving up."""


def port_file(dist: DistEnv, rendezvous_dir: Path) -> Path:
    """Where rank 0 publishes the port of this attempt."""
    return rendezvous_dir / f"master_port.{dist.job_ref or 'local'}.{dist.restart_count}"


def resolve_master_port(
    dist: DistEnv, rendezvous_dir: Path, *, timeout_s: float, poll_s: float = 0.05
) -> int:
    """The master port every rank of this attempt will use.

    Rank 0 picks the first free candidate and publishes it; other ranks wait up to
    ``timeout_s`` for the file (:class:`DistEnvError` then, with a hint). A single rank only
    probes: it has no one to tell. A port that was not derived is returned untouched.
    """
    if dist.port_source != "derived":
        return dist.master_port
    if dist.world_size == 1:
        return _first_free_port(dist)
    path = port_file(dist, rendezvous_dir)
    if dist.is_main:
        port = _first_free_port(dist)
        _publish(path, port)
        return port
    return _wait_for_port(path, dist, timeout_s, poll_s)


def _first_free_port(dist: DistEnv) -> int:
    # A race remains: the port is free now, and torch binds it a moment later (after this
    # probe socket is closed, or torch could not bind it at all). Another process may take it in
    # between; then torch fails with "address already in use" and the attempt fails loudly
    # rather than hanging. The window is short because this runs right before
    # init_process_group, and derived ports lie below the ephemeral range, so the kernel does
    # not hand them out to other processes' outgoing connections or bind(port=0) calls.
    tried: list[int] = []
    for candidate in range(MAX_CANDIDATES):
        port = derive_master_port(dist.job_id, dist.restart_count, candidate=candidate)
        if port in tried:
            continue
        tried.append(port)
        if is_port_free(port):
            if candidate:
                log.warning("master port %d is taken; using fallback %d", tried[0], port)
            return port
    raise DistEnvError(
        f"ports {', '.join(map(str, tried))} are all in use on {dist.node_name or 'this node'} "
        f"(job {dist.job_ref}, attempt {dist.restart_count}). HINT: set dist.port to a port "
        "you know is free on the first node."
    )


def is_port_free(port: int) -> bool:
    """True if nothing on this host holds TCP ``port`` (on any IPv4 or IPv6 address)."""
    # No SO_REUSEADDR: without it bind() also refuses ports held by a listener on a specific
    # address and ports in TIME_WAIT, which is the conservative answer we want.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock6:
                sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock6.bind(("::", port))
        except OSError as exc:
            # No IPv6 on this host is fine; only an IPv6-only holder of the port makes it taken.
            return exc.errno != errno.EADDRINUSE
    return True


def _publish(path: Path, port: int) -> None:
    """Write the port so that a reader on any node sees no file or the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, f"{port}\n")


def _wait_for_port(path: Path, dist: DistEnv, timeout_s: float, poll_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        # Listing the directory makes an NFS client revalidate it, so a file created on
        # another node shows up without waiting out the negative lookup cache.
        with contextlib.suppress(OSError):
            os.listdir(path.parent)
        try:
            return int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    raise DistEnvError(
        f"rank {dist.rank} waited {timeout_s:g} s for rank 0 to publish the master port in "
        f"{path}. HINT: the run directory must be on a filesystem every node sees (not /tmp); "
        "if it is, see rank 0's log (logs/rank-0.err) for why it did not get there."
    )
