"""The checkpoints in a directory, listed and judged without torch: which files there are, and
which is the newest that looks whole.

Both sides ask: the node side (the writer's pruning, the ranks' resume, the supervisor's "from
step N") and the login side (``status``, ``resume``'s plan, a forced local stop). Their answers
agree because they come from here:

* :func:`checkpoint_files`: every ``step-*.pt`` name, newest first. A temp file of a writer
  (``.tmp-*``), the ``latest`` pointer and anything else never match.
* :func:`damaged_checkpoint`: why a file cannot be a whole checkpoint of a run, from its first
  bytes, its zip directory and its label (:mod:`hpc_ddp.rundir.checkpoint_label`): empty, torn,
  spliced, not a regular file, named for another step than it holds, or another run's.
* :func:`shard_set_record`: a sharded (FSDP) checkpoint's digest record once the set is
  complete: a ``step-N/`` directory renamed in whole once every rank wrote its shard, its
  record (written last) of this format, listing ``.metadata``, ``common.pt``, one
  ``rank-*.pt`` and a shard per rank of its world size, every listed file there as a regular
  file of its recorded size, and its step the name's. What the ranks check before they hash
  (:mod:`hpc_ddp.checkpoint.sharded` checks every file's digest before it loads one).
  :func:`damaged_shard_set` adds ``common.pt``'s label (its step, its run);
  :func:`shard_sets` lists the complete ones.
* :func:`checkpoint_on_disk`: what a failed attempt names as its checkpoint, the save it was
  told of if that is whole on disk, else the newest one before it (either kind).
* :func:`newest_checkpoint`: the newest file that passes :func:`damaged_checkpoint` or shard
  set that passes :func:`damaged_shard_set`, the one a resume would take unless its content
  (checked with torch, :mod:`hpc_ddp.checkpoint.format`) changed on disk, named as listed
  (a :class:`~hpc_ddp.rundir.layout.Checkpoint`); :func:`newest_step`: its step.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpc_ddp.rundir.checkpoint_label import (
    LabelError,
    label_problem,
    misnamed,
    not_regular,
    read_label,
)
from hpc_ddp.rundir.layout import (
    SHARDED_RECORD,
    Checkpoint,
    parse_checkpoint_name,
    parse_sharded_checkpoint_name,
)

__all__ = [
    "SHARDED_COMMON",
    "SHARDED_FORMAT",
    "SHARDED_METADATA",
    "SHARDED_VERSION",
    "IncompleteShardSet",
    "checkpoint_files",
    "checkpoint_on_disk",
    "damaged_checkpoint",
    "damaged_shard_set",
    "newest_checkpoint",
    "newest_step",
    "shard_dirs",
    "shard_rank_file",
    "shard_set_record",
    "shard_sets",
]

SHARDED_FORMAT = "hpc-ddp-sharded"
"""The ``format`` of a shard set's digest record."""
SHARDED_VERSION = 1
"""The ``version`` of a shard set's digest record this hpc-ddp reads and writes."""
SHARDED_COMMON = "common.pt"
"""Rank 0's file in a shard set: progress, extra, scheduler, scaler, config and meta."""
SHARDED_METADATA = ".metadata"
"""DCP's index of every shard (rank 0's)."""
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
"""A rank's DCP shard file: ``__<rank>_<n>.distcp``."""

_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE = "/data.pkl"
"""The record every ``torch.save`` archive holds: the pickle (``<archive>/data.pkl``)."""


def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*.pt`` in ``directory``, newest first, by name alone
    ([] when there is no such directory; an :class:`OSError` when it cannot be listed: "no
    checkpoint" would start a run over)."""
    if not directory.is_dir():
        return []
    found = [
        (s, p) for p in directory.iterdir() if (s := parse_checkpoint_name(p.name)) is not None
    ]
    return sorted(found, reverse=True)


def shard_dirs(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-N/`` directory in ``directory``, newest first, whole or
    not (a save still being written is under its ``.partial-`` name, never listed). [] when
    there is no such directory; an :class:`OSError` when it cannot be listed."""
    if not directory.is_dir():
        return []
    found = [
        (s, p)
        for p in directory.iterdir()
        if (s := parse_sharded_checkpoint_name(p.name)) is not None and p.is_dir()
    ]
    return sorted(found, reverse=True)


def shard_sets(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete shard set in ``directory`` (:func:`shard_set_record`),
    newest first. [] when there is no such directory; an :class:`OSError` when it cannot be
    listed."""
    return [(s, p) for s, p in shard_dirs(directory) if _incomplete(p) is None]


def shard_rank_file(rank: int) -> str:
    """``rank-00003.pt``: a rank's own file in a shard set (its RNG states)."""
    return f"rank-{rank:05d}.pt"


class IncompleteShardSet(Exception):
    """Why a ``step-N/`` directory is not a complete shard set (the message is the reason,
    without the directory's name)."""


def shard_set_record(path: Path) -> dict[str, Any]:
    """The digest record of the shard set ``path`` once every file a checkpoint needs is there,
    a regular file of its recorded size (no hashing, no torch; never opens what is not a
    regular file: a FIFO would block); else :class:`IncompleteShardSet` saying what is not."""
    record = _read_record(path)
    files: Mapping[str, Any] = record["files"]
    world: int = record["world_size"]
    if world > len(files):  # every rank has two files: a torn record's size is not listed out
        raise IncompleteShardSet(f"the record lists {len(files)} files for {world} ranks")
    needed = [SHARDED_METADATA, SHARDED_COMMON, *(shard_rank_file(r) for r in range(world))]
    missing = [name for name in needed if name not in files]
    shard_ranks = {int(m.group(1)) for name in files if (m := _SHARD.match(name))}
    missing += [f"__{r}_*.distcp" for r in range(world) if r not in shard_ranks]
    if world < 1 or missing:
        raise IncompleteShardSet(f"the record lists no {', '.join(missing) or 'ranks'}")
    if parse_sharded_checkpoint_name(path.name) != record.get("step"):
        raise IncompleteShardSet(f"holds step {record.get('step')}, not its name's")
    for name, entry in sorted(files.items()):
        size = entry.get("size") if isinstance(entry, Mapping) else None
        if "/" in name or name in ("", ".", "..") or type(size) is not int:
            raise IncompleteShardSet(f"the record's entry {name[:60]!r} is malformed")
        kind = not_regular(path / name)
        if kind is not None:
            raise IncompleteShardSet(f"{name} is {kind}")
        actual = (path / name).stat().st_size
        if actual != size:
            raise IncompleteShardSet(f"{name} has {actual} bytes, {size} were written")
    return record


def _read_record(path: Path) -> dict[str, Any]:
    """The digest record of ``path``, of this format, read only if it is a regular file."""
    kind = not_regular(path / SHARDED_RECORD)
    if kind == "missing":
        raise IncompleteShardSet(f"no {SHARDED_RECORD} (an unfinished save)")
    if kind is not None:
        raise IncompleteShardSet(f"{SHARDED_RECORD} is {kind}")
    try:
        record = json.loads((path / SHARDED_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IncompleteShardSet(f"{SHARDED_RECORD} unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != SHARDED_FORMAT:
        raise IncompleteShardSet(f"{SHARDED_RECORD} is not an {SHARDED_FORMAT} record")
    if record.get("version") != SHARDED_VERSION:
        raise IncompleteShardSet(f"format version {record.get('version')!r} unknown")
    if not isinstance(record.get("files"), Mapping) or type(record.get("world_size")) is not int:
        raise IncompleteShardSet(f"{SHARDED_RECORD} lists no files or no world size")
    return record


def _incomplete(path: Path) -> str | None:
    try:
        shard_set_record(path)
    except IncompleteShardSet as exc:
        return str(exc)
    except OSError as exc:  # a file gone between the checks
        return f"unreadable: {exc.strerror or exc}"
    return None


def damaged_shard_set(path: Path, run_id: str | None = None) -> str | None:
    """Why ``path`` cannot be a whole shard set of run ``run_id`` (None: of any run), judged
    without torch: :func:`shard_set_record`, then ``common.pt``'s label (the step it holds,
    the run that wrote it); None if it looks whole (its content is checked when it is
    loaded). The torch-free part of what the ranks check before they load one."""
    why = _incomplete(path)
    if why is not None:
        return why
    common = path / SHARDED_COMMON
    try:
        label = read_label(common)
    except LabelError as exc:
        return f"{SHARDED_COMMON} unreadable ({exc})"
    except OSError as exc:
        return f"{SHARDED_COMMON} unreadable: {exc.strerror or exc}"
    named = parse_sharded_checkpoint_name(path.name)
    wrong = None if named is None else misnamed(named, label.step)
    return wrong or label_problem(common, run_id)


def checkpoint_on_disk(directory: Path, name: str) -> str | None:
    """``name`` (a ``step-N.pt`` file or a ``step-N/`` shard set) if it is in ``directory``
    whole, else the name of the newest checkpoint there before its step, by name alone; None
    when there is none or the directory cannot be listed.

    What a failed attempt names as its checkpoint: never a save still in flight when it failed
    (a file still under its temp name, a set still under its ``.partial-`` name)."""
    file_step = parse_checkpoint_name(name)
    limit = file_step if file_step is not None else parse_sharded_checkpoint_name(name)
    try:
        files = [(s, p) for s, p in checkpoint_files(directory) if p.is_file()]
        # Committed sets, by their record alone: this runs as an attempt fails, and a rank
        # names the set it saved with the others (the ranks check it whole before they load).
        sets = [(s, p) for s, p in shard_dirs(directory) if (p / SHARDED_RECORD).is_file()]
        found = files + sets
    except OSError:
        return None
    if any(p.name == name for _, p in found):
        return name
    older = [(s, p.name) for s, p in found if limit is None or s < limit]
    return max(older)[1] if older else None


def newest_checkpoint(
    directory: Path,
    *,
    run_id: str | None = None,
    on_skip: Callable[[int, str], None] | None = None,
    unlistable_ok: bool = True,
) -> Checkpoint | None:
    """The newest checkpoint in ``directory`` that looks whole and is run ``run_id``'s (None:
    any run's), judged without torch: a file by :func:`damaged_checkpoint`, a shard set by
    :func:`damaged_shard_set`; named as it is listed (``step-N.pt`` or ``step-N``). None when
    there is none.

    A newer one that fails is passed over, as the ranks' resume passes it, and
    ``on_skip(step, why)`` is told (newest first). A directory that cannot be listed has no
    newest checkpoint, unless ``unlistable_ok`` is false: then its :class:`OSError` is raised
    (``status`` shows such a run as damaged).
    """
    try:
        found = [(s, p, damaged_checkpoint) for s, p in checkpoint_files(directory)]
        found += [(s, p, damaged_shard_set) for s, p in shard_dirs(directory)]
    except OSError:
        if not unlistable_ok:
            raise
        return None
    # Newest first; at the same step a file before a shard set (as before: either may be it).
    for step, path, judge in sorted(found, key=lambda f: (f[0], f[2] is damaged_checkpoint),
                                    reverse=True):  # fmt: skip
        why = judge(path, run_id)
        if why is None:
            return Checkpoint(step, path.name)
        if on_skip is not None:
            on_skip(step, why)
    return None


def newest_step(
    directory: Path,
    *,
    run_id: str | None = None,
    on_skip: Callable[[int, str], None] | None = None,
    unlistable_ok: bool = True,
) -> int | None:
    """The step of :func:`newest_checkpoint` (None: none), for those that need no name: where
    a launch or a resume goes on from."""
    newest = newest_checkpoint(
        directory, run_id=run_id, on_skip=on_skip, unlistable_ok=unlistable_ok
    )
    return None if newest is None else newest.step


def damaged_checkpoint(path: Path, run_id: str | None = None) -> str | None:
    """Why ``path`` cannot be a whole checkpoint of run ``run_id`` (None: of any run), judged
    without torch; None if it looks whole.

    ``torch.save`` writes a zip archive: it starts with ``PK\\x03\\x04`` and ends with the
    archive's central directory, which lists the pickle (``data.pkl``) and one record per
    tensor. So an empty, torn (cut short), overwritten or spliced file shows here at the cost of
    reading the first bytes and the directory; the pickle says the step it holds (which its
    name must say) and the run that wrote it. A file that passes may still fail to load, or
    hold content that changed on disk (``hpc-ddp checkpoints --verify`` loads each one and
    checks every digest). Never opens what is not a regular file (a FIFO would block), and
    never raises for a damaged file: whatever reading it raises is the reason.
    """
    kind = not_regular(path)
    if kind is not None:
        return kind
    try:
        with path.open("rb") as f:
            head = f.read(4)
        if not head:
            return "empty file"
        if head != _ZIP_MAGIC:
            return "not a torch zip archive"
        if not zipfile.is_zipfile(path):
            return "truncated: the zip archive has no end"
        return _damaged_directory(path) or label_problem(path, run_id)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    except Exception as exc:  # is_zipfile lets BadZipFile out of a damaged zip64 locator
        return f"damaged zip archive ({type(exc).__name__}: {exc})"


def _damaged_directory(path: Path) -> str | None:
    """What is wrong with the archive's directory: unreadable, no pickle, or records that are
    not where it says (bytes cut out of the file or added to it before the directory)."""
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except OSError:
        raise  # the caller says unreadable
    except Exception as exc:  # BadZipFile, ValueError, EOFError, struct.error, ...
        return f"damaged zip directory ({exc})"
    if not any(r.filename.endswith(_PICKLE) for r in records):
        return "not a torch archive: no data.pkl record"
    # zipfile shifts every offset by the difference between where the directory is and where
    # it says it is (to read self-extracting archives), so bytes cut out before the directory
    # move the records' offsets: the first and the last record's header no longer start there.
    with path.open("rb") as f:
        for record in {id(r): r for r in (records[0], records[-1])}.values():
            f.seek(max(record.header_offset, 0))
            if record.header_offset < 0 or f.read(4) != _ZIP_MAGIC:
                return f"spliced or torn: record {record.filename} is not where the directory says"
    return None
