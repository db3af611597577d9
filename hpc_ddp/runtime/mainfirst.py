"""Rank 0 first: one rank prepares (unpacks, converts, caches), the others use its work after.

The tutorials write it as two barriers, ``if rank != 0: barrier()`` before the work and
``if rank == 0: barrier()`` after it. That holds a collective open for as long as rank 0 works:

- a collective is bounded by the process group's timeout (``dist.timeout_s``); under NCCL the
  watchdog aborts a process whose collective outlasts it, however healthy rank 0 is;
- if rank 0 fails in the block it never reaches its barrier, and the others wait out the
  whole timeout to fail without knowing why;
- a stop signal meanwhile cannot be acted on: the ranks are not at an agreement point.

Here the others wait outside any collective, on one key of the store the process group was
formed on, with a bound of their own (``timeout_s``). The leader (rank 0, or a node's local
rank 0) writes the key when it leaves the block: ``done``, or its error, which the others then
raise as a :class:`~hpc_ddp.errors.PeerError` naming it. A leader that dies without a word
(SIGKILL, the OOM killer) takes the store it serves with it (rank 0 serves it under Slurm and
in a plain ``env://`` group), and the others fail at once; under torchrun, whose agent serves
the store, the agent ends the others itself.

The wait polls the store, so signal handlers run while a rank waits. The session's only
record a stop (:class:`~hpc_ddp.runtime.stopflag.StopFlag`); every rank then stops together at
the session's next agreement point after the block. Values travel as JSON, never as pickles.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hpc_ddp.errors import PeerError

KEY_PREFIX = "hpc-ddp/main-first"
MAIN_FIRST_TIMEOUT_S = 3600.0
"""How long the others wait for the leader's block by default: long enough for unpacking or
indexing a large dataset; a leader that dies is noticed at once, not after this."""
MAX_POLL_S = 0.5
"""The longest pause between two looks at the store: the others start at most this late."""
_MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Turn:
    """One use of the ordering: who leads, and the key its word goes under."""

    key: str
    """The store key, numbered by call (every rank makes the same calls in the same order)."""
    is_leader: bool
    leader: str
    """The leader as messages name it: ``rank 0``, ``local rank 0 of node n2``."""
    rank: int
    """This process's global rank, for messages."""
    timeout_s: float


def describe(exc: BaseException) -> str:
    """``ValueError: boom`` (bounded): what the others are told of the leader's failure."""
    text = str(exc).strip() or "(no message)"
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + " ..."
    return f"{type(exc).__name__}: {text}"


@contextlib.contextmanager
def leader_first(
    store: Any, turn: Turn, *, sleep: Callable[[float], None] = time.sleep
) -> Iterator[None]:
    """The leader runs the block at once and then posts its outcome; the others run it only
    after a ``done`` (see the module docstring). ``store`` is the process group's
    ``torch.distributed.Store``; None when this process has no one to wait for or tell."""
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
        raise
    _post(store, turn.key, {"done": True})


def _post(store: Any, key: str, value: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):  # the store gone too: the others notice that instead
        store.set(key, json.dumps(value))


def _wait_for_leader(store: Any, turn: Turn, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + turn.timeout_s
    pause = 0.01
    while True:
        try:
            if store.check([turn.key]):
                word = json.loads(bytes(store.get(turn.key)).decode())
                break
        except Exception as exc:  # the store's connection broke: its server (rank 0) is gone
            raise PeerError(
                f"rank {turn.rank} lost the connection to rank 0's store while it waited for "
                f"{turn.leader} to finish its main_first block ({_first_line(exc)}): rank 0 "
                "died (killed, out of memory?). HINT: see rank 0's log (logs/rank-0.err) and "
                "`hpc-ddp status RUN_DIR` for why it ended."
            ) from None
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerError(
                f"rank {turn.rank} waited {turn.timeout_s:g} s for {turn.leader} to finish "
                "its main_first block, in vain. HINT: it is stuck or slower than that: see its "
                "log; pass a longer timeout_s to main_first() if the work takes longer."
            )
        sleep(min(pause, left))  # a stop signal's handler runs here: it only records
        pause = min(MAX_POLL_S, pause * 1.5)
    if "error" in word:
        error = str(word["error"])
        hint = "" if "HINT:" in error else " HINT: its traceback is in its own log."
        raise PeerError(
            f"rank {turn.rank} did not run its main_first block: {turn.leader} failed in it: "
            f"{error}{hint}"
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
