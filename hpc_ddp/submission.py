"""Building a submission (pure apart from reading the template) and scheduling it.

Like torchx: :func:`prepare` builds everything that will be written and run, so ``--dry-run``
can show it without touching Slurm; :func:`materialize` writes the run directory and
:func:`schedule_slurm` is the one place that calls ``sbatch``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hpc_ddp import __version__
from hpc_ddp.config import JobConfig
from hpc_ddp.config_load import dump_job_config
from hpc_ddp.render import RenderContext, load_template, render_sbatch
from hpc_ddp.rundir import Manifest, RunPaths, new_run_dir, write_manifest, write_text_atomic
from hpc_ddp.slurm_client import SlurmClient


@dataclass(frozen=True)
class Prepared:
    """A submission ready to be written and run; nothing has touched the disk or Slurm yet."""

    cfg: JobConfig
    paths: RunPaths
    script: str
    sbatch_argv: tuple[str, ...]
    invocation: str
    config_source: str


def prepare(
    cfg: JobConfig,
    *,
    config_path: Path,
    runs_dir: Path,
    python: str,
    invocation: Sequence[str],
    client: SlurmClient,
    now: datetime | None = None,
) -> Prepared:
    """Render the script and the sbatch command for ``cfg`` into a new run directory path."""
    now = now or datetime.now(timezone.utc)
    run_dir = new_run_dir(runs_dir.resolve(), cfg.name, now.strftime("%Y%m%d-%H%M%S"))
    paths = RunPaths(run_dir)
    argv = tuple(client.submit_command(paths.script))
    invocation_text = shlex.join(invocation)
    ctx = RenderContext(
        run_dir=str(run_dir),
        python=python,
        config_source=str(config_path),
        submit_command=f"{invocation_text}  ->  {shlex.join(argv)}",
        generated_at=now.isoformat(timespec="seconds"),
        version=__version__,
    )
    template = load_template(cfg, config_path.parent)
    script = render_sbatch(cfg, ctx, template_text=template)
    return Prepared(cfg, paths, script, argv, invocation_text, str(config_path))


def materialize(prepared: Prepared) -> None:
    """Write the run directory: resolved config, the script, and the log directories."""
    prepared.paths.make()
    write_text_atomic(prepared.paths.config, dump_job_config(prepared.cfg))
    write_text_atomic(prepared.paths.script, prepared.script)


def record(
    prepared: Prepared, *, backend: str, job_id: str | None, command: Sequence[str]
) -> Manifest:
    """Write and return the manifest of a submitted run."""
    manifest = Manifest(
        name=prepared.cfg.name,
        backend=backend,
        job_id=job_id,
        submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=list(command),
        config_source=prepared.config_source,
        run_dir=str(prepared.paths.root),
    )
    write_manifest(prepared.paths, manifest)
    return manifest


def schedule_slurm(prepared: Prepared, client: SlurmClient) -> Manifest:
    """Write the run directory, call ``sbatch --parsable`` and record the job id."""
    materialize(prepared)
    result = client.submit(prepared.paths.script)
    return record(prepared, backend="slurm", job_id=result.job_id, command=prepared.sbatch_argv)
