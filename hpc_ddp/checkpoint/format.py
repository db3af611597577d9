"""The checkpoint file: its format, its digests, writing it durably, reading and checking it.

Layout of ``RUN_DIR/checkpoints/`` (names in :mod:`hpc_ddp.rundir.layout`): ``step-00000120.pt`` per
save, plus a ``latest`` text file naming the newest one. ``latest`` is a hint for people and
tools; loading scans the ``step-*.pt`` files newest first and takes the first that loads, so a
stale, missing or dangling pointer never matters. Temporary files (``.tmp-*``) of a writer that
was killed mid-save never match ``step-*.pt`` and are never read.

Format version 2 is a plain dict that ``torch.load(..., weights_only=True)`` accepts::

    format: "hpc-ddp-checkpoint"   version: 2
    model:      state dict of the unwrapped module (no ``module.`` prefix)
    optimizer, scheduler, scaler: their state dicts, or None
    objects:    {name: state dict} of any more objects ``Session.restore`` was given by name
                (an EMA model, a second optimizer); absent when there are none
    progress:   {step, epoch, batch_in_epoch, samples_in_epoch}   (see
                :class:`~hpc_ddp.runtime.progress.Progress`; ``samples_in_epoch`` since the
                elastic resume, absent before)
    extra:      the user's own small values
    rng:        one entry per global rank (python, numpy, torch CPU, CUDA states)
    config:     the resolved job config as a plain dict, or None
    meta:       {time, world_size, grad_accum (since the elastic resume), torch_version,
                 hpc_ddp_version, run_id, config_digest (both since checkpoint identity),
                 digest: "xxh3-128",
                 digests: {model, optimizer, scheduler, scaler, progress, extra, rng, config,
                           objects.NAME (one per named object), meta: hex digest}}

``meta.digests`` holds one digest for each section above and one for ``meta`` itself (less the
digests): everything a resume restores is covered, so a changed byte in the optimizer state, an
RNG state or the data position is caught as surely as one in the weights, and the error names the
section. A digest is xxh3-128 over a canonical walk of the section (every key, type, length,
plain value, and every tensor's dtype, shape and bytes), so it does not depend on devices or
memory layout: the ``model`` digest of a checkpoint equals :func:`weights_digest` of the live
model it was saved from. xxh3 and not sha256: the digests guard against silent corruption (bit
rot, a torn copy, a bad disk), not against an adversary, and a weights-only load already refuses
to run code; xxh3 hashes at about 15-30 GB/s here against sha256's 1-2, so digesting a whole
1 GB state costs tens of milliseconds, not half a second.

Format version 1 (hpc-ddp before the digests of everything) has ``meta.weights_digest``, a
sha256 of the model tensors, and nothing else digested. Such files still load, so that a run
survives an upgrade of hpc-ddp between two of its attempts; only their weights are verified,
and resume and ``hpc-ddp checkpoints`` say so (:data:`V1_UNVERIFIED`).

What bit-identical resume needs, and why it is all here: weights, optimizer and scheduler state
fix the arithmetic; ``progress`` fixes the data position (the sampler's permutation is a pure
function of seed and epoch, so ``epoch`` and ``samples_in_epoch`` place it exactly at any world
size, see :mod:`hpc_ddp.runtime.sampler`); per-rank RNG states fix everything random inside a
step (dropout, user code), which differs per rank because each rank seeds its training stream
with its rank. ``meta.world_size`` and ``meta.grad_accum`` say how a step was made, which an
elastic resume at another world size rescales (:mod:`hpc_ddp.config.elastic`). DataLoader
workers get seeds derived from (seed, epoch, rank), not from the global RNG.

A file counts as a checkpoint only if it passes every check of :func:`load_checkpoint`: a
regular torch zip file, loadable with ``weights_only=True`` (always to the CPU: the caller's
``load_state_dict`` places each tensor where its parameter lives), holding this format, whose
sections still hash to their recorded digests, and whose name says the step it holds. Anything
else is ``damaged`` (ours but unreadable, torn, malformed, misnamed, or changed on disk; any
exception reading it raises makes it so, never a crash) or ``foreign`` (readable, but not
written by a format version this code reads); resume skips both and takes the next older file.

Identity: ``meta.run_id`` is the run that wrote the file (``RUN_DIR/run_id``), and
``meta.config_digest`` the digest of the config keys that shape its state
(:func:`~hpc_ddp.rundir.checkpoint_label.config_digest`). A file of another run is a
``stranger``: resume and ``hpc-ddp checkpoints --verify`` refuse it, naming both runs, and
resume takes the next older file. A file without a run id (written by an hpc-ddp before the
identity was recorded) is of unknown identity and still loads, as format 1 does: refusing it
would strand every run across the upgrade, and its digests still prove it whole. The resume
log says when the config that shapes the state changed since the file was written (an elastic
resume's accumulation, a forced resume's overrides).

Writing (:class:`SnapshotBuffers`, :func:`write_checkpoint`, :class:`CheckpointWriter`): on the
training thread only a copy of the state into host buffers kept from the previous save (no fresh
memory to fault in); on a background thread the digests, then ``torch.save`` into a file whose
``write`` hands the tensor storages straight to ``os.write`` (few large writes, the disk started
on them while later ones are copied), one ``fsync`` of the file, the rename and an ``fsync`` of
the directory. The collective side (which rank reads, writes and tells the others) is
:mod:`hpc_ddp.checkpoint.checkpointer`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import enum
import hashlib
import logging
import numbers
import os
import queue
import random
import re
import threading
import time
import warnings
import weakref
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch
import xxhash

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]

from hpc_ddp.durable import fsync_dir, write_text_atomic
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.checkpoint_label import config_digest, misnamed, not_regular, stranger
from hpc_ddp.rundir.layout import (
    CHECKPOINT_TMP_PREFIX,
    LATEST_CHECKPOINT,
    checkpoint_name,
    parse_checkpoint_name,
)
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.version import __version__

log = logging.getLogger(__name__)

FORMAT = "hpc-ddp-checkpoint"
FORMAT_VERSION = 2
"""The version this code writes; it reads this one and version 1."""
DIGEST_ALGORITHM = "xxh3-128"
SECTIONS = ("model", "optimizer", "scheduler", "scaler", "progress", "extra", "rng", "config")
"""The parts of a payload that a resume restores, each with its own digest (and ``meta``)."""
V1_UNVERIFIED = ("optimizer", "scheduler", "scaler", "progress", "extra", "rng", "config")
"""What a format-1 file restores without a digest to check it against (only ``model`` has one)."""
OBJECTS = "objects"
"""The optional section of named objects; each has its own digest, ``objects.NAME``."""
_READABLE = (1, FORMAT_VERSION)
_REQUIRED = ("model", "progress", "rng", "meta")
_DIGEST_HEX = 32

_WHAT = {
    "model": "weights (model)",
    "optimizer": "optimizer state",
    "scheduler": "scheduler state",
    "scaler": "grad scaler state",
    "progress": "progress (step, epoch, batch)",
    "extra": "extra values",
    "rng": "RNG states",
    "config": "config",
    "meta": "meta (world size, time, versions)",
}
"""How a reason names each section."""


def _what(section: str) -> str:
    """How a reason names a section or a named object."""
    if section.startswith(f"{OBJECTS}."):
        return f"state of {section.removeprefix(OBJECTS + '.')!r}"
    return _WHAT[section]


class CheckpointState(str, enum.Enum):
    """What one ``step-*.pt`` file is, as resume and ``hpc-ddp checkpoints`` judge it."""

    OK = "ok"
    DAMAGED = "damaged"
    """Meant to be ours but unusable: unreadable, torn, empty, malformed, changed on disk."""
    FOREIGN = "foreign"
    """Readable, but not an hpc-ddp checkpoint of a format version this code reads."""
    STRANGER = "stranger"
    """A whole hpc-ddp checkpoint, but of another run (its ``meta.run_id`` says which)."""


_HINTS = {
    CheckpointState.DAMAGED: "resume skips it and takes the newest older checkpoint that "
    "loads; move the file aside to keep it for inspection.",
    CheckpointState.FOREIGN: "keep only checkpoints written by this hpc-ddp (format versions "
    f"{', '.join(map(str, _READABLE))}) in checkpoints/; move or rename this file.",
    CheckpointState.STRANGER: "resume never loads another run's state: it takes the newest "
    "older checkpoint of this run; move the file back to its own run directory (or, if this "
    "run's run_id file was deleted and made anew, write the id the file names back into it).",
}


class Rejected(Exception):
    """Why a file is not a usable checkpoint (never leaves the checkpoint modules: callers get a
    :class:`CheckpointError` or a :class:`~hpc_ddp.checkpoint.format.CheckpointInfo` with the
    reason)."""

    def __init__(self, state: CheckpointState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


# --- digests --------------------------------------------------------------------------------


def weights_digest(state_dict: Mapping[str, Any]) -> str:
    """The digest of a state dict: xxh3-128 over its keys (sorted), values, and every tensor's
    dtype, shape and bytes.

    Device and storage layout do not matter, so the digest of a model equals the digest of its
    saved and reloaded state (the ``model`` digest its checkpoint records): two runs with equal
    digests hold bit-identical weights.
    """
    return _digest(state_dict)


def state_digests(payload: Mapping[str, Any]) -> dict[str, str]:
    """One digest per section of a format-2 payload, one per named object
    (``objects.NAME``), and one of ``meta`` less its digests."""
    out = {key: _digest(payload.get(key)) for key in SECTIONS}
    for name, state in _named(payload).items():
        out[f"{OBJECTS}.{name}"] = _digest(state)
    meta = payload.get("meta")
    if isinstance(meta, Mapping):
        out["meta"] = _digest({k: v for k, v in meta.items() if k != "digests"})
    return out


def _named(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The payload's named objects (none in a file written without any)."""
    objects = payload.get(OBJECTS)
    return objects if isinstance(objects, Mapping) else {}


def _digest(obj: Any) -> str:
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


def _sha256_weights(state_dict: Mapping[str, Any]) -> str:
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


# --- snapshots: what the training thread pays for ---------------------------------------------

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


# --- the payload and its structure ------------------------------------------------------------


def build_payload(
    *,
    model: Mapping[str, Any],
    progress: Progress,
    rng: list[dict[str, Any]],
    optimizer: Mapping[str, Any] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    scaler: Mapping[str, Any] | None = None,
    objects: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    grad_accum: int | None = None,
    run_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The checkpoint dict (format version 2); ``rng`` has one entry per global rank,
    ``grad_accum`` the micro-batches each accumulated per step (None: not known), ``run_id``
    the run it belongs to (its ``config_digest`` is taken from ``config``).

    Tensors are taken as they are: pass snapshots. The digests are filled in by
    :func:`write_checkpoint`, off the training thread. ``objects``: the named objects' state
    dicts (None or empty: no ``objects`` section).
    """
    named = {OBJECTS: dict(objects)} if objects else {}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": dict(model),
        "optimizer": None if optimizer is None else dict(optimizer),
        "scheduler": None if scheduler is None else dict(scheduler),
        "scaler": None if scaler is None else dict(scaler),
        **named,
        "progress": progress.to_dict(),
        "extra": snapshot(dict(progress.extra), "progress.extra"),
        "rng": rng,
        "config": None if config is None else snapshot(dict(config), "config"),
        "meta": {
            "time": time.time() if now is None else now,
            "world_size": len(rng),
            **({} if grad_accum is None else {"grad_accum": grad_accum}),
            "run_id": run_id,
            "config_digest": None if config is None else config_digest(config),
            "torch_version": str(torch.__version__),
            "hpc_ddp_version": __version__,
            "digest": DIGEST_ALGORITHM,
            "digests": None,
        },
    }


def recorded_weights_digest(data: Mapping[str, Any]) -> str:
    """The weights digest a checked payload records (format 2: its ``model`` digest; format 1:
    its sha256 ``weights_digest``, comparable only with other format-1 files)."""
    meta = data["meta"]
    return str(meta["digests"]["model"] if data["version"] >= 2 else meta["weights_digest"])


def unverified_sections(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The sections of a checked payload that no digest covers (format 1: all but the
    weights; format 2: none)."""
    return V1_UNVERIFIED if data["version"] == 1 else ()


def check_payload(obj: Any, source: str) -> dict[str, Any]:
    """``obj`` if it is a checkpoint this version can read, else a :class:`CheckpointError`."""
    try:
        return check_structure(obj)
    except Rejected as r:
        raise rejection_error(source, r) from None


def check_structure(obj: Any) -> dict[str, Any]:
    """``obj`` if it has the layout of a readable format version, with every value
    :meth:`Session.restore` reads of the right type, else :class:`Rejected` saying which and
    why."""
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
    """``obj``, or :class:`Rejected` as foreign unless it is a dict marked as a format version
    this code reads."""
    foreign = CheckpointState.FOREIGN
    if not isinstance(obj, dict):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise Rejected(foreign, f"holds a {kind}, not an hpc-ddp checkpoint")
    if obj.get("format") != FORMAT:
        keys = sorted(map(str, obj))
        shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
        reason = f"a dict of {{{shown}}} with no hpc-ddp format marker: not an hpc-ddp checkpoint"
        raise Rejected(foreign, reason)
    version = obj.get("version")
    if type(version) is not int or version not in _READABLE:
        raise Rejected(
            foreign,
            f"checkpoint format version {version!r}, this hpc-ddp reads "
            f"{' and '.join(map(str, _READABLE))} (resume with the hpc-ddp version that wrote it)",
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
    objects = obj.get(OBJECTS)
    ok = objects is None or (_is_str_dict(objects) and all(map(_is_str_dict, objects.values())))
    checks.append((OBJECTS, objects, ok, "a dict of state dicts by name, or absent"))
    if isinstance(progress, dict):
        checks += _progress_checks(progress)
    if isinstance(meta, dict):
        names = tuple(objects) if ok and objects is not None else ()
        checks += _meta_checks(meta, obj["rng"], obj["version"], names)
    return checks


def _progress_checks(progress: dict[str, Any]) -> list[_Check]:
    checks = []
    for key in ("step", "epoch", "batch_in_epoch"):
        value = progress.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        checks.append((f"progress.{key}", value, ok, "an int >= 0"))
    value = progress.get("samples_in_epoch")
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    checks.append(("progress.samples_in_epoch", value, ok, "an int >= 0 or absent"))
    return checks


def _meta_checks(
    meta: dict[str, Any], rng: Any, version: int, names: tuple[str, ...] = ()
) -> list[_Check]:
    value = meta.get("time")
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    checks: list[_Check] = [("meta.time", value, ok, "a number")]
    value = meta.get("world_size")
    ok = isinstance(value, int) and isinstance(rng, list) and value == len(rng)
    checks.append(("meta.world_size", value, ok, "the number of rng entries"))
    value = meta.get("grad_accum")
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    checks.append(("meta.grad_accum", value, ok, "an int >= 1 or absent"))
    for key, expected in (("run_id", "a run id"), ("config_digest", "a hex digest")):
        value = meta.get(key)
        checks.append((f"meta.{key}", value, value is None or isinstance(value, str), expected))
    if version == 1:
        value = meta.get("weights_digest")
        ok = isinstance(value, str) and len(value) == 64
        checks.append(("meta.weights_digest", value, ok, "a sha256 hex digest"))
        return checks
    value = meta.get("digest")
    checks.append(("meta.digest", value, value == DIGEST_ALGORITHM, repr(DIGEST_ALGORITHM)))
    value = meta.get("digests")
    keys = (*SECTIONS, *(f"{OBJECTS}.{n}" for n in names), "meta")
    ok = isinstance(value, dict) and all(
        isinstance(value.get(k), str) and len(value[k]) == _DIGEST_HEX for k in keys
    )
    checks.append(("meta.digests", value, ok, "a hex digest for every section and meta"))
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


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states in weights-only-loadable form (lists, ints, tensors)."""
    version, words, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": None,
    }
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, words, gauss = state["python"]
    random.setstate((int(version), tuple(int(w) for w in words), gauss))
    torch.set_rng_state(state["torch"].to("cpu"))
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].to("cpu"), device)
    if state.get("numpy") is not None and np is not None:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def prune_plan(steps: list[int], keep_last: int, best: int | None = None) -> list[int]:
    """The steps to delete so that the newest ``keep_last`` remain (``keep_last <= 0``: none),
    and the ``best`` step beside them (``train.keep_best``)."""
    if keep_last <= 0:
        return []
    return [s for s in sorted(steps)[:-keep_last] if s != best]


def best_step(payload: Mapping[str, Any]) -> int | None:
    """The step of the best checkpoint that ``payload``'s run has written so far, as it
    records it (``meta.best``, set under ``train.keep_best``); None when it records none."""
    best = payload["meta"].get("best")
    return None if not isinstance(best, Mapping) else int(best["step"])


def write_checkpoint(
    directory: Path,
    payload: dict[str, Any],
    keep_last: int,
    *,
    on_durable: Callable[[], None] | None = None,
) -> Path:
    """Write ``payload`` as ``step-N.pt`` so that a crash at any moment leaves it whole or absent.

    The digests first (unless the payload has them), then: temp file in the same directory ->
    ``torch.save`` -> fsync -> rename -> fsync the directory. The file is durable now, and
    ``on_durable`` is called. Then the ``latest`` pointer, the same way, and only then older
    checkpoints beyond ``keep_last`` go, all but the best one the payload records under
    ``meta.best`` (``train.keep_best``). (Deleting a large file takes tens of milliseconds,
    which a stop waiting for the durable point need not wait for.)
    """
    directory.mkdir(parents=True, exist_ok=True)
    step = int(payload["progress"]["step"])
    final = directory / checkpoint_name(step)
    if payload["meta"].get("digests") is None:
        payload["meta"]["digests"] = state_digests(payload)
    # The temp names start with CHECKPOINT_TMP_PREFIX so that they never match step-*.pt and
    # _prune can sweep up those of a writer killed mid-save.
    tmp = directory / f"{CHECKPOINT_TMP_PREFIX}{final.name}.{os.getpid()}"
    try:
        _save_durably(payload, tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    if on_durable is not None:
        on_durable()
    pointer = directory / f"{CHECKPOINT_TMP_PREFIX}{LATEST_CHECKPOINT}.{os.getpid()}"
    write_text_atomic(directory / LATEST_CHECKPOINT, final.name + "\n", tmp=pointer)
    _prune(directory, keep_last, keep=final, best=best_step(payload))
    return final


def _save_durably(payload: dict[str, Any], tmp: Path) -> None:
    """``torch.save`` into ``tmp`` (created or truncated), then fsync it once."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        sink = _FileSink(fd)
        with _no_zip_crc32():
            # torch.save needs only write (and tell): the sink is file-like enough.
            torch.save(payload, cast(IO[bytes], sink))
        sink.flush()
        os.fsync(fd)
    finally:
        os.close(fd)


_crc32_lock = threading.Lock()


@contextlib.contextmanager
def _no_zip_crc32() -> Iterator[None]:
    """``torch.save`` without the zip's CRC-32 of each record: ``torch.load`` never checks them,
    the digests cover every byte that matters, and they are most of what ``torch.save`` itself
    costs (15 ms of CPU per 96 MB, 6 GB/s: a third of the time this VM's disk takes to write the
    same bytes, which is the whole budget of a durable checkpoint).

    The switch is torch's global one: a ``torch.save`` of the user's own on another thread
    meanwhile also writes no CRCs, which nothing that reads it with torch notices (``unzip -t``
    would).
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:  # torch < 2.4: CRCs as always
        yield
        return
    with _crc32_lock:
        before = get()
        set_(False)
        try:
            yield
        finally:
            set_(before)


class _FileSink:
    """What ``torch.save`` writes into: its zip writer hands ``write`` memoryviews of each
    record, the tensor storages included, and they go straight to ``os.write`` (no copy into a
    Python buffer). Small writes (zip headers, padding, the pickle) are gathered into one write
    per 64 KiB. Large ones go out 1 MiB at a time, and after each the kernel is asked to start
    writing that MiB to disk, so that the disk works while later ones are copied and the final
    ``fsync`` finds little left. Measured on this VM for 1 GB: 0.37-0.53 s with 1 MiB, about
    0.55-0.64 s with no such requests, and 1.5 s with 8 or 16 MiB ones (the kernel then
    submits, and waits on, more than the device's 4 MiB requests at once)."""

    _SMALL = 1 << 16
    _WRITEBACK = 1 << 20

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pos = 0
        self._small = bytearray()
        self._written = 0
        self._started = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n < self._SMALL:
            self._small += view
            if len(self._small) >= self._SMALL:
                self.flush()
        else:
            self.flush()
            self._write_all(view)
        self.pos += n
        return n

    def flush(self) -> None:
        if self._small:
            self._write_all(memoryview(self._small))
            self._small = bytearray()

    def tell(self) -> int:
        return self.pos

    def _write_all(self, view: memoryview) -> None:
        while view:
            # One stride per call, so that a large tensor's first part is on its way to the disk
            # while its later parts are still being copied.
            n = os.write(self.fd, view[: self._WRITEBACK])
            view = view[n:]
            self._written += n
            if self._written - self._started >= self._WRITEBACK:
                _start_writeback(self.fd, self._started, self._written - self._started)
                self._started = self._written


def _load_start_writeback() -> Callable[[int, int, int], None]:
    """``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: start writing a range back to
    disk without waiting for it (Linux). Elsewhere a no-op: the final fsync does all of it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, n: None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    write = 2  # SYNC_FILE_RANGE_WRITE

    def start(fd: int, offset: int, n: int) -> None:
        call(fd, offset, n, write)  # a hint only: its errors are the final fsync's to report

    return start


_start_writeback = _load_start_writeback()


def _prune(directory: Path, keep_last: int, keep: Path, best: int | None = None) -> None:
    written = parse_checkpoint_name(keep.name)
    assert written is not None
    # Only this run's line up to the step just written counts. A file named beyond it is one
    # resume fell back past (damaged, misnamed, another run's): it must neither push good
    # files out of keep_last nor be deleted unread. What is not a regular file is never ours.
    steps = {
        s: p
        for p in directory.iterdir()
        if (s := parse_checkpoint_name(p.name)) is not None
        and s <= written
        and not_regular(p) is None
    }
    for step in prune_plan(list(steps), keep_last, best):
        if steps[step] != keep:
            steps[step].unlink(missing_ok=True)
    # Temp files of writers that died mid-save (only rank 0 of one job ever writes here).
    mine = f".{os.getpid()}"
    for p in directory.glob(f"{CHECKPOINT_TMP_PREFIX}*"):
        if not p.name.endswith(mine):
            p.unlink(missing_ok=True)


class CheckpointWriter:
    """Writes checkpoints one at a time, on a background thread when ``background`` is set.

    :meth:`submit` takes a payload that is already a CPU snapshot (the training thread pays for
    that copy only) and returns at once: it hands the payload to a writer thread that lives as
    long as the writer (starting a thread per save would make the training thread wait until
    the new thread runs, milliseconds on a busy node). It first waits for the previous write,
    so at most one is in flight. :meth:`wait` blocks until the last write is done and raises
    the :class:`CheckpointError` of a failed one; the stop path calls it before asking for a
    requeue. A write still in flight when the interpreter exits is finished first, and so is
    what :meth:`then` queued after it.
    """

    def __init__(self, directory: Path, keep_last: int, *, background: bool = True) -> None:
        self.directory = directory
        self.keep_last = keep_last
        self.background = background
        self._jobs: queue.SimpleQueue[dict[str, Any] | Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0  # jobs queued or running; _idle is set when none (under _lock)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_path: Path | None = None
        self.last_seconds: float = 0.0
        self.durable_at: float | None = None
        """``time.perf_counter()`` when the last write became durable (for measurements)."""

    def submit(self, payload: dict[str, Any]) -> None:
        """Start writing ``payload`` (after the previous write has finished)."""
        self.wait()
        self.durable_at = None
        if not self.background:
            self._write(payload)
            self.wait()
            return
        if self._thread is None:
            # A daemon, so that a writer nobody closes never keeps a process alive; the exit
            # hook finishes a write in flight (it runs before daemon threads are stopped).
            self._thread = threading.Thread(target=self._run, name="hpc-ddp-checkpoint")
            self._thread.daemon = True
            self._thread.start()
            atexit.register(_finish_at_exit, weakref.ref(self))
        self._queue(payload)

    def _queue(self, job: dict[str, Any] | Callable[[], None]) -> None:
        with self._lock:
            self._pending += 1
            self._idle.clear()
        self._jobs.put(job)

    def then(self, after: Callable[[], None]) -> None:
        """Run ``after`` once the write in flight (if any) is durable, on the writer thread, so
        that the training thread does not wait for it (rank 0 records a save in the ledger
        this way: a directory check and an fsync'd append). Skipped when that write failed;
        an error of ``after`` itself is logged, never raised: it is bookkeeping, and the
        checkpoint it follows is safe."""
        if not self.background:
            self._after(after)
            return
        if self._thread is None:  # nothing was ever submitted: nothing to wait for
            self._after(after)
            return
        self._queue(after)

    def _after(self, after: Callable[[], None]) -> None:
        if self._error is not None:
            return
        try:
            after()
        except Exception:
            log.warning("after checkpoint %s: bookkeeping failed", self.last_path, exc_info=True)

    def wait(self) -> None:
        """Block until no write is in flight; raise if the last one failed."""
        self._idle.wait()
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, CheckpointError):
                raise exc
            raise CheckpointError(
                f"writing a checkpoint to {self.directory} failed ({type(exc).__name__}: {exc}). "
                "HINT: check free space and permissions of the run directory."
            ) from exc

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if callable(job):
                    self._after(job)
                else:
                    self._write(job)
            finally:
                del job  # the snapshot's buffers belong to the next one
                with self._lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def _write(self, payload: dict[str, Any]) -> None:
        start = time.perf_counter()
        try:
            self.last_path = write_checkpoint(
                self.directory, payload, self.keep_last, on_durable=self._durable
            )
        except BaseException as exc:
            self._error = exc
            return
        self.last_seconds = time.perf_counter() - start
        log.debug("checkpoint %s written in %.3f s", self.last_path.name, self.last_seconds)

    def _durable(self) -> None:
        self.durable_at = time.perf_counter()


def _finish_at_exit(ref: weakref.ref[CheckpointWriter]) -> None:
    writer = ref()
    if writer is not None:
        writer._idle.wait()


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive (since torch 1.6)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint file as ``hpc-ddp checkpoints`` lists it."""

    path: Path
    step: int
    epoch: int | None
    time: float | None
    size: int
    weights_digest: str | None
    error: str | None = None
    """Why the file is not usable (None for a good checkpoint)."""
    state: CheckpointState = CheckpointState.OK
    version: int | None = None
    """The format version (None when the file is not readable as a checkpoint)."""
    unverified: tuple[str, ...] = ()
    """Sections this file restores without a digest to check them (format 1: all but the
    weights)."""
    run_id: str | None = None
    """The run that wrote it (None: unreadable, or written before runs were recorded)."""


def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*.pt`` in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [
        (s, p) for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None
    ]
    return sorted(found, reverse=True)


def _first_sentence(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip()
    text = text.splitlines()[0] if text else ""
    text = text.split(". ")[0].rstrip(".")
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _check_file(path: Path) -> None:
    """Reject what is not worth handing to ``torch.load``: no file, an empty file, a file
    that is not a zip archive (a text file, a raw pickle, torch's pre-1.6 format) or one whose
    end is missing (torn: ``torch.load`` would say only "Invalid argument" when mmapped)."""
    damaged = CheckpointState.DAMAGED
    kind = not_regular(path)  # before any open(): a FIFO would block it for ever
    if kind is not None:
        raise Rejected(damaged, kind)
    try:
        with path.open("rb") as f:
            head = f.read(len(_ZIP_MAGIC))
            whole = head == _ZIP_MAGIC and zipfile.is_zipfile(f)  # reads only the end
    except OSError as exc:
        raise Rejected(damaged, f"unreadable ({_first_sentence(exc)})") from exc
    except Exception as exc:  # is_zipfile lets BadZipFile out of a damaged zip64 locator
        raise Rejected(damaged, f"damaged zip archive ({_first_sentence(exc)})") from exc
    if not head:
        raise Rejected(damaged, "empty file (0 bytes)")
    if head.strip(b"\0") == b"":
        raise Rejected(damaged, "starts with zero bytes, not data (lost writes?)")
    if head != _ZIP_MAGIC:
        reason = f"not a torch zip file (starts with {head!r}): not an hpc-ddp checkpoint"
        raise Rejected(CheckpointState.FOREIGN, reason)
    if not whole:
        reason = "torn: the zip archive has no end (a write or copy that stopped early)"
        raise Rejected(damaged, reason)


def _torch_load(path: Path, *, mmap: bool) -> Any:
    """``torch.load`` to the CPU, weights only (no code from the file runs)."""
    try:
        with warnings.catch_warnings():
            # A foreign pickle with a newer protocol makes torch warn before it refuses.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError..
        unsupported = _UNSUPPORTED_GLOBAL.search(_ANSI.sub("", str(exc)))
        if unsupported:  # pickled objects of someone's classes: loading would run their code
            reason = (
                f"holds a {unsupported.group(1)}, which only a load that runs code could "
                "read: not an hpc-ddp checkpoint"
            )
            raise Rejected(CheckpointState.FOREIGN, reason) from exc
        raise Rejected(CheckpointState.DAMAGED, f"unreadable ({_first_sentence(exc)})") from exc


def _check_digests(data: dict[str, Any]) -> None:
    """:class:`Rejected`, naming every section that changed, unless each still hashes to its
    recorded digest (format 1: the weights only)."""
    try:
        if data["version"] == 1:
            recorded = {"model": data["meta"]["weights_digest"]}
            actual = {"model": _sha256_weights(data["model"])}
        else:
            recorded = data["meta"]["digests"]
            actual = state_digests(data)
    except Exception as exc:  # meta or sparse tensors: nothing a writer of ours saves
        reason = f"its tensors cannot be hashed ({_first_sentence(exc)})"
        raise Rejected(CheckpointState.DAMAGED, reason) from exc
    changed = [k for k in actual if k in recorded and actual[k] != recorded[k]]
    if changed:
        what = ", ".join(_what(k) for k in changed)
        verb = "does not match its" if len(changed) == 1 else "do not match their"
        raise Rejected(
            CheckpointState.DAMAGED,
            f"{what} {verb} recorded digest: the file changed after it was written",
        )


def _check_name(path: Path, data: dict[str, Any]) -> None:
    """:class:`Rejected` unless the file's name says the step it holds: a copy under another
    step's name would be taken for that step (skipping newer ones, and pruning them)."""
    named = parse_checkpoint_name(path.name)
    wrong = None if named is None else misnamed(named, data["progress"]["step"])
    if wrong is not None:
        raise Rejected(CheckpointState.DAMAGED, wrong)


def _check_identity(data: dict[str, Any], run_id: str | None) -> None:
    """:class:`Rejected` as a stranger when the file names a run and it is not ``run_id``
    (None, or a file that names none: unknown, accepted; see the module docstring)."""
    why = stranger(data["meta"].get("run_id"), run_id)
    if why is not None:
        raise Rejected(CheckpointState.STRANGER, why)


def _read(
    path: Path, *, verify: bool, mmap: bool = False, run_id: str | None = None
) -> dict[str, Any]:
    """Every check a checkpoint must pass, in order of cost; :class:`Rejected` on the first
    that fails. Whatever a damaged file makes a check raise is a :class:`Rejected` too: no
    exception of a reader (zipfile, pickle, torch, struct, a MemoryError of an absurd size)
    gets out."""
    try:
        _check_file(path)
        data = check_structure(_torch_load(path, mmap=mmap))
        _check_name(path, data)
        if verify:
            _check_digests(data)
    except Rejected:
        raise
    except Exception as exc:
        reason = f"unreadable ({_first_sentence(exc)})"
        raise Rejected(CheckpointState.DAMAGED, reason) from exc
    _check_identity(data, run_id)
    return data


def load_checkpoint(
    path: Path, *, verify: bool = True, run_id: str | None = None
) -> dict[str, Any]:
    """Load and check one checkpoint file, to the CPU (weights only: no code runs from the file).

    The caller's ``load_state_dict`` then puts each tensor where its parameter lives, as torch
    intends: an optimizer's ``step`` counters stay on the CPU, as in a fresh run, and the device
    never holds a second copy of the state. ``verify`` recomputes every section's digest and
    rejects a file whose content changed since it was written (bit rot, a bad copy); a format-1
    file has only its weights checked (see :func:`unverified_sections`). ``run_id``: the run
    loading it (another run's file is refused; None: any run's).
    """
    try:
        return _read(path, verify=verify, run_id=run_id)
    except Rejected as r:
        raise rejection_error(path, r) from None


def find_latest(
    directory: Path, *, run_id: str | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of run ``run_id`` (None: of any run) that passes every check,
    loaded to the CPU, or None when there is none at all.

    A newer file that fails (damaged, misnamed, foreign, another run's, any section's digest
    included) is logged as a warning naming it and why, and the one before it is tried.
    Files exist but none loads: :class:`CheckpointError`, since silently starting over would
    throw the run away.
    """
    files = checkpoint_files(directory)
    errors = []
    for _, path in files:
        try:
            return path, _read(path, verify=True, run_id=run_id)
        except Rejected as r:
            log.warning(
                "skipping checkpoint %s (%s: %s); trying the one before it",
                path,
                r.state.value,
                r.reason,
            )
            errors.append(f"{path.name}: {r.state.value}: {r.reason}")
    if errors:
        raise CheckpointError(
            f"{directory}: none of {len(errors)} checkpoints loads (newest: {errors[0]}). "
            "HINT: move the checkpoints directory aside to start the run from scratch."
        )
    return None


def list_checkpoints(
    directory: Path, *, verify: bool = False, run_id: str | None = None
) -> list[CheckpointInfo]:
    """Every checkpoint file in a run directory (or its ``checkpoints/``), oldest first.

    Never raises for a bad file: damaged, foreign and (given ``run_id``) another run's files
    are listed with their :class:`CheckpointState` and reason. Reads each file memory-mapped,
    so listing is cheap; ``verify=True`` also recomputes every digest from the content, the
    check resume makes.
    """
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    out = []
    for step, path in reversed(checkpoint_files(directory)):
        if not path.exists() and not path.is_symlink():
            continue  # pruned by the writer of a live run while we listed
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # a dangling symlink: _read says so
        try:
            data = _read(path, verify=verify, mmap=True, run_id=run_id)
        except Rejected as r:
            out.append(CheckpointInfo(path, step, None, None, size, None, r.reason, r.state))
            continue
        out.append(
            CheckpointInfo(
                path,
                step,
                int(data["progress"]["epoch"]),
                float(data["meta"]["time"]),
                size,
                recorded_weights_digest(data),
                version=int(data["version"]),
                unverified=unverified_sections(data),
                run_id=data["meta"].get("run_id"),
            )
        )
    return out
