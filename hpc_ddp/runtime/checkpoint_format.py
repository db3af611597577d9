"""The checkpoint format: payload structure, weights digest, structure validation (no file I/O).

Format version 1 is a plain dict that ``torch.load(..., weights_only=True)`` accepts::

    format: "hpc-ddp-checkpoint"   version: 1
    model:      state dict of the unwrapped module (no ``module.`` prefix)
    optimizer, scheduler, scaler: their state dicts, or None
    progress:   {step, epoch, batch_in_epoch}   (see :class:`Progress`)
    rng:        one entry per global rank (python, numpy, torch CPU, CUDA states)
    config:     the resolved job config as a plain dict, or None
    extra:      the user's own small values
    meta:       {time, world_size, weights_digest, torch_version, hpc_ddp_version}

What bit-identical resume needs, and why it is all here: weights, optimizer and scheduler state
fix the arithmetic; ``progress`` fixes the data position (the sampler's permutation is a pure
function of seed and epoch, so ``epoch`` and ``batch_in_epoch`` place it exactly, see
:mod:`hpc_ddp.runtime.sampler`); per-rank RNG states (:mod:`hpc_ddp.runtime.rng_state`) fix
everything random inside a step (dropout, user code), which differs per rank because each rank
seeds its training stream with its rank. DataLoader workers get seeds derived from (seed, epoch,
rank), not from the global RNG.

Reading and listing files is :mod:`hpc_ddp.runtime.checkpoint`; writing them is
:mod:`hpc_ddp.runtime.checkpoint_writer`.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import numbers
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hpc_ddp.errors import CheckpointError
from hpc_ddp.runtime.progress import Progress  # defined here before; import it from there
from hpc_ddp.version import __version__

FORMAT = "hpc-ddp-checkpoint"
FORMAT_VERSION = 1
LATEST = "latest"
TMP_PREFIX = ".tmp-"
"""Temp files of a writer start with this, so that they never match ``step-*.pt``."""
_NAME_RE = re.compile(r"^step-(\d+)\.pt$")
_REQUIRED = ("model", "progress", "rng", "meta")


class CheckpointState(str, enum.Enum):
    """What one ``step-*.pt`` file is, as resume and ``hpc-ddp checkpoints`` judge it."""

    OK = "ok"
    DAMAGED = "damaged"
    """Meant to be ours but unusable: unreadable, torn, empty, malformed, weights changed."""
    FOREIGN = "foreign"
    """Readable, but not an hpc-ddp checkpoint of the format version this code reads."""


_HINTS = {
    CheckpointState.DAMAGED: "resume skips it and takes the newest older checkpoint that "
    "loads; move the file aside to keep it for inspection.",
    CheckpointState.FOREIGN: "keep only checkpoints written by this hpc-ddp (format version "
    f"{FORMAT_VERSION}) in checkpoints/; move or rename this file.",
}


class Rejected(Exception):
    """Why a file is not a usable checkpoint (never leaves the checkpoint modules: callers get a
    :class:`CheckpointError` or a :class:`~hpc_ddp.runtime.checkpoint.CheckpointInfo` with the
    reason)."""

    def __init__(self, state: CheckpointState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


def checkpoint_name(step: int) -> str:
    """``step-00000120.pt``: zero-padded so names sort like steps."""
    return f"step-{step:08d}.pt"


def parse_checkpoint_name(name: str) -> int | None:
    """The step in a checkpoint file name, or None for any other file."""
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


def weights_digest(state_dict: Mapping[str, Any]) -> str:
    """sha256 over the tensors of a state dict in sorted key order (name, dtype, shape, bytes).

    Device and storage layout do not matter, so the digest of a model equals the digest of its
    saved and reloaded state: two runs with equal digests hold bit-identical weights.
    """
    h = hashlib.sha256()
    for key in sorted(state_dict):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().to("cpu").contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        nbytes = t.numel() * t.element_size()
        if nbytes:
            h.update(ctypes.string_at(t.data_ptr(), nbytes))
    return h.hexdigest()


_PLAIN = (bytes, type(None), torch.dtype, torch.device)


def snapshot(obj: Any, where: str = "checkpoint") -> Any:
    """A deep copy with tensors copied to CPU, in only the types a weights-only load accepts.

    Training can go on changing the original while the copy is written. Anything a
    ``weights_only`` load would refuse raises here, at save time, rather than at resume time.
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.clone() if t.device.type == "cpu" else t.to("cpu")
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
        return {k: snapshot(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [snapshot(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise CheckpointError(
        f"{where} holds a {type(obj).__module__}.{type(obj).__qualname__}, which a weights-only "
        "load cannot read. HINT: store plain numbers, strings, lists, dicts or tensors."
    )


def build_payload(
    *,
    model: Mapping[str, Any],
    progress: Progress,
    rng: list[dict[str, Any]],
    optimizer: Mapping[str, Any] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    scaler: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The checkpoint dict (format version 1); ``rng`` has one entry per global rank."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": dict(model),
        "optimizer": None if optimizer is None else dict(optimizer),
        "scheduler": None if scheduler is None else dict(scheduler),
        "scaler": None if scaler is None else dict(scaler),
        "progress": progress.to_dict(),
        "extra": snapshot(dict(progress.extra), "progress.extra"),
        "rng": rng,
        "config": None if config is None else snapshot(dict(config), "config"),
        "meta": {
            "time": time.time() if now is None else now,
            "world_size": len(rng),
            "weights_digest": None,  # filled in by the writer, off the training thread
            "torch_version": str(torch.__version__),
            "hpc_ddp_version": __version__,
        },
    }


def check_payload(obj: Any, source: str) -> dict[str, Any]:
    """``obj`` if it is a checkpoint this version can read, else a :class:`CheckpointError`."""
    try:
        return check_structure(obj)
    except Rejected as r:
        raise rejection_error(source, r) from None


def check_structure(obj: Any) -> dict[str, Any]:
    """``obj`` if it has the format-1 layout, with every value :meth:`Session.restore` reads
    of the right type, else :class:`Rejected` saying which and why."""
    data = _check_marker(obj)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise Rejected(CheckpointState.DAMAGED, f"checkpoint lacks {', '.join(missing)}")
    for where, value, ok, expected in _value_checks(data):
        if not ok:
            shown = _describe(value)
            raise Rejected(CheckpointState.DAMAGED, f"{where} is {shown}, expected {expected}")
    return data


def _check_marker(obj: Any) -> dict[str, Any]:
    """``obj``, or :class:`Rejected` as foreign unless it is a dict marked as this format
    version."""
    foreign = CheckpointState.FOREIGN
    if not isinstance(obj, dict):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise Rejected(foreign, f"holds a {kind}, not an hpc-ddp checkpoint")
    if obj.get("format") != FORMAT:
        keys = sorted(map(str, obj))
        shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
        reason = f"a dict of {{{shown}}} with no hpc-ddp format marker: not an hpc-ddp checkpoint"
        raise Rejected(foreign, reason)
    if obj.get("version") != FORMAT_VERSION:
        raise Rejected(
            foreign,
            f"checkpoint format version {obj.get('version')!r}, this hpc-ddp reads "
            f"{FORMAT_VERSION} (resume with the hpc-ddp version that wrote it)",
        )
    return obj


_Check = tuple[str, Any, bool, str]
"""(where, the value found, whether it is right, what was expected)."""


def _value_checks(obj: dict[str, Any]) -> list[_Check]:
    """Every value check of a payload holding all of ``_REQUIRED``, in the order reported."""
    progress, meta = obj["progress"], obj["meta"]
    checks: list[_Check] = [
        ("model", obj["model"], _is_str_dict(obj["model"]), "a state dict"),
        ("rng", obj["rng"], _is_rng_list(obj["rng"]), "per-rank RNG state dicts"),
        ("progress", progress, isinstance(progress, dict), "a dict"),
        ("meta", meta, isinstance(meta, dict), "a dict"),
    ]
    for key in ("optimizer", "scheduler", "scaler", "extra", "config"):
        value = obj.get(key)
        checks.append((key, value, value is None or isinstance(value, dict), "a dict or None"))
    if isinstance(progress, dict):
        checks += _progress_checks(progress)
    if isinstance(meta, dict):
        checks += _meta_checks(meta, obj["rng"])
    return checks


def _progress_checks(progress: dict[str, Any]) -> list[_Check]:
    checks = []
    for key in ("step", "epoch", "batch_in_epoch"):
        value = progress.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        checks.append((f"progress.{key}", value, ok, "an int >= 0"))
    return checks


def _meta_checks(meta: dict[str, Any], rng: Any) -> list[_Check]:
    value = meta.get("time")
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    checks: list[_Check] = [("meta.time", value, ok, "a number")]
    value = meta.get("world_size")
    ok = isinstance(value, int) and isinstance(rng, list) and value == len(rng)
    checks.append(("meta.world_size", value, ok, "the number of rng entries"))
    value = meta.get("weights_digest")
    ok = isinstance(value, str) and len(value) == 64
    checks.append(("meta.weights_digest", value, ok, "a sha256 hex digest"))
    return checks


def _describe(value: Any) -> str:
    """A short description of a value for a reason string (never the repr of a big object)."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)[:40]
    if isinstance(value, list | tuple | dict):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _is_rng_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(e, dict) and isinstance(e.get("torch"), torch.Tensor) and "python" in e
        for e in value
    )


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def rejection_error(source: str | Path, r: Rejected) -> CheckpointError:
    """The error a caller sees for a rejected file: where, what state, why and what to do."""
    message = f"{source}: {r.state.value} checkpoint: {r.reason}. HINT: {_HINTS[r.state]}"
    return CheckpointError(message)
