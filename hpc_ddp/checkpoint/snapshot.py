"""Snapshots: a copy of the training state in host memory, in the types a checkpoint may hold.

This is what the training thread pays for a checkpoint: a memory copy into host buffers kept
from the previous save (no fresh memory to fault in), with tensors on a GPU copied into pinned
buffers asynchronously. Digests and the write happen later, off the training thread
(:mod:`hpc_ddp.checkpoint.writer`). The copy also holds the format to the types a
``weights_only`` load accepts, so a value that could not be read back fails at save time.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

import torch

from hpc_ddp.errors import CheckpointError

__all__ = ["SnapshotBuffers", "snapshot"]

log = logging.getLogger(__name__)

_PLAIN = (bytes, type(None), torch.dtype, torch.device)
_EXACT = frozenset((int, float, str, bool, bytes, type(None)))


def snapshot(obj: Any, where: str = "checkpoint") -> Any:
    """A deep copy with tensors copied to CPU, in only the types a weights-only load accepts.

    Training can go on changing the original while the copy is written. Anything a
    ``weights_only`` load would refuse raises here, at save time, rather than at resume time.
    """
    return SnapshotBuffers(keep=False).snapshot(obj, where)


class SnapshotBuffers:
    """Host buffers for snapshots, kept from one snapshot to the next.

    Copying into fresh memory runs at about 1 GB/s here (the kernel zeroes and maps every page
    on first touch); into buffers already mapped it runs at memory speed, 5-15 GB/s. So rank 0
    keeps one host copy of the state between checkpoints, and a checkpoint blocks training for a
    memory copy only. A snapshot's tensors are overwritten by the next snapshot: write it first
    (the :class:`~hpc_ddp.checkpoint.checkpointer.Checkpointer` waits for the write in flight
    before it takes the next snapshot). Tensors on a GPU are copied into pinned buffers,
    asynchronously, with one wait at the end.
    """

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self._buffers: dict[str, torch.Tensor] = {}
        self._seen: set[str] = set()
        self._gpus: set[torch.device] = set()

    def snapshot(self, obj: Any, where: str = "checkpoint") -> Any:
        """A copy of ``obj`` (see :func:`snapshot`), its tensors in this object's buffers."""
        self._seen = set()
        self._gpus = set()
        out = self._walk(obj, where)
        for device in self._gpus:
            torch.cuda.synchronize(device)  # the device-to-host copies are done: now it is ours
        for path in [p for p in self._buffers if p not in self._seen]:
            del self._buffers[path]  # a tensor that is gone (a param group removed)
        return out

    def _tensor(self, t: torch.Tensor, where: str) -> torch.Tensor:
        t = t.detach()
        gpu = t.device.type == "cuda"
        buf = self._buffers.get(where)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = _host_buffer(t, pinned=gpu)
            if self.keep:
                self._buffers[where] = buf
        self._seen.add(where)
        if gpu and buf.is_pinned():
            self._gpus.add(t.device)
            return buf.copy_(t, non_blocking=True)
        return buf.copy_(t)

    def _walk(self, obj: Any, where: str) -> Any:
        if type(obj) in _EXACT:  # the common case first: an optimizer's state is mostly these
            return obj
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, where)
        # Subclasses (torch's TorchVersion, enums, numpy scalars) would not load: plain values.
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, numbers.Integral):
            return int(obj)
        if isinstance(obj, numbers.Real):
            return float(obj)
        if isinstance(obj, _PLAIN):
            return obj
        if isinstance(obj, Mapping):
            return {k: self._walk(v, f"{where}[{k!r}]") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            items = [self._walk(v, f"{where}[{i}]") for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        raise CheckpointError(
            f"{where} holds a {type(obj).__module__}.{type(obj).__qualname__}, which a "
            "weights-only load cannot read. HINT: store plain numbers, strings, lists, dicts or "
            "tensors."
        )


def _host_buffer(t: torch.Tensor, *, pinned: bool) -> torch.Tensor:
    """Host memory for a copy of ``t``: page-locked for a GPU tensor (the copy then runs at the
    link's speed, asynchronously), plain if the node refuses to lock that much."""
    if pinned:
        try:
            return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        except RuntimeError as exc:
            log.warning("no page-locked memory for a checkpoint snapshot (%s): copying slower", exc)
    return torch.empty(t.shape, dtype=t.dtype, device="cpu")
