"""The run id: one stable name per run directory, for experiment trackers (W&B, MLflow).

A requeued attempt and ``hpc-ddp resume`` reuse the run directory, so a tracker fed this id
(``wandb.init(id=run_id, resume="allow")``) continues one run instead of starting a new one per
attempt. The id is ``<name>-<8 hex>``: the job name without the submit stamp (a sweep task
adds ``-t<index>``), then 32 random bits so that two runs of one job never share an id.

It lives in ``RUN_DIR/run_id`` (one line), written once: at submit time for a run directory
(:func:`hpc_ddp.submission.submit.make_run_dir`), else by the first reader (a sweep task's
first attempt, a run made by an older hpc-ddp). Creation goes through
:func:`hpc_ddp.durable.create_atomic`: exactly one of several racing creators (every rank of an
attempt) wins, and all read its id.

Standard library only: ``status`` and ``logs`` on a login node import it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from hpc_ddp.durable import create_atomic
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RUN_ID_FILE, RunPaths

__all__ = ["ensure_run_id", "new_run_id", "read_run_id", "recorded_run_id"]

MAX_RUN_ID_LEN = 64
"""W&B and MLflow accept ids up to this long; the name part is cut to fit."""

_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_STAMP = re.compile(r"-\d{8}-\d{6}(-\d+)?$")  # create_run_dir's ``-<stamp>[-N]`` suffix
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HEX = 8


def _base_name(root: Path) -> str:
    """The job name of run directory ``root``: its name without the stamp (sweeps: -t<i>)."""
    name = _STAMP.sub("", root.name)
    if root.parent.name == "tasks" and root.name.isdigit():
        name = f"{_STAMP.sub('', root.parent.parent.name)}-t{root.name}"
    name = _UNSAFE.sub("-", name).strip("-._")
    return name[: MAX_RUN_ID_LEN - _HEX - 1].rstrip("-._") or "run"


def new_run_id(root: Path) -> str:
    """A fresh id for run directory ``root`` (random: two calls differ); writes nothing."""
    return f"{_base_name(root)}-{os.urandom(_HEX // 2).hex()}"


def ensure_run_id(root: Path) -> str:
    """The id in ``root/run_id``, created first if missing; the same on every later call.

    A file that is there but holds no valid id is a :class:`RunDirError`: making a new one
    would silently split the run's history in the tracker.
    """
    path = root / RUN_ID_FILE
    if not path.exists():
        try:
            # A session on a fresh directory (torchrun, a plain process) reads it before
            # anything else has created the directory.
            root.mkdir(parents=True, exist_ok=True)
            create_atomic(path, (new_run_id(root) + "\n").encode())
        except OSError as exc:
            raise RunDirError(
                f"{path}: cannot create the run id ({exc.strerror or exc}). HINT: the run "
                "directory must be writable by this user (or copy run_id from a backup)."
            ) from None
    return _read(path)


def _read(path: Path) -> str:
    """The id in ``path``; an empty file is retried briefly (an O_EXCL creator mid-write)."""
    for attempt in range(20):
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError as exc:
            raise RunDirError(
                f"{path}: unreadable run id ({exc.strerror or exc}). HINT: check the file's "
                "permissions."
            ) from None
        if text or attempt == 19:
            break
        time.sleep(0.05)
    if len(text) > MAX_RUN_ID_LEN or not _VALID.match(text):
        raise RunDirError(
            f"{path}: damaged run id {text[:80]!r}. HINT: restore it from a backup (a tracker "
            "run of this job shows it), or delete the file to start a new id."
        )
    return text


def read_run_id(paths: RunPaths) -> str:
    """The run's stable id, ``<name>-<8 hex>``, the same for every attempt and resume.

    Created at submit time; a run directory without one (a sweep task before its first
    attempt, a run from an older hpc-ddp) gets one now, once, even with racing readers. A
    damaged or unwritable ``run_id`` is a :class:`RunDirError` with a hint.
    """
    return ensure_run_id(paths.root)


def recorded_run_id(paths: RunPaths) -> str | None:
    """The run's id as ``RUN_DIR/run_id`` holds it (None: no such file, or not readable);
    never creates one, unlike :func:`read_run_id` (``status`` and the supervisor write nothing)."""
    try:
        text = paths.run_id_file.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None
