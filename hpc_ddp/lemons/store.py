"""The lemon record's files: one file per entry in ``$XDG_STATE_HOME/hpc-ddp/nodes/``.

Several runs write at once (every job's supervisor, on any node, into one home directory),
and ``flock`` cannot be trusted on NFS, so nothing is ever rewritten: each entry is a file of
its own, made whole under a private name and then linked into place under a name no other
writer can pick (:func:`~hpc_ddp.durable.create_atomic`). A reader lists the directory and
reads every entry; there is no shared file to lose an update in. ``--forget`` removes the
files naming the node: an entry written meanwhile by a running job is kept, as it should be.

Reading never raises: a damaged or hand-edited entry, an unreadable directory, become warnings
(:attr:`Record.warnings`), so a broken record never fails a submit or a job.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpc_ddp.durable import create_atomic
from hpc_ddp.frozen import dataclass
from hpc_ddp.lemons.record import RETENTION_S, LemonEntry, entry_from_dict, entry_name, record_dir

__all__ = ["Record", "add_entries", "add_entry", "forget_node", "read_record", "where"]

_HINT = "HINT: remove the file, or `hpc-ddp nodes --forget NODE`"


@dataclass(frozen=True)
class Record:
    """The record as read: its entries, with their files, and what could not be read."""

    directory: Path
    entries: tuple[tuple[Path, LemonEntry], ...]
    warnings: tuple[str, ...] = ()

    @property
    def values(self) -> tuple[LemonEntry, ...]:
        """The entries alone."""
        return tuple(e for _, e in self.entries)


def where(env: Mapping[str, str] | None = None) -> Path:
    """The record's directory for ``env`` (this process's environment by default)."""
    return record_dir(os.environ if env is None else env, Path.home())


def read_record(directory: Path) -> Record:
    """Every entry in ``directory`` ({} when there is none yet); never raises."""
    try:
        names = sorted(p for p in directory.iterdir() if _is_entry(p))
    except FileNotFoundError:
        return Record(directory, ())
    except OSError as exc:
        return Record(directory, (), (f"lemon record {directory} unreadable: {exc}",))
    found, warnings = [], []
    for path in names:
        try:
            entry = entry_from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            continue  # forgotten or pruned meanwhile
        except (OSError, ValueError, RecursionError) as exc:
            warnings.append(f"lemon record: ignoring damaged entry {path}: {exc}. {_HINT}")
            continue
        found.append((path, entry))
    return Record(directory, tuple(found), tuple(warnings))


def _is_entry(path: Path) -> bool:
    return path.suffix == ".json" and not path.name.startswith(".")


def add_entry(directory: Path, entry: LemonEntry, *, now: float | None = None) -> Path:
    """Write ``entry`` as a new file of the record (atomic, under a name of its own) and remove
    entries older than :data:`~hpc_ddp.lemons.record.RETENTION_S`; the new file's path.
    Raises OSError when it cannot be written (the caller warns: a record is never worth a
    failed job)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(entry.to_dict(), sort_keys=True) + "\n").encode("utf-8")
    while True:
        path = directory / entry_name(entry, f"{os.getpid()}-{os.urandom(6).hex()}")
        if create_atomic(path, data):
            break
    _prune(directory, time.time() if now is None else now)
    return path


def add_entries(directory: Path, entries: Iterable[LemonEntry]) -> list[str]:
    """Write each of ``entries`` (:func:`add_entry`); what could not be written, in words (the
    caller warns: a record is never worth a failed job)."""
    failed = []
    for entry in entries:
        try:
            add_entry(directory, entry)
        except OSError as exc:
            failed.append(f"cannot add {entry.node} to the lemon record: {exc}")
    return failed


def _prune(directory: Path, now: float) -> None:
    for path, entry in read_record(directory).entries:
        if entry.time < now - RETENTION_S:
            path.unlink(missing_ok=True)


def forget_node(directory: Path, node: str) -> int:
    """Remove every entry naming ``node``; how many there were. A damaged entry is left (its
    node cannot be read: :func:`read_record` names it)."""
    gone = 0
    for path, entry in read_record(directory).entries:
        if entry.node == node:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            gone += 1
    return gone
