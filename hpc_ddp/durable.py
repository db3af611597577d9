"""Durable file writes: the one place that knows how to make a write survive a crash.

Run directories live on shared file systems and are read by other processes (``status`` on a
login node, a requeued attempt on another node) while a job may be killed at any moment. A
reader must therefore see the old file or the new one, never half of either, and a write that
returned must still be there after a power loss. This module holds the recipe once:

* replace a whole file: write a temp file in the same directory, flush + fsync it,
  ``os.replace`` it over the target (atomic on POSIX), then fsync the directory so the rename
  itself is on disk (:func:`write_text_atomic`, :func:`write_bytes_atomic`,
  :func:`write_atomic`);
* create a file only if it does not exist yet, whole or not at all, with exactly one of several
  racing creators winning (:func:`create_atomic`);
* append an event: one ``write`` of one whole line to a file opened ``O_APPEND``, then fsync
  (:func:`append_line`), so single-writer logs such as the attempt ledger never interleave.

Standard library only, so that it costs nothing to import on a login node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "append_line",
    "create_atomic",
    "fsync_dir",
    "temp_path",
    "write_atomic",
    "write_bytes_atomic",
    "write_text_atomic",
]


def fsync_dir(path: Path | str) -> None:
    """fsync the directory ``path``, so that renames and new entries in it are on disk.

    fsync of a file makes its data durable, not its name: after ``os.replace`` the directory
    entry is only durable once the directory itself is fsynced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """The temp file an atomic write of ``path`` uses: hidden, same directory, per process.

    Same directory, because ``os.replace`` is only atomic within one file system; per process,
    so that two writers of the same file never write into each other's temp file.
    """
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def write_atomic(
    path: Path, write: Callable[[BinaryIO], object], *, tmp: Path | None = None
) -> None:
    """Replace ``path`` with what ``write`` writes to a binary file, atomically and durably.

    ``write`` gets the open temp file (streaming writers such as ``torch.save`` need not build
    the bytes in memory first). On any failure, before or during the rename, the temp file is
    removed and ``path`` keeps its old content. ``tmp`` overrides the temp file's name (it must
    be in ``path``'s directory).
    """
    tmp = temp_path(path) if tmp is None else tmp
    try:
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes_atomic(path: Path, data: bytes, *, tmp: Path | None = None) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half."""
    write_atomic(path, lambda f: f.write(data), tmp=tmp)


def write_text_atomic(path: Path, text: str, *, tmp: Path | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` so a reader sees the old file or the new, never half."""
    write_bytes_atomic(path, text.encode("utf-8"), tmp=tmp)


def create_atomic(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call created it.

    Readers never see a half-written ``path``: the data goes to a private temp file first, which
    is then hard-linked to ``path`` (atomic, and refused when another creator won the race). On
    a file system without hard links the claim is ``O_EXCL`` instead; there a reader may find
    the file empty for a moment and should retry.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with tmp.open("xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some FUSE and object-store mounts)
            if not _create_exclusive(path, data):
                return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _create_exclusive(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (a newline is added if missing) to ``path`` as one durable ``write``.

    The file is opened ``O_APPEND`` and the whole line goes out in a single ``write``, then is
    fsynced, so a single writer's lines never interleave and a returned append is on disk. If a
    previous writer died mid-line (the file does not end in a newline), that torn line is ended
    first: otherwise this line would be glued to it and be lost with it when readers skip it.
    The file is created (mode 0644) if missing; its directory must exist.
    """
    if not line.endswith("\n"):
        line += "\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
