"""The digests of a checkpoint's content: xxh3-128 over a canonical walk, and format 1's sha256.

A digest is xxh3-128 over a canonical walk of a value (every key, type, length, plain value, and
every tensor's dtype, shape and bytes), so it does not depend on devices or memory layout: the
``model`` digest of a checkpoint equals :func:`weights_digest` of the live model it was saved
from. xxh3 and not sha256: the digests guard against silent corruption (bit rot, a torn copy, a
bad disk), not against an adversary, and a weights-only load already refuses to run code; xxh3
hashes at about 15-30 GB/s here against sha256's 1-2, so digesting a whole 1 GB state costs tens
of milliseconds, not half a second. Which sections of a payload are digested, and where the
digests are recorded, is the format's (:func:`hpc_ddp.checkpoint.format.state_digests`).
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import xxhash

__all__ = [
    "DIGEST_ALGORITHM",
    "canonical_digest",
    "sha256_weights",
    "tensor_bytes",
    "weights_digest",
]

DIGEST_ALGORITHM = "xxh3-128"
"""What ``meta.digest`` of a format-2 checkpoint names: :func:`canonical_digest`'s algorithm."""


def weights_digest(state_dict: Mapping[str, Any]) -> str:
    """The digest of a state dict: xxh3-128 over its keys (sorted), values, and every tensor's
    dtype, shape and bytes.

    Device and storage layout do not matter, so the digest of a model equals the digest of its
    saved and reloaded state (the ``model`` digest its checkpoint records): two runs with equal
    digests hold bit-identical weights.
    """
    return canonical_digest(state_dict)


def canonical_digest(obj: Any) -> str:
    """xxh3-128 of any value a checkpoint holds, walked canonically (:func:`_feed`)."""
    h = xxhash.xxh3_128()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: xxhash.xxh3_128, obj: Any) -> None:
    """A canonical walk: type tags and lengths keep ``(1, [2])`` apart from ``([1], 2)``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}|".encode())
        h.update(tensor_bytes(t))  # xxhash lets go of the GIL while it hashes
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)}|".encode())
        for key in sorted(obj, key=repr):
            h.update(f"K{key!r}|".encode())
            _feed(h, obj[key])
    elif isinstance(obj, list | tuple):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}|".encode())
        for value in obj:
            _feed(h, value)
    else:  # float repr round-trips exactly; ints, strings, bytes, None, dtypes, devices
        h.update(f"V{type(obj).__name__}:{obj!r}|".encode())


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (and without numpy)."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def sha256_weights(state_dict: Mapping[str, Any]) -> str:
    """Format 1's ``meta.weights_digest``: sha256 over the tensors only, keys sorted."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().to("cpu").contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
