"""Rank 0's word to the other ranks through the rendezvous store, bounded by its own timeout.

Rank 0 alone reads, verifies and writes checkpoints, which on a slow shared file system can take
minutes for a large state. A rank that waits for it inside a collective (a broadcast) is timed by
the collective's timeout (``dist.timeout_s``), and under NCCL a rank past that timeout is torn
down by the watchdog (SIGABRT), not told in Python. So no rank waits in a collective while rank 0
does file I/O: it waits here, on a key of the store the process group was formed on, for at most
``timeout_s`` (``fault.checkpoint_timeout_s``), and no collective is in flight meanwhile. If rank
0 dies, a store it serves goes with it and the waiting ranks fail at once.

Every rank must call :meth:`Handoff.share` and :meth:`Handoff.meet` at the same points, as for a
collective: the keys are numbered in call order. Values travel as JSON, never as pickles: the
store listens on the network, and unpickling what it hands back could run code.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from hpc_ddp.errors import PeerError

_PREFIX = "hpc-ddp/handoff"


class Handoff:
    """One process's side of the hand-offs between rank 0 and the others (see the module
    docstring). ``store`` is a ``torch.distributed.Store`` (``None`` for a single rank)."""

    def __init__(self, store: Any, *, rank: int, world_size: int, timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._seq = 0

    @classmethod
    def of_default_group(cls, *, timeout_s: float) -> Handoff:
        """The hand-off over the default process group's store (which must exist)."""
        import torch.distributed as dist

        world = dist.get_world_size()
        # Private but stable since torch 1.8: the store every process group is formed on.
        store = dist.distributed_c10d._get_default_store() if world > 1 else None
        return cls(store, rank=dist.get_rank(), world_size=world, timeout_s=timeout_s)

    def share(self, what: str, value: Any = None) -> Any:
        """Rank 0's ``value`` (JSON-able) on every rank; the others wait up to the timeout."""
        key = self._key(what)
        if self.world_size == 1:
            return value
        if self.rank == 0:
            self.store.set(key, json.dumps(value))
            return value
        self._wait(key, what)
        return json.loads(self.store.get(key))

    def meet(self, what: str, error: str | None = None) -> str | None:
        """Wait until every rank got here (bounded by the timeout); the first ``error`` any rank
        brought, or None when none did. Every rank gets the same answer."""
        key = self._key(what)
        if self.world_size == 1:
            return error
        if error is not None:
            # Numbered by arrival: the first failing rank's message is the one everyone reports.
            n = int(self.store.add(f"{key}/errors", 1))
            self.store.set(f"{key}/error/{n}", f"rank {self.rank}: {error}")
        if int(self.store.add(f"{key}/arrived", 1)) == self.world_size:
            self.store.set(f"{key}/all", "1")
        self._wait(f"{key}/all", what)
        if int(self.store.add(f"{key}/errors", 0)) == 0:
            return None
        return bytes(self.store.get(f"{key}/error/1")).decode()

    def _key(self, what: str) -> str:
        self._seq += 1
        return f"{_PREFIX}/{self._seq}/{what}"

    def _wait(self, key: str, what: str) -> None:
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except Exception as exc:  # DistStoreError (timed out) or RuntimeError (store gone)
            raise PeerError(
                f"rank {self.rank} waited for {what} and gave up ({_first_line(exc)}). HINT: "
                f"rank 0 died, or its checkpoint I/O took longer than {self.timeout_s:g} s "
                "(fault.checkpoint_timeout_s): see rank 0's log, check the checkpoint "
                "directory's file system, or raise fault.checkpoint_timeout_s."
            ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
