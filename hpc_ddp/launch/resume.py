"""Resuming a run: its job submitted again in the same run directory (``hpc-ddp resume``).

Nothing about the checkpoint is decided here: the runtime always starts from the newest good
checkpoint in ``RUN_DIR/checkpoints`` (verified, with fallback to older ones), exactly as after
a Slurm requeue, and the ledger records the new job's attempts after the earlier ones. What is
decided here is whether resubmitting is safe (:mod:`hpc_ddp.state.resumable`), which config
the new job runs (the run's resolved ``config.yaml``, plus any ``KEY=VALUE`` overrides, e.g. a
larger ``requeue.max_requeues`` after the budget ran out) and how the manifest remembers the
earlier job ids.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc_ddp.config.load import (
    apply_overrides,
    job_config_from_dict,
    job_config_to_dict,
    load_resolved_config,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.preflight import preflight_job
from hpc_ddp.errors import ConfigError, TargetError
from hpc_ddp.launch.submission import (
    Launched,
    Prepared,
    check_local_job,
    launch,
    prepare,
    relocate,
    write_run_files,
)
from hpc_ddp.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.manifest import Manifest, read_manifest
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.state.report import ask_slurm, run_status
from hpc_ddp.state.resumable import check_resumable
from hpc_ddp.state.verdict import SlurmView


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """A checked resume, ready to launch: nothing has been written or submitted yet."""

    run_dir: Path
    manifest: Manifest
    state: str
    """What ``status`` shows for the run now (``CANCELLED``, ``FAILED``, ...)."""
    attempts: int
    checkpoint_step: int | None
    """The newest checkpoint on disk that looks whole (verified by the job when it starts)."""
    old: JobConfig
    prepared: Prepared
    """The run's job with the overrides applied, prepared in its own run directory."""
    changes: tuple[str, ...]
    """``key: old -> new`` for every key the overrides changed."""

    @property
    def previous_jobs(self) -> list[str]:
        """The run's job ids so far, oldest first: the new manifest keeps them."""
        m = self.manifest
        return [*m.previous_jobs, *([m.job_id] if m.job_id else [])]


def plan_resume(
    run_dir: Path,
    overrides: Sequence[str],
    client: SlurmClient,
    *,
    force: bool = False,
    invocation: Sequence[str] = (),
) -> ResumePlan:
    """Check that ``run_dir`` may be resumed now and prepare its job again, in place.

    A run still queued or running is refused (two jobs must never share a run directory); a
    finished one, or one whose state Slurm could not confirm, needs ``force``. Overrides apply
    over the run's resolved config; the name cannot change. Raises :class:`TargetError` or
    :class:`ConfigError` with a hint; writes nothing.
    """
    shown = run_dir
    run_dir = run_dir.resolve()
    manifest = _manifest_of(run_dir)
    row = run_status(run_dir, _view(client, manifest))
    check = check_resumable(row["state"], str(shown), manifest.job_id, force=force)
    if check.refusal is not None:
        raise TargetError(check.refusal)
    paths = RunPaths(run_dir)
    old = load_resolved_config(paths.config)
    cfg = _with_overrides(old, overrides, paths.config)
    preflight_job(cfg, str(paths.config))
    invocation = invocation or ["hpc-ddp", "resume", str(shown), *overrides]
    prepared = _prepare_in_place(cfg, manifest, run_dir, invocation, client)
    return ResumePlan(
        run_dir, manifest, row["state"], int(row["attempts"]), row["ckpt step"], old, prepared,
        tuple(_changes(old, cfg)),
    )  # fmt: skip


def resume(plan: ResumePlan, client: SlurmClient) -> Launched:
    """Write the run's new config (and script) and launch its job again in its run directory;
    the manifest keeps the earlier job ids."""
    write_run_files(plan.prepared)
    return launch(plan.prepared, client, previous_jobs=plan.previous_jobs)


def start_words(step: int | None) -> str:
    """Where the new job starts, as far as the login side can tell.

    Only the zip structure of a checkpoint is checked here (reading its tensors needs torch,
    which the login side never imports); the runtime verifies the weights digest and falls
    back to an older checkpoint when it does not match, so the step is a claim, not a promise.
    """
    if step is None:
        return "from step 0 (no checkpoint)"
    return (
        f"from checkpoint step {step} (the newest on disk; the job verifies its weights when it "
        "starts and falls back to an older checkpoint if they are damaged)"
    )


def _manifest_of(run_dir: Path) -> Manifest:
    if (run_dir / "tasks").is_dir():
        raise TargetError(
            f"{run_dir} is a sweep. HINT: `hpc-ddp sweep --resubmit-failed {run_dir}` resumes "
            "its failed and cancelled tasks from their checkpoints."
        )
    if run_dir.parent.name == "tasks" and (run_dir.parent.parent / MANIFEST_FILE).exists():
        raise TargetError(
            f"{run_dir} is one task of the sweep {run_dir.parent.parent}. HINT: `hpc-ddp sweep "
            f"--resubmit-failed {run_dir.parent.parent}` resumes its unfinished tasks."
        )
    if not (run_dir / MANIFEST_FILE).exists():
        raise TargetError(
            f"{run_dir}: no manifest.json, so not a run directory. HINT: pass a run directory "
            "printed by `hpc-ddp submit` (`hpc-ddp status` lists them)."
        )
    return read_manifest(run_dir)


def _view(client: SlurmClient, manifest: Manifest) -> SlurmView:
    if manifest.backend == "local" or not manifest.job_id:
        return SlurmView({}, accounting={})
    return ask_slurm(client, [manifest.job_id], [manifest.job_id])


def _with_overrides(cfg: JobConfig, overrides: Sequence[str], source: Path) -> JobConfig:
    if not overrides:
        return cfg
    data = apply_overrides(job_config_to_dict(cfg), overrides)
    new = job_config_from_dict(data, f"{source} (with overrides)")
    if new.name != cfg.name:
        raise ConfigError(
            f"name cannot change on resume ({cfg.name!r} -> {new.name!r}). HINT: a new name is "
            "a new run: `hpc-ddp submit` it."
        )
    return new


def _prepare_in_place(
    cfg: JobConfig,
    manifest: Manifest,
    run_dir: Path,
    invocation: Sequence[str],
    client: SlurmClient,
) -> Prepared:
    if manifest.backend == "local":
        check_local_job(cfg)  # an override may ask for more processes than this machine has
    prepared = prepare(
        cfg,
        backend="local" if manifest.backend == "local" else "slurm",
        config_path=Path(manifest.config_source),
        runs_dir=run_dir.parent,
        python=sys.executable,
        invocation=invocation,
        client=client,
    )
    return dataclasses.replace(relocate(prepared, run_dir), created=True)


def _changes(old: JobConfig, new: JobConfig) -> list[str]:
    """``key: old -> new`` for every dotted key the overrides changed."""
    before, after = _flat(job_config_to_dict(old)), _flat(job_config_to_dict(new))
    return [
        f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
        for k in sorted(before.keys() | after.keys())
        if before.get(k) != after.get(k)
    ]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
