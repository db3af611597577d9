"""The run directory: where the login-node side and the on-node runtime meet.

Everything a later command needs (``status``, ``logs``, ``cancel``, a requeued attempt, a
``results`` table days later) is in here as plain text: YAML, JSON and JSON lines, no pickles.

    RUN_DIR/
      config.yaml        the resolved job config the runtime reads
      job.sbatch         the rendered script, exactly as submitted
      manifest.json      job id, backend, submit time and command (written after submission)
      ledger.jsonl       one line per attempt event (start, end, cause)
      metrics.jsonl      rank-0 metrics
      run_id             ``<name>-<8 hex>``: one id for every attempt, for W&B and the like
      tensorboard/       rank-0 metrics as TensorBoard events (``train.tensorboard: true``)
      checkpoints/       step-XXXXXXXX.pt and a ``latest`` pointer
      logs/              batch-<job>.out/.err and rank-<N>.out/.err
      rendezvous/        file:// stores and the published master port

A sweep directory holds ``sweep.yaml``, ``manifest.json`` and ``tasks/<index>/`` run
directories with the layout above.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.durable import write_text_atomic  # re-exported: submission, ports, local import it
from hpc_ddp.errors import RunDirError, RunsDirError

# Re-exported: the manifest lived here before it got its own module, and the CLI, the sweeps and
# the tests import it from here.
from hpc_ddp.manifest import (
    MANIFEST_FILE,
    MANIFEST_VERSION,
    Manifest,
    read_manifest,
    write_manifest,
)
from hpc_ddp.run_id import RUN_ID_FILE, ensure_run_id

# Every HPC_DDP_* environment variable, declared once. The first three are the login-to-node
# contract: the rendered script (or the local backend) sets them, the runtime reads them.
RUN_DIR_ENV = "HPC_DDP_RUN_DIR"
"""This task's run directory (in a sweep's array: ``SWEEP_DIR/tasks/<index>``)."""
ARRAY_OFFSET_ENV = "HPC_DDP_ARRAY_OFFSET"
"""Added to ``SLURM_ARRAY_TASK_ID`` when a sweep is split over several arrays (MaxArraySize)."""
PER_RANK_LOGS_ENV = "HPC_DDP_PER_RANK_LOGS"
"""Set where each rank has its own log file, so every rank may log at INFO."""
RUNS_DIR_ENV = "HPC_DDP_RUNS_DIR"
"""Login side: where runs are created and looked for (default ``./runs``)."""
SITE_ENV = "HPC_DDP_SITE"
"""Login side: the site profile YAML (default ``$XDG_CONFIG_HOME/hpc-ddp/site.yaml``)."""
DEV_CLUSTER_DIR_ENV = "HPC_DDP_DEV_CLUSTER_DIR"
"""Contributors: the dev cluster's state directory."""
RUN_ID_ENV = "HPC_DDP_RUN_ID"
"""Node side: the run's stable id (``RUN_DIR/run_id``), the same in every attempt."""


@dataclass(frozen=True)
class RunPaths:
    """Every path inside one run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def manifest(self) -> Path:
        """Job id, backend, submit time and command: see :mod:`hpc_ddp.manifest`."""
        return self.root / MANIFEST_FILE

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def run_id_file(self) -> Path:
        """One line, the run id: see :func:`read_run_id`."""
        return self.root / RUN_ID_FILE

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files (rank 0, only with ``train.tensorboard: true``)."""
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def rendezvous(self) -> Path:
        return self.root / "rendezvous"

    @property
    def tasks(self) -> Path:
        """Per-task run directories of a sweep."""
        return self.root / "tasks"

    def task(self, index: int) -> RunPaths:
        """The run directory of sweep task ``index``."""
        return RunPaths(self.tasks / str(index))

    def rank_log(self, rank: int, stream: str = "out") -> Path:
        """Where srun writes rank ``rank``'s stdout (``out``) or stderr (``err``)."""
        return self.logs / f"rank-{rank}.{stream}"

    def make(self) -> None:
        """Create the directory, its sub-directories (logs must exist before sbatch) and the
        run id (kept if there is one: a resubmitted run keeps its id)."""
        for d in (self.root, self.logs, self.checkpoints, self.rendezvous):
            d.mkdir(parents=True, exist_ok=True)
        ensure_run_id(self.root)


def read_run_id(paths: RunPaths) -> str:
    """The run's stable id, ``<name>-<8 hex>``, the same for every attempt and resume.

    Created at submit time; a run directory without one (a sweep task before its first
    attempt, a run from an older hpc-ddp) gets one now, once, even with racing readers. A
    damaged or unwritable ``run_id`` is a :class:`RunDirError` with a hint.
    """
    return ensure_run_id(paths.root)


__all__ = [
    "MANIFEST_VERSION",
    "Manifest",
    "RunPaths",
    "check_runs_dir",
    "checkpoint_steps",
    "create_run_dir",
    "damaged_checkpoint",
    "last_metric",
    "new_run_dir",
    "read_manifest",
    "read_run_id",
    "write_manifest",
    "write_text_atomic",
]


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
    candidate = base / f"{name}-{stamp}"
    n = 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = base / f"{name}-{stamp}-{n}"
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
        candidate = base / (f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}")
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


_CKPT_RE = re.compile(r"^step-(\d+)\.pt$")
_ZIP_MAGIC = b"PK\x03\x04"


def checkpoint_steps(paths: RunPaths) -> list[int]:
    """Steps of the checkpoints in a run, ascending, by file name alone (no torch import)."""
    if not paths.checkpoints.is_dir():
        return []
    steps = [int(m.group(1)) for p in paths.checkpoints.iterdir() if (m := _CKPT_RE.match(p.name))]
    return sorted(steps)


def damaged_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be a whole checkpoint, judged without torch; None if it looks whole.

    ``torch.save`` writes a zip archive: it starts with ``PK\\x03\\x04`` and ends with the
    archive's central directory, so an empty, torn (cut short) or overwritten file shows here
    at the cost of two small reads. A file that passes may still fail to load (``hpc-ddp
    checkpoints --verify`` loads each one).
    """
    try:
        with path.open("rb") as f:
            head = f.read(4)
        if not head:
            return "empty file"
        if head != _ZIP_MAGIC:
            return "not a torch zip archive"
        if not zipfile.is_zipfile(path):
            return "truncated: the zip archive has no end"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return None


def last_metric(paths: RunPaths, key: str) -> Any:
    """The last value logged for ``key`` in ``metrics.jsonl`` (None if never logged).

    Lines that are not JSON objects (a torn last line from a killed writer, binary garbage, a
    bare number or list) are skipped. A metrics file that cannot be read at all is a
    :class:`RunDirError`.
    """
    value = None
    try:
        with paths.metrics.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                    continue
                if isinstance(row, dict) and key in row:
                    value = row[key]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunDirError(
            f"{paths.metrics}: unreadable metrics ({exc.strerror or exc}). HINT: check the "
            "file's permissions, or move it aside (training appends a new one)."
        ) from None
    return value
