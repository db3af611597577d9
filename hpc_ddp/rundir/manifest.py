"""The manifest: ``RUN_DIR/manifest.json``, what was submitted, where and when.

Written once per submission (and again by ``hpc-ddp resume``, which adds the earlier job ids);
read by every later command (``status``, ``cancel``, ``logs``, ``resume``, a sweep's
``results``) to find the run's job. Plain JSON, standard library only: a login node reads it.
:mod:`hpc_ddp.rundir.layout` declares where it lives
(:attr:`~hpc_ddp.rundir.layout.RunPaths.manifest`).

One job per run directory: the record is guarded by :func:`record_lock`. Every submission into
a run (or sweep) directory holds it exclusively across its decision and its record (is the run
live? submit, write the job id), so of two racing ``resume`` the second sees the first one's job
and submits nothing; every task holds it shared for a moment when it starts, so a job that
starts before its submitter has recorded it waits for the record instead of reading the old one.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc_ddp.backends.catalog import BackendName, backend_names, is_backend, unknown_backend
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import MANIFEST_FILE, SUBMIT_LOCK_FILE, RunPaths

__all__ = [
    "MANIFEST_VERSION",
    "RECORD_LOCK_TIMEOUT_S",
    "Manifest",
    "read_manifest",
    "record_lock",
    "write_manifest",
]

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Manifest:
    """What was submitted, where and when; written once per submission."""

    name: str
    backend: BackendName
    job_id: str | None
    submitted_at: str
    command: list[str]
    config_source: str
    run_dir: str
    array: str | None = None
    array_jobs: list[str] = field(default_factory=list)
    previous_jobs: list[str] = field(default_factory=list)
    """Earlier job ids of this run, oldest first: ``hpc-ddp resume`` submits it again."""
    submit_dir: str | None = None
    """Where the run was submitted from: its ``command:`` runs there, on a resume too."""
    git_commit: str | None = None
    """HEAD of the git repository holding ``submit_dir`` at submit; None outside one."""
    git_dirty: bool | None = None
    """Whether that repository's tracked files had changes; None outside one."""
    code_file: str | None = None
    """The job's own code: a ``command:``'s script, an ``entrypoint:``'s module file."""
    code_digest: str | None = None
    """``sha256:<hex>`` of ``code_file`` at submit."""
    version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        """The manifest as indented JSON text."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def write_manifest(paths: RunPaths, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically."""
    write_text_atomic(paths.manifest, manifest.to_json())


_MANIFEST_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "backend": (str,), "job_id": (str, type(None)), "submitted_at": (str,),
    "command": (list,), "config_source": (str,), "run_dir": (str,),
    "array": (str, type(None)), "array_jobs": (list,), "previous_jobs": (list,),
    "submit_dir": (str, type(None)), "git_commit": (str, type(None)),
    "git_dirty": (bool, type(None)), "code_file": (str, type(None)),
    "code_digest": (str, type(None)), "version": (int,),
}  # fmt: skip


def read_manifest(run_dir: Path) -> Manifest:
    """Read a run's manifest; a missing or damaged one is a :class:`RunDirError` with a hint.

    Damaged means anything but a JSON object with the manifest's keys and value types: a torn
    or binary file, a list, a number where the job id belongs, a directory in its place.
    """
    path = run_dir / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(
            f"{run_dir}: no manifest.json. HINT: pass a run directory printed by "
            "`hpc-ddp submit` (or a job id)."
        ) from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict):
        raise _damaged(path, f"a JSON {type(data).__name__}, not an object")
    for key, types in _MANIFEST_TYPES.items():
        value = data.get(key)
        is_bool = isinstance(value, bool) and bool not in types
        if key in data and (not isinstance(value, types) or is_bool):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _damaged(path, f"{key} is {value!r:.80}, expected {wanted}")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise _damaged(path, f"{key} is {value!r:.80}, expected a list of strings")
    missing = [f.name for f in fields(Manifest) if _required(f) and f.name not in data]
    if missing:
        raise _damaged(path, f"no {', '.join(map(repr, missing))} key", _hint_for(missing[0]))
    if not is_backend(data["backend"]):
        raise _damaged(path, unknown_backend(data["backend"]), _hint_for("backend"))
    known = {f.name for f in fields(Manifest)}
    # keys a newer hpc-ddp added are left out, not fatal
    return Manifest(**{k: v for k, v in data.items() if k in known})


def _required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _hint_for(key: str) -> str | None:
    if key == "backend":
        return (
            f'set "backend" to one of {", ".join(backend_names())}, whichever ran the run (a '
            "Slurm run has logs/batch-<job>.out, a local one local.json)"
        )
    return None


def _damaged(path: Path, why: str, hint: str | None = None) -> RunDirError:
    return RunDirError(
        f"{path}: damaged manifest ({why[:300]}). HINT: "
        + (hint or "the run's job id is also in its logs (logs/batch-<job>.out)")
        + "; restore manifest.json from a backup or move the run aside."
    )


# --- one writer at a time -------------------------------------------------------------------

RECORD_LOCK_TIMEOUT_S = 300.0
"""How long a submission, or a starting task, waits for another one's record before it gives
up. A holder keeps the lock for one squeue, one sbatch and a file write: seconds, not minutes."""
_POLL_S = (0.02, 0.5)
"""First and longest pause between tries (doubling): ``flock`` with a deadline, no signals."""


@contextmanager
def record_lock(
    directory: Path, *, shared: bool = False, timeout_s: float = RECORD_LOCK_TIMEOUT_S
) -> Iterator[bool]:
    """Hold ``DIRECTORY/submit.lock`` (``flock``) for the ``with`` block.

    Exclusive (the default) for a submission: it decides, submits and records while no other
    submission and no starting task reads or writes the record; the lock file is created if
    missing and names its holder (pid, host, time) for the message of a waiter that gives up.
    ``shared`` for a task that is starting: it only waits while a submission holds the lock,
    and many tasks hold it at once. ``flock`` is released when its holder dies, however it
    dies, and works across the NFS clients of a cluster on Linux.

    Yields True once held; False (shared only) when there is no lock file to wait for (a run
    directory made by hand or by an older hpc-ddp). Waits at most ``timeout_s``, then raises
    :class:`RunDirError` naming the holder.
    """
    path = directory / SUBMIT_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        if shared:  # nothing to wait for: no submission can hold a lock that is not there
            yield False
            return
        raise _unusable_lock(directory, path) from None
    except OSError as exc:  # a directory in its place, a symlink loop, no permission
        raise _unusable_lock(directory, path, exc) from None
    try:
        _acquire(fd, path, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, timeout_s)
        if not shared:
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            # uname's nodename is gethostname()'s, without importing socket (2 ms of a submit)
            holder = f"pid {os.getpid()} on {os.uname().nodename} since {stamp}\n"
            os.pwrite(fd, holder.encode(), 0)
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _unusable_lock(directory: Path, path: Path, exc: OSError | None = None) -> RunDirError:
    """Why ``path`` cannot be opened as the record lock, and what to do (the run directory
    itself may be fine: only the lock file is in the way)."""
    if not directory.is_dir():
        return RunDirError(
            f"{directory}: no such run directory, so no {SUBMIT_LOCK_FILE} to take. HINT: pass "
            "a run directory printed by `hpc-ddp submit`."
        )
    fix = (
        f"HINT: remove it (`rm -r {path}`, when no hpc-ddp command is using {directory}); "
        "hpc-ddp creates its lock file again as a plain file."
    )
    if path.is_symlink():
        target = os.readlink(path)
        return RunDirError(
            f"{path}: the run directory's lock file is a symlink to {target!r}, which cannot "
            f"be opened ({exc.strerror if exc is not None else 'it does not exist'}). {fix}"
        )
    if path.is_dir():
        return RunDirError(
            f"{path}: the run directory's lock file is a directory, not a file. {fix}"
        )
    why = exc.strerror if exc is not None and exc.strerror else str(exc)
    return RunDirError(f"{path}: cannot open the run directory's lock file ({why}). {fix}")


def _acquire(fd: int, path: Path, mode: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pause = _POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise _lock_timeout(path, timeout_s)
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S[1])


def _lock_timeout(path: Path, timeout_s: float) -> RunDirError:
    try:
        holder = path.read_text(encoding="utf-8", errors="replace").strip()[:200]
    except OSError:
        holder = ""
    return RunDirError(
        f"{path}: another hpc-ddp ({holder or 'holder unknown'}) has held the run's submit lock "
        f"for more than {timeout_s:.0f} s, so its job record cannot be read or written now. "
        "HINT: that process submits or records a job in this directory: let it finish; if it "
        "hangs (its sbatch or squeue does not answer), stop it, then try again."
    )
