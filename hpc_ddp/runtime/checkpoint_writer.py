"""Writing checkpoints: atomic, durable files, pruning, and a background writer thread.

Cost of a save (see :class:`CheckpointWriter`): one all-gather of the RNG states, a synchronous
CPU copy of the state on rank 0, then the digest, ``torch.save`` and two ``fsync`` calls on a
background thread while training goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hpc_ddp.durable import write_atomic, write_text_atomic
from hpc_ddp.errors import CheckpointError
from hpc_ddp.runtime.checkpoint_format import (
    LATEST,
    TMP_PREFIX,
    checkpoint_name,
    parse_checkpoint_name,
    weights_digest,
)

log = logging.getLogger(__name__)


def prune_plan(steps: list[int], keep_last: int) -> list[int]:
    """The steps to delete so that the newest ``keep_last`` remain (``keep_last <= 0``: none)."""
    if keep_last <= 0:
        return []
    return sorted(steps)[:-keep_last]


def write_checkpoint(directory: Path, payload: dict[str, Any], keep_last: int) -> Path:
    """Write ``payload`` as ``step-N.pt`` so that a crash at any moment leaves it whole or absent.

    temp file in the same directory -> flush + fsync -> rename -> fsync the directory; then the
    ``latest`` pointer the same way; only then older checkpoints beyond ``keep_last`` go.
    """
    directory.mkdir(parents=True, exist_ok=True)
    step = int(payload["progress"]["step"])
    final = directory / checkpoint_name(step)
    if payload["meta"].get("weights_digest") is None:
        payload["meta"]["weights_digest"] = weights_digest(payload["model"])
    # The temp names start with TMP_PREFIX so that they never match step-*.pt and _prune can
    # sweep up those of a writer killed mid-save.
    tmp = directory / f"{TMP_PREFIX}{final.name}.{os.getpid()}"
    write_atomic(final, lambda f: torch.save(payload, f), tmp=tmp)
    pointer = directory / f"{TMP_PREFIX}{LATEST}.{os.getpid()}"
    write_text_atomic(directory / LATEST, final.name + "\n", tmp=pointer)
    _prune(directory, keep_last, keep=final)
    return final


def _prune(directory: Path, keep_last: int, keep: Path) -> None:
    steps = {s: p for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None}
    for step in prune_plan(list(steps), keep_last):
        if steps[step] != keep:
            steps[step].unlink(missing_ok=True)
    # Temp files of writers that died mid-save (only rank 0 of one job ever writes here).
    mine = f".{os.getpid()}"
    for p in directory.glob(f"{TMP_PREFIX}*"):
        if not p.name.endswith(mine):
            p.unlink(missing_ok=True)


class CheckpointWriter:
    """Writes checkpoints one at a time, on a background thread when ``background`` is set.

    :meth:`submit` takes a payload that is already a CPU :func:`snapshot` (the training thread
    pays for that copy only) and returns at once; it first waits for the previous write, so at
    most one is in flight. :meth:`wait` blocks until the last write is durable and raises the
    :class:`CheckpointError` of a failed one; the stop path calls it before asking for a requeue.
    """

    def __init__(self, directory: Path, keep_last: int, *, background: bool = True) -> None:
        self.directory = directory
        self.keep_last = keep_last
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_path: Path | None = None
        self.last_seconds: float = 0.0

    def submit(self, payload: dict[str, Any]) -> None:
        """Start writing ``payload`` (after the previous write has finished)."""
        self.wait()
        if not self.background:
            self._write(payload)
            self.wait()
            return
        self._thread = threading.Thread(
            target=self._write, args=(payload,), name="hpc-ddp-checkpoint", daemon=False
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until no write is in flight; raise if the last one failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, CheckpointError):
                raise exc
            raise CheckpointError(
                f"writing a checkpoint to {self.directory} failed ({type(exc).__name__}: {exc}). "
                "HINT: check free space and permissions of the run directory."
            ) from exc

    def _write(self, payload: dict[str, Any]) -> None:
        start = time.perf_counter()
        try:
            self.last_path = write_checkpoint(self.directory, payload, self.keep_last)
        except BaseException as exc:
            self._error = exc
            return
        self.last_seconds = time.perf_counter() - start
        log.debug("checkpoint %s written in %.3f s", self.last_path.name, self.last_seconds)
