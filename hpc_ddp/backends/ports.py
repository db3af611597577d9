"""The TCP ports where a launch's ranks meet (``MASTER_PORT``): a range of their own. Pure.

Every backend's ranks meet there: a Slurm job's port is derived from its id
(:func:`hpc_ddp.runtime.distenv.derive_master_port`), a local launch's is probed free
(:func:`hpc_ddp.backends.local.plan.free_port`).
"""

from __future__ import annotations

PORT_BASE = 20000
PORT_SLOTS = 12763
"""Ranks meet in ``[PORT_BASE, PORT_BASE + PORT_SLOTS)`` = 20000-32762.

Below Linux's default ephemeral range (32768-60999, ``net.ipv4.ip_local_port_range``): the
kernel hands ephemeral ports to every outgoing connection and to every ``bind(port=0)``, which
includes gloo's and NCCL's own peer sockets; a port in that range could be taken by a
neighbouring job's transient socket between our probe and torch's bind. Above 20000 to stay
clear of the usual fixed services (ssh, Slurm's 6817-6819, X11, Jupyter 8888, TensorBoard
6006). The slot count is prime so any non-zero multiplier permutes the slots."""

__all__ = ["PORT_BASE", "PORT_SLOTS"]
