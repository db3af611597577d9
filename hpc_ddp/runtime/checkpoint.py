"""Checkpoint files: finding, loading and listing them, every check a file must pass.

Layout of ``RUN_DIR/checkpoints/``: ``step-00000120.pt`` per save, plus a ``latest`` text file
naming the newest one. ``latest`` is a hint for people and tools; loading scans the
``step-*.pt`` files newest first and takes the first that loads, so a stale, missing or dangling
pointer never matters. Temporary files (``.tmp-*``) of a writer that was killed mid-save never
match ``step-*.pt`` and are never read.

A file counts as a checkpoint only if it passes every check of :func:`load_checkpoint`: a
regular torch zip file, loadable with ``weights_only=True``, holding the format of
:mod:`hpc_ddp.runtime.checkpoint_format`, whose model tensors still hash to the recorded
``weights_digest``. Anything else is ``damaged`` (ours but unreadable, torn, malformed, or its
weights changed on disk) or ``foreign`` (readable, but not written by this format version);
resume skips both and takes the next older file. Writing is
:mod:`hpc_ddp.runtime.checkpoint_writer`.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpc_ddp.errors import CheckpointError
from hpc_ddp.runtime.checkpoint_format import (
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    CheckpointState,
    Rejected,
    build_payload,
    check_payload,
    check_structure,
    checkpoint_name,
    parse_checkpoint_name,
    rejection_error,
    snapshot,
    weights_digest,
)
from hpc_ddp.runtime.checkpoint_writer import CheckpointWriter, prune_plan, write_checkpoint
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.rng_state import capture_rng_state, restore_rng_state

# Re-exported: these lived here before the format, the writer and the RNG states were split
# out, and the session, the trainer, the CLI and the tests import them from here.
__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LATEST",
    "CheckpointInfo",
    "CheckpointState",
    "CheckpointWriter",
    "Progress",
    "build_payload",
    "capture_rng_state",
    "check_payload",
    "checkpoint_files",
    "checkpoint_name",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "parse_checkpoint_name",
    "prune_plan",
    "restore_rng_state",
    "snapshot",
    "weights_digest",
    "write_checkpoint",
]

log = logging.getLogger(__name__)

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
