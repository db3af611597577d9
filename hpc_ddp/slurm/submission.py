"""Building a submission (pure apart from reading the template) and scheduling it.

Like torchx: :func:`prepare` builds everything that will be written and run, so ``--dry-run``
can show it without touching Slurm; :func:`materialize` writes the run directory and
:func:`schedule_slurm` is the one place that calls ``sbatch``.

The run directory's path is only a forecast until :func:`materialize` claims it with
:func:`~hpc_ddp.rundir.create_run_dir`: another submit of the same job in the same second may
take the name first, and the run then moves to the next free suffix (``-2``, ``-3`` ...), its
script rendered again for the path it really got.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hpc_ddp import __version__
from hpc_ddp.config.load import dump_job_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.manifest import Manifest, write_manifest
from hpc_ddp.rundir import RunPaths
from hpc_ddp.runsdir import create_run_dir, make_run_dir, new_run_dir, stamp_of
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.render import RenderContext, load_template, render_sbatch


@dataclass(frozen=True)
class Prepared:
    """A submission ready to be written and run; nothing has touched the disk or Slurm yet.

    ``paths`` is where the run would go now; :func:`materialize` returns the copy that names
    the directory it created (``created``), which is the one to submit and report.
    """

    cfg: JobConfig
    paths: RunPaths
    script: str
    sbatch_argv: tuple[str, ...]
    invocation: str
    config_source: str
    context: RenderContext
    template: str
    runs_dir: Path
    stamp: str
    created: bool = False


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
    base = runs_dir.resolve()
    stamp = stamp_of(now)
    paths = RunPaths(new_run_dir(base, cfg.name, stamp))
    argv = tuple(client.submit_command(paths.script))
    invocation_text = shlex.join(invocation)
    ctx = RenderContext(
        run_dir=str(paths.root),
        python=python,
        config_source=str(config_path),
        submit_command=f"{invocation_text}  ->  {shlex.join(argv)}",
        generated_at=now.isoformat(timespec="seconds"),
        version=__version__,
    )
    template = load_template(cfg, config_path.parent)
    script = render_sbatch(cfg, ctx, template_text=template)
    return Prepared(
        cfg, paths, script, argv, invocation_text, str(config_path), ctx, template, base, stamp
    )


def relocate(prepared: Prepared, run_dir: Path) -> Prepared:
    """``prepared`` for another run directory: the paths, the sbatch argv and the script."""
    paths = RunPaths(run_dir)
    old_script = str(prepared.paths.script)
    argv = tuple(str(paths.script) if a == old_script else a for a in prepared.sbatch_argv)
    ctx = dataclasses.replace(
        prepared.context,
        run_dir=str(run_dir),
        submit_command=f"{prepared.invocation}  ->  {shlex.join(argv)}",
    )
    script = render_sbatch(prepared.cfg, ctx, template_text=prepared.template)
    return dataclasses.replace(prepared, paths=paths, script=script, sbatch_argv=argv, context=ctx)


def materialize(prepared: Prepared) -> Prepared:
    """Create the run directory (atomically, never one another submit holds) and write the
    resolved config, the script and the log directories; returns the submission as created.
    """
    if prepared.created:
        raise ValueError(f"{prepared.paths.root} was already materialized")
    root = create_run_dir(prepared.runs_dir, prepared.cfg.name, prepared.stamp)
    if root != prepared.paths.root:
        prepared = relocate(prepared, root)
    prepared = dataclasses.replace(prepared, created=True)
    make_run_dir(prepared.paths)
    write_text_atomic(prepared.paths.config, dump_job_config(prepared.cfg))
    write_text_atomic(prepared.paths.script, prepared.script)
    return prepared


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
    """Write the run directory (unless :func:`materialize` did), call ``sbatch --parsable``
    and record the job id; the manifest's ``run_dir`` is where the run really went."""
    if not prepared.created:
        prepared = materialize(prepared)
    result = client.submit(prepared.paths.script)
    return record(prepared, backend="slurm", job_id=result.job_id, command=prepared.sbatch_argv)
