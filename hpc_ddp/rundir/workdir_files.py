"""What a ``command`` program wrote in the directory it runs in, so that the next run
submitted from there is warned before it meets those files.

A ``command`` runs in the directory it was submitted from, on purpose: relative script and
data paths resolve there. But a program that keeps its own snapshot under a relative name
(pytorch/examples' ``multinode.py`` writes ``snapshot.pt``) loads it in *every* run started
there, and a fresh run would silently continue an old one. So rank 0's ``hpc-ddp run``
records, when its child ends, the files the attempt wrote there (:func:`files_written`,
:func:`record_written`), and ``submit`` of another command from that directory names those
still there (:func:`leftovers`).

Only the directory and its subdirectories one level down are looked at, and at most
:data:`MAX_FILES` files recorded: this must stay cheap on a shared filesystem.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.durable import write_text_atomic
from hpc_ddp.rundir.layout import WORKDIR_FILES_FILE

MAX_FILES = 200
"""At most this many files per run are recorded (the first in name order)."""
MAX_RUNS = 500
"""At submit, the newest this many runs of the runs directory are looked at."""


def files_written(workdir: Path, since: float) -> list[str]:
    """Regular files under ``workdir`` (itself and one level down) modified at or after
    ``since`` (epoch seconds), relative to it, sorted. A runs directory under ``workdir``
    adds nothing: its files are two levels down."""
    found: list[str] = []
    for entry in _entries(workdir):
        if entry.is_dir(follow_symlinks=False):
            found += [f"{entry.name}/{e.name}" for e in _entries(Path(entry.path))
                      if _written(e, since)]  # fmt: skip
        elif _written(entry, since):
            found.append(entry.name)
    return sorted(found)[:MAX_FILES]


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        yield from list(entries)


def _written(entry: os.DirEntry[str], since: float) -> bool:
    try:
        return entry.is_file(follow_symlinks=False) and entry.stat().st_mtime >= since
    except OSError:
        return False


def record_written(run_dir: Path, workdir: Path, names: list[str]) -> None:
    """Add ``names`` (relative to ``workdir``) to the run's record, kept across attempts."""
    if not names:
        return
    path = run_dir / WORKDIR_FILES_FILE
    kept = read_written(run_dir)
    if kept is not None and kept[0] == str(workdir):
        names = sorted({*kept[1], *names})[:MAX_FILES]
    write_text_atomic(path, json.dumps({"workdir": str(workdir), "files": names}) + "\n")


def read_written(run_dir: Path) -> tuple[str, list[str]] | None:
    """(working directory, files) a run recorded; None for none, or a record not readable."""
    try:
        data = json.loads((run_dir / WORKDIR_FILES_FILE).read_text())
        return str(data["workdir"]), [str(n) for n in data["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Leftover:
    """A file an earlier run's program wrote in the directory a new run will start in."""

    run_dir: Path
    name: str


def leftovers(runs_dir: Path, workdir: Path) -> list[Leftover]:
    """Files that runs under ``runs_dir`` (the newest :data:`MAX_RUNS`) recorded in
    ``workdir`` and that are still there, newest run first."""
    try:
        runs = sorted((p for p in runs_dir.iterdir() if p.is_dir()), reverse=True)
    except OSError:
        return []
    found: list[Leftover] = []
    seen: set[str] = set()
    for run_dir in runs[:MAX_RUNS]:
        record = read_written(run_dir)
        if record is None or record[0] != str(workdir):
            continue
        for name in record[1]:
            if name not in seen and (workdir / name).is_file():
                seen.add(name)
                found.append(Leftover(run_dir, name))
    return found
