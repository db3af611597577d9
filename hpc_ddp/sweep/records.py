"""A sweep directory's record of its points: ``sweep.yaml`` (its job arrays, ``arrays.json``,
are :mod:`hpc_ddp.backends.arrays`: each array task reads that record when it starts).

A sweep directory (written by :mod:`hpc_ddp.backends.slurm.sweeps` or
:mod:`hpc_ddp.backends.local.sweeps`)::

    SWEEP_DIR/
      sweep.yaml       the expanded points and what they set (one JSON-valued line per point)
      arrays.json      every job array submitted for it: job id, the points it runs, offset
      manifest.json    the sweep's manifest (``array_jobs``: every array job id, in order)
      job.sbatch       the array's script (``job-<n>.sbatch`` for later arrays)
      task_configs.jsonl  every point's config.yaml text, one JSON line per point
      logs/            each array task's batch log (``batch-<array job>_<task id>.out/.err``)
      tasks/<i>/       point i's run directory (config.yaml, logs/, ledger.jsonl, metrics.jsonl,
                       ...), made when its task starts: a point not started yet has none
                       (:mod:`hpc_ddp.rundir.taskconfig` reads its config from task_configs.jsonl)

Everything here reads files only. Login-node side: standard library, PyYAML and the pure core.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.config.yaml_dialect import parse_yaml
from hpc_ddp.errors import ConfigError, RunDirError, TargetError

SWEEP_RECORD = "sweep.yaml"


@dataclass(frozen=True)
class SweepPointRecord:
    """One point as recorded in ``sweep.yaml``."""

    index: int
    name: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class SweepRecord:
    """``sweep.yaml``: what was expanded, and how to rank it."""

    name: str
    sweep_file: str
    base: str
    metric: str
    mode: str
    max_parallel: int | None
    keys: tuple[str, ...]
    """Every swept key, in order of first appearance."""
    points: tuple[SweepPointRecord, ...]


# --- reading the records ------------------------------------------------------------------------


def read_sweep_record(sweep_dir: Path) -> SweepRecord:
    """Read ``sweep.yaml``; a missing or damaged one is a :class:`RunDirError` with a hint.

    A path that is no directory at all (missing, or a file) is a :class:`TargetError`: the
    argument is wrong, not the sweep.
    """
    path = sweep_dir / SWEEP_RECORD
    if not sweep_dir.is_dir():
        what = "is a file, not a sweep directory" if sweep_dir.exists() else "no such directory"
        raise TargetError(
            f"{sweep_dir}: {what}. HINT: pass the sweep directory printed by `hpc-ddp sweep` (it "
            "holds sweep.yaml and tasks/); `hpc-ddp status` lists the sweeps under --runs-dir"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not (sweep_dir / "tasks").is_dir():  # no sweep at all: the argument names none
            what = "a run directory" if (sweep_dir / "manifest.json").exists() else "no sweep"
            raise TargetError(
                f"{sweep_dir}: {what}, not a sweep directory (no {SWEEP_RECORD}). HINT: pass "
                "the sweep directory printed by `hpc-ddp sweep`; a run's state and metrics are "
                f"`hpc-ddp status {sweep_dir}` and its metrics.jsonl"
            ) from None
        raise RunDirError(
            f"{sweep_dir}: no {SWEEP_RECORD}, so not a sweep directory. HINT: pass the sweep "
            "directory printed by `hpc-ddp sweep`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(
            f"{path}: cannot read the sweep record ({exc}). HINT: check that it is a readable "
            "file written by `hpc-ddp sweep`"
        ) from None
    try:
        doc = _parse_record(text, str(path))
        points = tuple(
            SweepPointRecord(int(p["index"]), str(p["name"]), dict(p.get("overrides") or {}))
            for p in doc["points"]
        )
        max_parallel = doc.get("max_parallel")
        return SweepRecord(
            name=str(doc["name"]),
            sweep_file=str(doc.get("sweep_file", "")),
            base=str(doc.get("base", "")),
            metric=str(doc["metric"]["name"]),
            mode=str(doc["metric"]["mode"]),
            max_parallel=None if max_parallel is None else int(max_parallel),
            keys=tuple(str(k) for k in doc.get("keys") or ()),
            points=points,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunDirError(
            f"{path}: unreadable sweep record ({exc!r}). HINT: it is written by `hpc-ddp "
            "sweep`; restore it or sweep again"
        ) from None
    except ConfigError as exc:  # not YAML at all: a damaged record, not a usage error
        raise RunDirError(str(exc)) from None


def _parse_record(text: str, source: str) -> Any:
    """``sweep.yaml`` is YAML whose point lines are JSON objects: read those as JSON (fast),
    and fall back to the YAML reader should anyone have edited the file."""
    head, sep, tail = text.partition("\npoints:\n")
    if sep:
        try:
            doc = parse_yaml(head + "\n", source)
            lines = [line for line in tail.splitlines() if line.strip()]
            if isinstance(doc, dict) and all(line.startswith("- {") for line in lines):
                doc["points"] = [json.loads(line[2:]) for line in lines]
                return doc
        except ValueError:
            pass
    return parse_yaml(text, source)
