"""The run directory: where the login-node side and the on-node runtime meet.

Everything a later command needs (``status``, ``logs``, ``cancel``, a requeued attempt, a
``results`` table days later) is in here as plain text: YAML, JSON and JSON lines, no pickles.

    RUN_DIR/
      config.yaml        the resolved job config the runtime reads
      job.sbatch         the rendered script, exactly as submitted
      manifest.json      job id, backend, submit time and command (written after submission)
      ledger.jsonl       one line per attempt event (start, end, cause)
      metrics.jsonl      rank-0 metrics
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_ddp.errors import RunDirError

MANIFEST_VERSION = 1


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
        return self.root / "manifest.json"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

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
        """Create the directory and its sub-directories (logs must exist before sbatch)."""
        for d in (self.root, self.logs, self.checkpoints, self.rendezvous):
            d.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class Manifest:
    """What was submitted, where and when; written once per submission."""

    name: str
    backend: str
    job_id: str | None
    submitted_at: str
    command: list[str]
    config_source: str
    run_dir: str
    array: str | None = None
    array_jobs: list[str] = field(default_factory=list)
    version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        """The manifest as indented JSON text."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(paths: RunPaths, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically."""
    write_text_atomic(paths.manifest, manifest.to_json())


def read_manifest(run_dir: Path) -> Manifest:
    """Read a run's manifest; a missing or damaged one is a :class:`RunDirError` with a hint."""
    path = RunPaths(run_dir).manifest
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return Manifest(**data)
    except FileNotFoundError:
        raise RunDirError(
            f"{run_dir}: no manifest.json. HINT: pass a run directory printed by "
            "`hpc-ddp submit` (or a job id)."
        ) from None
    except (ValueError, TypeError) as exc:
        raise RunDirError(f"{path}: unreadable manifest ({exc}).") from None


def new_run_dir(base: Path, name: str, stamp: str) -> Path:
    """A fresh run directory ``base/<name>-<stamp>[-N]`` that does not exist yet."""
    candidate = base / f"{name}-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{name}-{stamp}-{n}"
    return candidate


_CKPT_RE = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_steps(paths: RunPaths) -> list[int]:
    """Steps of the complete-looking checkpoints in a run, ascending (no torch import)."""
    if not paths.checkpoints.is_dir():
        return []
    steps = [int(m.group(1)) for p in paths.checkpoints.iterdir() if (m := _CKPT_RE.match(p.name))]
    return sorted(steps)


def last_metric(paths: RunPaths, key: str) -> Any:
    """The last value logged for ``key`` in ``metrics.jsonl`` (None if never logged)."""
    if not paths.metrics.exists():
        return None
    value = None
    with paths.metrics.open() as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn last line from a killed writer
            if key in row:
                value = row[key]
    return value
