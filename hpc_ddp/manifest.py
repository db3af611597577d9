"""The manifest: ``RUN_DIR/manifest.json``, what was submitted, where and when.

Written once per submission (and again by ``hpc-ddp resume``, which adds the earlier job ids);
read by every later command (``status``, ``cancel``, ``logs``, ``resume``, a sweep's
``results``) to find the run's job. Plain JSON, standard library only: a login node reads it.
:mod:`hpc_ddp.layout` declares where it lives (:attr:`~hpc_ddp.layout.RunPaths.manifest`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import RunDirError
from hpc_ddp.layout import MANIFEST_FILE, RunPaths

__all__ = ["MANIFEST_VERSION", "Manifest", "read_manifest", "write_manifest"]

MANIFEST_VERSION = 1


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
    previous_jobs: list[str] = field(default_factory=list)
    """Earlier job ids of this run, oldest first: ``hpc-ddp resume`` submits it again."""
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
    "version": (int,),
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
        if key in data and (not isinstance(value, types) or isinstance(value, bool)):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _damaged(path, f"{key} is {value!r:.80}, expected {wanted}")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise _damaged(path, f"{key} is {value!r:.80}, expected a list of strings")
    known = {f.name for f in fields(Manifest)}
    try:  # keys a newer hpc-ddp added are left out, not fatal
        return Manifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:  # a required key is missing
        raise _damaged(path, str(exc)) from None


def _damaged(path: Path, why: str) -> RunDirError:
    return RunDirError(
        f"{path}: damaged manifest ({why[:300]}). HINT: the run's job id is also in its logs "
        "(logs/batch-<job>.out); restore manifest.json from a backup or move the run aside."
    )
