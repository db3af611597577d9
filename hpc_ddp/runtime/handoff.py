"""One rank's word to the others through the rendezvous store, outside any collective.

Two things in a run make the other ranks wait for one of them while it does slow work:

- rank 0 alone reads, verifies and writes checkpoints, which on a slow shared file system can
  take minutes for a large state (:class:`Handoff`, used by the checkpointer);
- the tutorials' "rank 0 first" (unpack a dataset, build a cache), which they write as two
  barriers around the work (:func:`leader_first`, behind ``Session.main_first``).

A rank that waits inside a collective (a barrier, a broadcast) is timed by the collective's
timeout (``dist.timeout_s``), and under NCCL a rank past it is torn down by the watchdog
(SIGABRT), not told in Python; a stop signal meanwhile cannot be acted on. So the others wait
here instead, on a key of the store the process group was formed on, with a bound of their own,
and no collective is in flight meanwhile. The wait polls the store, so signal handlers run while
a rank waits (the session's only record a stop). If the rank that works dies without a word
(SIGKILL, the OOM killer), the store it serves goes with it (rank 0 serves it under Slurm and in
a plain ``env://`` group), and the waiting ranks fail at once; under torchrun, whose agent serves
the store, the agent ends them itself.

Every rank must make the same calls in the same order, as for a collective: the keys are
numbered in call order. Values travel as JSON, never as pickles: the store listens on the
network, and unpickling what it hands back could run code. This module only talks to the store
object it is given (a ``torch.distributed.Store``, or None for a single rank); it imports no
torch.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hpc_ddp.errors import PeerError

HANDOFF_PREFIX = "hpc-ddp/handoff"
MAIN_FIRST_PREFIX = "hpc-ddp/main-first"
MAIN_FIRST_TIMEOUT_S = 3600.0
"""How long the others wait for the leader's block by default: long enough for unpacking or
indexing a large dataset; a leader that dies is noticed at once, not after this."""
MAX_POLL_S = 0.5
"""The longest pause between two looks at the store: a waiting rank goes on at most this late."""
_MAX_ERROR_CHARS = 4000
TOLD_WAIT_S = 10.0
"""How long a leader that failed in its block waits for the others to read why: a waiting
rank looks every :data:`MAX_POLL_S` at most, and one that finds the store gone could only
guess that rank 0 was killed."""

Sleep = Callable[[float], None]


class _StoreGone(Exception):
    """The store's connection broke while a rank waited: its server (rank 0) is gone."""


def _await_key(store: Any, key: str, timeout_s: float, sleep: Sleep) -> bytes | None:
    """The value under ``key`` once it is there; None when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            if store.check([key]):
                return bytes(store.get(key))
        except Exception as exc:  # DistStoreError, RuntimeError: the connection broke
            raise _StoreGone(_first_line(exc)) from None
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sleep(min(pause, left))  # a stop signal's handler runs here: it only records
        pause = min(MAX_POLL_S, pause * 1.5)


class Handoff:
    """One process's side of rank 0's hand-offs to the others around checkpoint I/O (see the
    module docstring), each wait bounded by ``timeout_s`` (``fault.checkpoint_timeout_s``)."""

    def __init__(
        self,
        store: Any,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._seq = 0

    def share(self, what: str, value: Any = None) -> Any:
        """Rank 0's ``value`` (JSON-able) on every rank; the others wait up to the timeout."""
        key = self._key(what)
        if self.world_size == 1:
            return value
        if self.rank == 0:
            self.store.set(key, json.dumps(value))
            return value
        return json.loads(self._wait(key, what))

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
        return f"{HANDOFF_PREFIX}/{self._seq}/{what}"

    def _wait(self, key: str, what: str) -> bytes:
        try:
            value = _await_key(self.store, key, self.timeout_s, self._sleep)
            why = f"not there after {self.timeout_s:g} s"
        except _StoreGone as gone:
            value, why = None, f"the store is gone: {gone}"
        if value is None:
            raise PeerError(
                f"rank {self.rank} waited for {what} and gave up ({why}). HINT: "
                f"rank 0 died, or its checkpoint I/O took longer than {self.timeout_s:g} s "
                "(fault.checkpoint_timeout_s): see rank 0's log, check the checkpoint "
                "directory's file system, or raise fault.checkpoint_timeout_s."
            )
        return value


@dataclass(frozen=True)
class Turn:
    """One use of "rank 0 first": who leads, and the key its word goes under."""

    key: str
    """The store key, numbered by call (every rank makes the same calls in the same order)."""
    is_leader: bool
    leader: str
    """The leader as messages name it: ``rank 0``, ``local rank 0 of node n2``."""
    rank: int
    """This process's global rank, for messages."""
    timeout_s: float
    followers: int = 0
    """How many ranks wait for the leader: a leader that fails gives them
    :data:`TOLD_WAIT_S` to read its error before its exception may end the process (and,
    on rank 0, the store with it)."""


class Turns:
    """The "rank 0 first" blocks of one session, numbered per group (``all``, ``node<k>``):
    the number is in the store key, so every rank must enter the same blocks in the same
    order."""

    def __init__(self) -> None:
        self._taken: dict[str, int] = {}

    def next(
        self, group: str, *, is_leader: bool, leader: str, rank: int, members: int, timeout_s: float
    ) -> Turn:
        """The group's next turn for ``rank`` among ``members`` ranks, led by ``leader`` (as
        messages name it)."""
        n = self._taken[group] = self._taken.get(group, 0) + 1
        key = f"{MAIN_FIRST_PREFIX}/{group}/{n}"
        return Turn(key, is_leader, leader, rank, timeout_s, followers=members - 1)


def describe(exc: BaseException) -> str:
    """``ValueError: boom`` (bounded): what the others are told of the leader's failure."""
    text = str(exc).strip() or "(no message)"
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + " ..."
    return f"{type(exc).__name__}: {text}"


@contextlib.contextmanager
def leader_first(store: Any, turn: Turn, *, sleep: Sleep = time.sleep) -> Iterator[None]:
    """The leader runs the block at once and then posts its outcome (``done`` or its error);
    the others run it only after a ``done``, and raise :class:`~hpc_ddp.errors.PeerError`
    naming the leader's error otherwise. ``store`` is None when this process has no one to
    wait for or tell."""
    if store is None:
        yield
        return
    if not turn.is_leader:
        _wait_for_leader(store, turn, sleep)
        yield
        return
    try:
        yield
    except GeneratorExit:
        raise
    except BaseException as exc:
        _post(store, turn.key, {"error": describe(exc)})
        _wait_until_told(store, turn, sleep)
        raise
    _post(store, turn.key, {"done": True})


def _wait_until_told(store: Any, turn: Turn, sleep: Sleep) -> None:
    """Wait (up to :data:`TOLD_WAIT_S`) until every follower has read the leader's error."""
    deadline = time.monotonic() + TOLD_WAIT_S
    with contextlib.suppress(Exception):  # the store gone: nobody is left to tell
        while int(store.add(f"{turn.key}/told", 0)) < turn.followers:
            if time.monotonic() >= deadline:
                return
            sleep(0.02)


def _post(store: Any, key: str, value: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):  # the store gone too: the others notice that instead
        store.set(key, json.dumps(value))


def _wait_for_leader(store: Any, turn: Turn, sleep: Sleep) -> None:
    try:
        value = _await_key(store, turn.key, turn.timeout_s, sleep)
    except _StoreGone as gone:
        raise PeerError(
            f"rank {turn.rank} lost the connection to rank 0's store while it waited for "
            f"{turn.leader} to finish its main_first block ({gone}): rank 0 died (killed, out "
            "of memory?). HINT: see rank 0's log (logs/rank-0.err) and `hpc-ddp status "
            "RUN_DIR` for why it ended."
        ) from None
    if value is None:
        raise PeerError(
            f"rank {turn.rank} waited {turn.timeout_s:g} s for {turn.leader} to finish its "
            "main_first block, in vain. HINT: it is stuck or slower than that: see its log; "
            "pass a longer timeout_s to main_first() if the work takes longer."
        )
    word = json.loads(value.decode())
    if "error" in word:
        with contextlib.suppress(Exception):  # the leader waits for this before it exits
            store.add(f"{turn.key}/told", 1)
        error = str(word["error"])
        hint = "" if "HINT:" in error else " HINT: its traceback is in its own log."
        raise PeerError(
            f"rank {turn.rank} did not run its main_first block: {turn.leader} failed in it: "
            f"{error}{hint}"
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
