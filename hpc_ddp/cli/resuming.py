"""Resuming a run: its job submitted again in the same run directory (``hpc-ddp resume``,
``hpc-ddp submit --resume``).

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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc_ddp.cli.launching import check_local_job, describe_local_plan, report, submit_local
from hpc_ddp.config.load import (
    apply_overrides,
    dump_job_config,
    job_config_from_dict,
    job_config_to_dict,
    load_resolved_config,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.preflight import preflight_job
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import ConfigError, TargetError
from hpc_ddp.manifest import Manifest, read_manifest, write_manifest
from hpc_ddp.rundir import MANIFEST_FILE, RunPaths
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.submission import Prepared, prepare, relocate
from hpc_ddp.state.report import ask_slurm, run_status
from hpc_ddp.state.resumable import check_resumable
from hpc_ddp.state.verdict import SlurmView


@dataclasses.dataclass(frozen=True)
class ResumeRequest:
    """What the user asked: the run, overrides and how to go about it."""

    run_dir: Path
    overrides: Sequence[str] = ()
    force: bool = False
    dry_run: bool = False
    wait: bool = False
    as_json: bool = False


def resume_run(request: ResumeRequest, client: SlurmClient) -> int:
    """Check, prepare and submit the run's job again; returns the exit code."""
    run_dir = request.run_dir.resolve()
    manifest = _manifest_of(run_dir)
    row = run_status(run_dir, _view(client, manifest))
    check = check_resumable(
        row["state"], str(request.run_dir), manifest.job_id, force=request.force
    )
    if check.refusal is not None:
        raise TargetError(check.refusal)
    paths = RunPaths(run_dir)
    old = load_resolved_config(paths.config)
    cfg = _with_overrides(old, request.overrides, paths.config)
    preflight_job(cfg, str(paths.config))
    invocation = ["hpc-ddp", "resume", str(request.run_dir), *request.overrides]
    local = manifest.backend == "local"
    if local:
        check_local_job(cfg)  # an override may ask for more processes than this machine has
    prepared = _prepare_in_place(cfg, manifest, run_dir, invocation, client)
    say = sys.stderr if request.as_json else sys.stdout
    print(f"resuming {run_dir} ({row['state']}, {row['attempts']} attempt(s)) "
          f"{start_words(row['ckpt step'])}", file=say)  # fmt: skip
    for line in _changes(old, cfg):
        print(f"  changed: {line}", file=say)
    if request.dry_run:
        if local:
            print(describe_local_plan(cfg, run_dir))
        else:
            print(prepared.script, end="")
            print(f"# backend: {manifest.backend}; would run: {' '.join(prepared.sbatch_argv)}")
        return 0
    write_text_atomic(paths.config, dump_job_config(cfg))
    write_text_atomic(paths.script, prepared.script)
    earlier = [*manifest.previous_jobs, *([manifest.job_id] if manifest.job_id else [])]
    if manifest.backend == "local":
        return submit_local(
            prepared, wait=request.wait, as_json=request.as_json, previous_jobs=earlier
        )
    return _resubmit_slurm(prepared, manifest, earlier, request, client)


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
    cfg: JobConfig, manifest: Manifest, run_dir: Path, invocation: list[str], client: SlurmClient
) -> Prepared:
    prepared = prepare(
        cfg,
        config_path=Path(manifest.config_source),
        runs_dir=run_dir.parent,
        python=sys.executable,
        invocation=invocation,
        client=client,
    )
    return dataclasses.replace(relocate(prepared, run_dir), created=True)


def _resubmit_slurm(
    prepared: Prepared,
    manifest: Manifest,
    earlier: list[str],
    request: ResumeRequest,
    client: SlurmClient,
) -> int:
    result = client.submit(prepared.paths.script)
    new = dataclasses.replace(
        manifest,
        job_id=result.job_id,
        submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=list(prepared.sbatch_argv),
        previous_jobs=earlier,
    )
    write_manifest(prepared.paths, new)
    report(prepared, "slurm", result.job_id, request.as_json)
    if not request.wait:
        return 0
    from hpc_ddp.cli.waiting import wait_for_jobs

    return wait_for_jobs(client, [result.job_id or ""], run_dirs=[prepared.paths.root])


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
