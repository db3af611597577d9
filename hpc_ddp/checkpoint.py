"""Checkpoints: the file format (pure functions) and thin, atomic I/O around it.

Layout of ``RUN_DIR/checkpoints/``: ``step-00000120.pt`` per save, plus a ``latest`` text file
naming the newest one. ``latest`` is a hint for people and tools; loading scans the
``step-*.pt`` files newest first and takes the first that loads, so a stale or missing pointer
never matters.

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
:mod:`hpc_ddp.sampler`); per-rank RNG states fix everything random inside a step (dropout,
user code), which differs per rank because each rank seeds its training stream with its rank.
DataLoader workers get seeds derived from (seed, epoch, rank), not from the global RNG.

Cost of a save (see :class:`CheckpointWriter`): one all-gather of the RNG states, a synchronous
CPU copy of the state on rank 0, then the digest, ``torch.save`` and two ``fsync`` calls on a
background thread while training goes on.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import numbers
import os
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]

from hpc_ddp import __version__
from hpc_ddp.errors import CheckpointError

log = logging.getLogger(__name__)

FORMAT = "hpc-ddp-checkpoint"
FORMAT_VERSION = 1
LATEST = "latest"
_NAME_RE = re.compile(r"^step-(\d+)\.pt$")
_TMP_PREFIX = ".tmp-"
_REQUIRED = ("model", "progress", "rng", "meta")


@dataclass
class Progress:
    """Where training is: the one live counter a checkpoint saves and a resume continues from."""

    step: int = 0
    """Optimizer steps done; inside a ``Session.steps()`` loop body, the step being run."""
    epoch: int = 0
    batch_in_epoch: int = 0
    """Micro-batches of ``epoch`` already consumed on each rank."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Small user values (numbers, strings, lists) saved with every checkpoint."""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def update_from(self, data: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        """Overwrite in place (loaders hold a reference to this object)."""
        self.step = int(data["step"])
        self.epoch = int(data["epoch"])
        self.batch_in_epoch = int(data["batch_in_epoch"])
        self.extra = dict(extra)


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
    """Why the file could not be read (None for a good checkpoint)."""


# --- format: pure functions ---------------------------------------------------------------


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
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{source}: not an hpc-ddp checkpoint.")
    if obj.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{source}: checkpoint format version {obj.get('version')!r}, this hpc-ddp reads "
            f"{FORMAT_VERSION}. HINT: resume with the hpc-ddp version that wrote it."
        )
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise CheckpointError(f"{source}: checkpoint lacks {', '.join(missing)}.")
    return obj


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


# --- I/O: thin ----------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_durably(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    _fsync_dir(final.parent)


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
    tmp = directory / f"{_TMP_PREFIX}{final.name}.{os.getpid()}"
    try:
        with tmp.open("wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        _replace_durably(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    pointer = directory / f"{_TMP_PREFIX}{LATEST}.{os.getpid()}"
    with pointer.open("w") as f:
        f.write(final.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    _replace_durably(pointer, directory / LATEST)
    _prune(directory, keep_last, keep=final)
    return final


def _prune(directory: Path, keep_last: int, keep: Path) -> None:
    steps = {s: p for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None}
    for step in prune_plan(list(steps), keep_last):
        if steps[step] != keep:
            steps[step].unlink(missing_ok=True)
    # Temp files of writers that died mid-save (only rank 0 of one job ever writes here).
    mine = f".{os.getpid()}"
    for p in directory.glob(f"{_TMP_PREFIX}*"):
        if not p.name.endswith(mine):
            p.unlink(missing_ok=True)


def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*.pt`` in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [
        (s, p) for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None
    ]
    return sorted(found, reverse=True)


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load and check one checkpoint file (weights only: no code runs from the file)."""
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})"
        ) from exc
    return check_payload(obj, str(path))


def find_latest(
    directory: Path, map_location: torch.device | str = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, or None when there is none at all.

    A newest file that does not load (a damaged disk, a foreign file) is logged as a warning and
    the one before it is used. Files exist but none loads: :class:`CheckpointError`, since
    silently starting over would throw the run away.
    """
    files = checkpoint_files(directory)
    errors = []
    for _, path in files:
        try:
            return path, load_checkpoint(path, map_location)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", path.name, exc)
            errors.append(str(exc))
    if errors:
        raise CheckpointError(
            f"{directory}: none of {len(errors)} checkpoints loads (newest: {errors[0]}). "
            "HINT: move the checkpoints directory aside to start the run from scratch."
        )
    return None


def list_checkpoints(directory: Path, *, verify: bool = False) -> list[CheckpointInfo]:
    """Every checkpoint in a run directory (or its ``checkpoints/``), oldest first.

    Reads each file memory-mapped, so listing is cheap; ``verify=True`` recomputes the weights
    digest from the tensors and reports a mismatch as an error.
    """
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    out = []
    for step, path in reversed(checkpoint_files(directory)):
        size = path.stat().st_size
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            data = check_payload(obj, str(path))
            digest = data["meta"].get("weights_digest")
            if verify and digest != weights_digest(data["model"]):
                raise CheckpointError(f"{path}: weights do not match their recorded digest.")
        except Exception as exc:
            out.append(CheckpointInfo(path, step, None, None, size, None, error=str(exc)))
            continue
        epoch = int(data["progress"]["epoch"])
        out.append(CheckpointInfo(path, step, epoch, float(data["meta"]["time"]), size, digest))
    return out


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
