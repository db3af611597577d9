"""The runs directory on disk (login side): claiming a fresh run directory in it.

Each ``hpc-ddp submit`` and ``hpc-ddp sweep`` creates one directory ``<name>-<stamp>[-N]``
under ``--runs-dir`` (``$HPC_DDP_RUNS_DIR``, default ``./runs``); what goes inside is declared
by :mod:`hpc_ddp.rundir`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from hpc_ddp.errors import RunsDirError
from hpc_ddp.run_id import ensure_run_id
from hpc_ddp.rundir import RUNS_DIR_ENV, STAMP_FORMAT, RunPaths, run_dir_name

__all__ = [
    "check_runs_dir",
    "create_run_dir",
    "make_run_dir",
    "new_run_dir",
    "runs_dir_from",
    "stamp_of",
]


def runs_dir_from(arg: str | None, env: Mapping[str, str]) -> Path:
    """``--runs-dir``, else ``$HPC_DDP_RUNS_DIR``, else ``./runs``."""
    return Path(arg or env.get(RUNS_DIR_ENV) or "runs")


def stamp_of(now: datetime) -> str:
    """The stamp of a run directory submitted at ``now`` (UTC)."""
    return now.strftime(STAMP_FORMAT)


def check_runs_dir(base: Path, *, write: bool) -> None:
    """Refuse a runs directory that is a file, or unreadable (``write``: unwritable).

    A missing one is fine (nothing to read; created on the first submit). Raises
    :class:`RunsDirError` (exit 2), naming the path and what to pass instead.
    """
    hint = "HINT: pass an existing, writable directory with --runs-dir (or $HPC_DDP_RUNS_DIR)"
    if not base.exists():
        if base.is_symlink():
            raise RunsDirError(f"--runs-dir {str(base)!r} is a dangling symlink. {hint}.")
        return
    if not base.is_dir():
        raise RunsDirError(f"--runs-dir {str(base)!r} is a file, not a directory. {hint}.")
    mode = os.R_OK | os.X_OK | (os.W_OK if write else 0)
    if not os.access(base, mode):
        what = "writable" if write else "readable"
        raise RunsDirError(f"--runs-dir {str(base)!r} is not {what} by this user. {hint}.")


def new_run_dir(base: Path, name: str, stamp: str) -> Path:
    """The path :func:`create_run_dir` would take now (for a dry run; creates nothing).

    A ``base`` that could not hold it (a file, unwritable) is a :class:`RunsDirError` already.
    """
    check_runs_dir(base, write=True)
    candidate = base / run_dir_name(name, stamp)
    n = 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = base / run_dir_name(name, stamp, n)
    return candidate


def create_run_dir(base: Path, name: str, stamp: str) -> Path:
    """Create and return a fresh run directory ``base/<name>-<stamp>[-N]``.

    ``mkdir`` without ``exist_ok`` is the claim: of several submits in the same second (threads,
    processes, or login nodes sharing the file system) exactly one creates each name, and the
    others go on to the next suffix, so no two runs ever share a directory. ``base`` is created
    if missing; a file or an unwritable directory there is a :class:`RunsDirError`.
    """
    check_runs_dir(base, write=True)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunsDirError(
            f"cannot create --runs-dir {str(base)!r}: {exc.strerror or exc}. HINT: pass a "
            "directory you can write to with --runs-dir (or $HPC_DDP_RUNS_DIR)."
        ) from None
    n = 1
    while True:
        candidate = base / run_dir_name(name, stamp, n)
        try:
            candidate.mkdir()
        except FileExistsError:
            n += 1
            continue
        except OSError as exc:
            raise RunsDirError(
                f"cannot create run directory {str(candidate)!r}: {exc.strerror or exc}. HINT: "
                "pass a directory you can write to with --runs-dir (or $HPC_DDP_RUNS_DIR)."
            ) from None
        return candidate


def make_run_dir(paths: RunPaths) -> None:
    """Create the directory, its sub-directories (logs must exist before sbatch) and the run
    id (kept if there is one: a resubmitted run keeps its id)."""
    for d in (paths.root, paths.logs, paths.checkpoints, paths.rendezvous):
        d.mkdir(parents=True, exist_ok=True)
    ensure_run_id(paths.root)
