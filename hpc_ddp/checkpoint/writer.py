"""Writing checkpoints: durably, one at a time, on a background thread, and pruning old ones.

:func:`write_checkpoint` writes a payload (already a snapshot, :mod:`hpc_ddp.checkpoint.snapshot`)
so that a crash at any moment leaves it whole or absent: the digests, then ``torch.save`` into a
temp file whose ``write`` hands the tensor storages straight to ``os.write`` (few large writes,
the disk started on them while later ones are copied), one ``fsync`` of the file, the rename
and an ``fsync`` of the directory; then the ``latest`` pointer and the pruning. Temporary files
(``.tmp-*``) of a writer that was killed mid-save never match ``step-*.pt`` and are swept up by
the next save. :class:`CheckpointWriter` runs those writes on a background thread. The
collective side (which rank reads, writes and tells the others) is
:mod:`hpc_ddp.checkpoint.checkpointer`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

import torch

from hpc_ddp.checkpoint.format import best_step, state_digests
from hpc_ddp.durable import fsync_dir, write_text_atomic
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.checkpoint_label import not_regular
from hpc_ddp.rundir.checkpoints import checkpoint_files
from hpc_ddp.rundir.layout import (
    CHECKPOINT_TMP_PREFIX,
    LATEST_CHECKPOINT,
    checkpoint_name,
    parse_checkpoint_name,
)

__all__ = [
    "CheckpointWriter",
    "no_zip_crc32",
    "prune_plan",
    "write_checkpoint",
    "write_failure",
    "write_failure_hint",
]

log = logging.getLogger(__name__)


def prune_plan(steps: list[int], keep_last: int, best: int | None = None) -> list[int]:
    """The steps to delete so that the newest ``keep_last`` remain (``keep_last <= 0``: none),
    and the ``best`` step beside them (``train.keep_best``)."""
    if keep_last <= 0:
        return []
    return [s for s in sorted(steps)[:-keep_last] if s != best]


def write_failure(exc: BaseException) -> tuple[str, int | None]:
    """A failed checkpoint write in one line, and the errno behind it (None: no OS error).

    The OS error is looked for inside what wraps it: torch DCP's ``CheckpointException`` (a
    ``BaseException`` whose ``failures`` hold each rank's error, and whose own text is a
    traceback), a ``RuntimeError`` from ``torch.save``'s zip writer, any ``__cause__``."""
    cause = _os_error(exc)
    if cause is None:
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else '?'}", None
    name = errno.errorcode.get(cause.errno or 0)
    what = cause.strerror or str(cause)
    where = f": {cause.filename}" if cause.filename else ""
    return f"{type(cause).__name__}: {what}{f' ({name})' if name else ''}{where}", cause.errno


def _os_error(exc: BaseException) -> OSError | None:
    """The first OS error with an errno in ``exc`` and what it wraps (breadth first)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        failures = getattr(current, "failures", None)  # DCP's CheckpointException
        if isinstance(failures, dict):
            for _, wrapped in sorted(failures.items()):
                inner = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
                if isinstance(inner, BaseException):
                    todo.append(inner)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def write_failure_hint(directory: Path, code: int | None) -> str:
    """What to do about a checkpoint write into ``directory`` that failed with errno ``code``:
    every such failure ends the run (a run that went on would lose what it trains since its
    last checkpoint), so the hint says how to make room and go on."""
    run_dir = directory.parent if directory.name == "checkpoints" else directory
    resume = f"then `hpc-ddp resume {run_dir}` goes on from the newest checkpoint on disk"
    if code == errno.ENOSPC:
        return (
            f"HINT: the file system of {directory} is full: free space there (`df -h "
            f"{directory}`), keep fewer checkpoints (train.keep_last) or move the runs to a "
            f"larger file system; {resume}."
        )
    if code == errno.EDQUOT:
        return (
            f"HINT: your disk quota on the file system of {directory} is used up: free space "
            f"or ask for more (`quota -s`; on Lustre `lfs quota -u $USER {directory}`), or "
            f"keep fewer checkpoints (train.keep_last); {resume}."
        )
    if code == errno.EIO:
        return (
            f"HINT: the file system of {directory} could not write (an I/O error): ask its "
            f"admins about its health and check the checkpoints with `hpc-ddp checkpoints "
            f"{run_dir} --verify`; {resume}."
        )
    return f"HINT: check free space, quota and permissions of {directory}; {resume}."


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
        with no_zip_crc32():
            # torch.save needs only write (and tell): the sink is file-like enough.
            torch.save(payload, cast(IO[bytes], sink))
        sink.flush()
        os.fsync(fd)
    finally:
        os.close(fd)


_crc32_lock = threading.Lock()
"""Held while the CRCs are off: two writers (a file's, a shard set's) never interleave their
save-and-restore of torch's one switch, so it is never left off."""


@contextlib.contextmanager
def no_zip_crc32() -> Iterator[None]:
    r"""``torch.save`` without the zip's CRC-32 of each record, for every checkpoint writer (a
    file's, and each rank's shard and files of a shard set: DCP ``torch.save``\ s each tensor).
    ``torch.load`` never checks them, the digests (a file's state digests, a shard set's xxh3 of
    every file, checked before anything loads it) cover every byte that matters, and they are
    most of what ``torch.save`` itself costs (15 ms of CPU per 96 MB, 6 GB/s: a third of the
    time this VM's disk takes to write the same bytes, which is the whole budget of a durable
    checkpoint; about a third of a 128 MB shard's write).

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
        s: p for s, p in checkpoint_files(directory) if s <= written and not_regular(p) is None
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
        self._failed: str | None = None
        """The name of the checkpoint whose write failed with :attr:`_error`."""
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

    def idle(self) -> None:
        """Block until no write is in flight, leaving its error, if any, to :meth:`wait`."""
        self._idle.wait()

    def wait(self) -> None:
        """Block until no write is in flight; raise if the last one failed."""
        self._idle.wait()
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, CheckpointError):
                raise exc
            what, code = write_failure(exc)
            raise CheckpointError(
                f"writing {self._failed or 'a checkpoint'} to {self.directory} failed ({what}). "
                + write_failure_hint(self.directory, code)
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
            self._failed = checkpoint_name(int(payload["progress"]["step"]))
            return
        self.last_seconds = time.perf_counter() - start
        log.debug("checkpoint %s written in %.3f s", self.last_path.name, self.last_seconds)

    def _durable(self) -> None:
        self.durable_at = time.perf_counter()


def _finish_at_exit(ref: weakref.ref[CheckpointWriter]) -> None:
    writer = ref()
    if writer is not None:
        writer._idle.wait()
