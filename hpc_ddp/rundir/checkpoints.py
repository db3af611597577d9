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
* :func:`shard_sets`: every committed sharded (FSDP) checkpoint, a ``step-N/`` directory
  renamed in whole once every rank wrote its shard, its digest record written last
  (:mod:`hpc_ddp.checkpoint.sharded` checks every shard's digest before it loads one).
* :func:`checkpoint_on_disk`: what a failed attempt names as its checkpoint, the save it was
  told of if that is whole on disk, else the newest one before it (either kind).
* :func:`newest_step`: the newest file that passes :func:`damaged_checkpoint`, or the newest
  committed shard set, the one a resume would take unless its content (checked with torch,
  :mod:`hpc_ddp.checkpoint.format`) changed on disk.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

from hpc_ddp.rundir.checkpoint_label import label_problem, not_regular
from hpc_ddp.rundir.layout import (
    SHARDED_RECORD,
    parse_checkpoint_name,
    parse_sharded_checkpoint_name,
    sharded_checkpoint_name,
)

__all__ = [
    "checkpoint_files",
    "checkpoint_on_disk",
    "damaged_checkpoint",
    "is_shard_set",
    "newest_step",
    "shard_sets",
]

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


def shard_sets(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every committed shard set in ``directory``, newest first: a
    ``step-N/`` directory that holds its digest record (a save cut short has none, and one
    still being written is under its ``.partial-`` name). [] when there is no such directory;
    an :class:`OSError` when it cannot be listed."""
    if not directory.is_dir():
        return []
    found = [
        (s, p)
        for p in directory.iterdir()
        if (s := parse_sharded_checkpoint_name(p.name)) is not None
        and (p / SHARDED_RECORD).is_file()
    ]
    return sorted(found, reverse=True)


def is_shard_set(directory: Path, step: int | None) -> bool:
    """Whether ``step``'s checkpoint in ``directory`` is a committed shard set (an FSDP run's
    ``step-N/``, named so in the ledger), not a ``step-N.pt`` file."""
    if step is None:
        return False
    return (directory / sharded_checkpoint_name(step) / SHARDED_RECORD).is_file()


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
        found = files + shard_sets(directory)
    except OSError:
        return None
    if any(p.name == name for _, p in found):
        return name
    older = [(s, p.name) for s, p in found if limit is None or s < limit]
    return max(older)[1] if older else None


def newest_step(
    directory: Path,
    *,
    run_id: str | None = None,
    on_skip: Callable[[int, str], None] | None = None,
    unlistable_ok: bool = True,
) -> int | None:
    """The step of the newest checkpoint in ``directory`` that looks whole and is run
    ``run_id``'s (None: any run's), judged without torch (:func:`damaged_checkpoint`), or of
    the newest committed shard set (:func:`shard_sets`) if that is newer; None when there is
    none.

    A newer file that fails is passed over, as the ranks' resume passes it, and
    ``on_skip(step, why)`` is told (newest first). A directory that cannot be listed has no
    newest checkpoint, unless ``unlistable_ok`` is false: then its :class:`OSError` is raised
    (``status`` shows such a run as damaged).
    """
    try:
        files = checkpoint_files(directory)
        sets = shard_sets(directory)
    except OSError:
        if not unlistable_ok:
            raise
        return None
    newest_set = sets[0][0] if sets else None
    for step, path in files:
        if newest_set is not None and newest_set >= step:
            return newest_set
        why = damaged_checkpoint(path, run_id)
        if why is None:
            return step
        if on_skip is not None:
            on_skip(step, why)
    return newest_set


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
