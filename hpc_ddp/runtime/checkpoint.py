"""The checkpoint file: its format, its digest, writing it durably, reading and checking it.

Layout of ``RUN_DIR/checkpoints/`` (names in :mod:`hpc_ddp.layout`): ``step-00000120.pt`` per
save, plus a ``latest`` text file naming the newest one. ``latest`` is a hint for people and
tools; loading scans the ``step-*.pt`` files newest first and takes the first that loads, so a
stale, missing or dangling pointer never matters. Temporary files (``.tmp-*``) of a writer that
was killed mid-save never match ``step-*.pt`` and are never read.

Format version 1 is a plain dict that ``torch.load(..., weights_only=True)`` accepts::

    format: "hpc-ddp-checkpoint"   version: 1
    model:      state dict of the unwrapped module (no ``module.`` prefix)
    optimizer, scheduler, scaler: their state dicts, or None
    progress:   {step, epoch, batch_in_epoch}   (see :class:`~hpc_ddp.runtime.progress.Progress`)
    rng:        one entry per global rank (python, numpy, torch CPU, CUDA states)
    config:     the resolved job config as a plain dict, or None
    extra:      the user's own small values
    meta:       {time, world_size, weights_digest, torch_version, hpc_ddp_version}

What bit-identical resume needs, and why it is all here: weights, optimizer and scheduler state
fix the arithmetic; ``progress`` fixes the data position (the sampler's permutation is a pure
function of seed and epoch, so ``epoch`` and ``batch_in_epoch`` place it exactly, see
:mod:`hpc_ddp.runtime.sampler`); per-rank RNG states fix everything random inside a step
(dropout, user code), which differs per rank because each rank seeds its training stream with
its rank. DataLoader workers get seeds derived from (seed, epoch, rank), not from the global RNG.

A file counts as a checkpoint only if it passes every check of :func:`load_checkpoint`: a
regular torch zip file, loadable with ``weights_only=True``, holding this format, whose model
tensors still hash to the recorded ``weights_digest``. Anything else is ``damaged`` (ours but
unreadable, torn, malformed, or its weights changed on disk) or ``foreign`` (readable, but not
written by this format version); resume skips both and takes the next older file.

Writing (:func:`write_checkpoint`, :class:`CheckpointWriter`): a CPU :func:`snapshot` on the
training thread, then the digest, ``torch.save`` and two ``fsync`` calls on a background thread
while training goes on. The collective side (which rank reads, writes and tells the others) is
:mod:`hpc_ddp.runtime.checkpointer`.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import logging
import numbers
import os
import random
import re
import threading
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]

from hpc_ddp.durable import write_atomic, write_text_atomic
from hpc_ddp.errors import CheckpointError
from hpc_ddp.layout import (
    CHECKPOINT_TMP_PREFIX,
    LATEST_CHECKPOINT,
    checkpoint_name,
    parse_checkpoint_name,
)
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.version import __version__

log = logging.getLogger(__name__)

FORMAT = "hpc-ddp-checkpoint"
FORMAT_VERSION = 1
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
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
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
    # The temp names start with CHECKPOINT_TMP_PREFIX so that they never match step-*.pt and
    # _prune can sweep up those of a writer killed mid-save.
    tmp = directory / f"{CHECKPOINT_TMP_PREFIX}{final.name}.{os.getpid()}"
    write_atomic(final, lambda f: torch.save(payload, f), tmp=tmp)
    pointer = directory / f"{CHECKPOINT_TMP_PREFIX}{LATEST_CHECKPOINT}.{os.getpid()}"
    write_text_atomic(directory / LATEST_CHECKPOINT, final.name + "\n", tmp=pointer)
    _prune(directory, keep_last, keep=final)
    return final


def _prune(directory: Path, keep_last: int, keep: Path) -> None:
    steps = {s: p for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None}
    for step in prune_plan(list(steps), keep_last):
        if steps[step] != keep:
            steps[step].unlink(missing_ok=True)
    # Temp files of writers that died mid-save (only rank 0 of one job ever writes here).
    mine = f".{os.getpid()}"
    for p in directory.glob(f"{CHECKPOINT_TMP_PREFIX}*"):
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


# Re-exported: these lived here before the format, the writer and the RNG states were split
# out, and the session, the trainer, the CLI and the tests import them from here.


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
    if path.is_symlink() and not path.exists():
        raise Rejected(damaged, f"dangling symlink to {os.readlink(path)}")
    try:
        if not path.is_file():
            kind = "missing" if not path.exists() else "not a regular file"
            raise Rejected(damaged, kind)
        with path.open("rb") as f:
            head = f.read(len(_ZIP_MAGIC))
            whole = head == _ZIP_MAGIC and zipfile.is_zipfile(f)  # reads only the end
    except OSError as exc:
        raise Rejected(damaged, f"unreadable ({_first_sentence(exc)})") from exc
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


def _torch_load(path: Path, map_location: torch.device | str, *, mmap: bool) -> Any:
    try:
        with warnings.catch_warnings():
            # A foreign pickle with a newer protocol makes torch warn before it refuses.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError..
        unsupported = _UNSUPPORTED_GLOBAL.search(_ANSI.sub("", str(exc)))
        if unsupported:  # pickled objects of someone's classes: loading would run their code
            reason = (
                f"holds a {unsupported.group(1)}, which only a load that runs code could "
                "read: not an hpc-ddp checkpoint"
            )
            raise Rejected(CheckpointState.FOREIGN, reason) from exc
        raise Rejected(CheckpointState.DAMAGED, f"unreadable ({_first_sentence(exc)})") from exc


def _check_digest(data: dict[str, Any]) -> None:
    recorded = data["meta"]["weights_digest"]
    try:
        actual = weights_digest(data["model"])
    except Exception as exc:  # meta or sparse tensors: nothing a writer of ours saves
        reason = f"model tensors cannot be hashed ({_first_sentence(exc)})"
        raise Rejected(CheckpointState.DAMAGED, reason) from exc
    if actual != recorded:
        raise Rejected(
            CheckpointState.DAMAGED,
            f"weights do not match their recorded digest (recorded {recorded[:12]}..., "
            f"now {actual[:12]}...): the file changed after it was written",
        )


def _read(
    path: Path, map_location: torch.device | str, *, verify: bool, mmap: bool = False
) -> dict[str, Any]:
    """Every check a checkpoint must pass, in order of cost; :class:`Rejected` on the first
    that fails."""
    _check_file(path)
    data = check_structure(_torch_load(path, map_location, mmap=mmap))
    if verify:
        _check_digest(data)
    return data


def load_checkpoint(
    path: Path, map_location: torch.device | str = "cpu", *, verify: bool = True
) -> dict[str, Any]:
    """Load and check one checkpoint file (weights only: no code runs from the file).

    ``verify`` recomputes the weights digest and rejects a file whose tensors changed since
    they were written (bit rot, a bad copy). Cost, measured on CPU: about 30 ms for resnet18's
    47 MB of weights, on top of about 60 ms to load its 94 MB file from the page cache.
    """
    try:
        return _read(path, map_location, verify=verify)
    except Rejected as r:
        raise rejection_error(path, r) from None


def find_latest(
    directory: Path, map_location: torch.device | str = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that passes every check, or None when there is none at all.

    A newer file that fails (damaged or foreign, its weights digest included) is logged as a
    warning naming it and why, and the one before it is tried. Files exist but none loads:
    :class:`CheckpointError`, since silently starting over would throw the run away.
    """
    files = checkpoint_files(directory)
    errors = []
    for _, path in files:
        try:
            return path, _read(path, map_location, verify=True)
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


def list_checkpoints(directory: Path, *, verify: bool = False) -> list[CheckpointInfo]:
    """Every checkpoint file in a run directory (or its ``checkpoints/``), oldest first.

    Never raises for a bad file: damaged and foreign ones are listed with their
    :class:`CheckpointState` and reason. Reads each file memory-mapped, so listing is cheap;
    ``verify=True`` also recomputes the weights digest from the tensors, the check resume makes.
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
            data = _read(path, "cpu", verify=verify, mmap=True)
        except Rejected as r:
            out.append(CheckpointInfo(path, step, None, None, size, None, r.reason, r.state))
            continue
        epoch, saved = int(data["progress"]["epoch"]), float(data["meta"]["time"])
        out.append(CheckpointInfo(path, step, epoch, saved, size, data["meta"]["weights_digest"]))
    return out
