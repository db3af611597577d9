"""Which runs a command means: every run under ``--runs-dir``, or the run dirs and job ids given.

Shared by ``status``, ``cancel`` and ``logs``; finding runs reads manifests and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hpc_ddp.errors import RunDirError, RunsDirError
from hpc_ddp.rundir import RUNS_DIR_ENV, check_runs_dir, read_manifest


def runs_dir_from(arg: str | None, env: Mapping[str, str]) -> Path:
    """``--runs-dir``, else ``$HPC_DDP_RUNS_DIR``, else ``./runs``."""
    return Path(arg or env.get(RUNS_DIR_ENV) or "runs")


def list_runs(runs_dir: Path) -> list[Path]:
    """Every run and sweep directory (one with a ``manifest.json``) under ``runs_dir``."""
    check_runs_dir(runs_dir, write=False)
    if not runs_dir.exists():
        return []
    try:
        entries = sorted(runs_dir.iterdir())
    except OSError as exc:
        raise RunsDirError(
            f"cannot list --runs-dir {str(runs_dir)!r}: {exc.strerror or exc}. HINT: pass a "
            "readable directory with --runs-dir (or $HPC_DDP_RUNS_DIR)."
        ) from None
    found = []
    for p in entries:
        try:
            if (p / "manifest.json").exists():
                found.append(p)
        except OSError:  # a run directory we may not look into: listed, then shown DAMAGED
            found.append(p)
    return found


def resolve_targets(targets: Sequence[str], runs_dir: Path) -> list[Path]:
    """Run directories for the given run dirs or job ids (all runs when none given).

    A job id is matched against every readable manifest under ``runs_dir``; damaged ones are
    skipped (and named if nothing matched), so one bad run never hides the others.
    """
    if not targets:
        return list_runs(runs_dir)
    found: list[Path] = []
    listing: list[Path] | None = None
    for t in targets:
        path = Path(t)
        if path.is_dir():
            if not (path / "manifest.json").exists():
                read_manifest(path)  # raises: "no manifest.json" with its hint
            found.append(path)
            continue
        listing = list_runs(runs_dir) if listing is None else listing
        match, damaged = [], []
        for p in listing:
            try:
                if read_manifest(p).job_id == t:
                    match.append(p)
            except RunDirError:
                damaged.append(p.name)
        if not match:
            skipped = (
                f" ({len(damaged)} run(s) with a damaged manifest were skipped: "
                f"{', '.join(damaged[:5])}{' ...' if len(damaged) > 5 else ''})"
                if damaged
                else ""
            )
            raise RunDirError(
                f"{t!r} is neither a run directory nor a job id found under {runs_dir}"
                f"{skipped}. HINT: pass the run directory printed by `hpc-ddp submit`, or "
                "--runs-dir."
            )
        found.extend(match)
    return found
