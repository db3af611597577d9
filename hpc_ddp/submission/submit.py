"""Launching a run: claim its directory, prepare it, start it on a backend, record it.

Like torchx: :func:`prepare` builds everything that will be written and run, so ``--dry-run``
can show it without touching Slurm or the disk; :func:`launch` writes the run directory
(:func:`materialize`), starts it on its backend (:mod:`hpc_ddp.backends`: ``sbatch
--parsable``, or the local backend's processes) and records the job in ``manifest.json``
(:func:`record`), holding the run directory's record lock
(:func:`~hpc_ddp.rundir.manifest.record_lock`)
from the submission to the record, so that the job's tasks read the record that names their
job (:mod:`hpc_ddp.job.task`). A local run has no script: nothing renders or writes a
``job.sbatch`` it would never use.

Run directories live under the runs directory (``--runs-dir``, ``$HPC_DDP_RUNS_DIR``, default
``./runs``), one per submission, ``<name>-<stamp>[-N]``; what goes inside is declared by
:mod:`hpc_ddp.rundir.layout`. A prepared run's path is only a forecast until :func:`materialize`
claims it with :func:`create_run_dir`: another submit of the same job in the same second may
take the name first, and the run then moves to the next free suffix (``-2``, ``-3`` ...), its
script rendered again for the path it really got.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.base import Backend, PlanRequest, SubmitPlan
from hpc_ddp.backends.catalog import BackendName, auto_backend, is_backend, unknown_backend
from hpc_ddp.config.load import dump_job_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import ConfigError, RunsDirError
from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir.layout import RUNS_DIR_ENV, STAMP_FORMAT, RunPaths, run_dir_name

if TYPE_CHECKING:
    from hpc_ddp.config.leadtime import LeadTime
    from hpc_ddp.lemons.record import Exclusion
    from hpc_ddp.rundir.manifest import Manifest

# What only a start needs (the manifest's reader and writer, the run id) is imported where it
# is used: a dry run (`prepare`) loads none of it.


def runs_dir_from(arg: str | None, env: Mapping[str, str]) -> Path:
    """``--runs-dir``, else ``$HPC_DDP_RUNS_DIR``, else ``./runs``."""
    return Path(arg or env.get(RUNS_DIR_ENV) or "runs")


def stamp_of(now: datetime) -> str:
    """The stamp of a run directory submitted at ``now`` (UTC)."""
    return now.strftime(STAMP_FORMAT)


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
    candidate = base / run_dir_name(name, stamp)
    n = 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = base / run_dir_name(name, stamp, n)
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
        candidate = base / run_dir_name(name, stamp, n)
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


def make_run_dir(paths: RunPaths) -> None:
    """Create the directory, its sub-directories (logs must exist before sbatch) and the run
    id (kept if there is one: a resubmitted run keeps its id)."""
    from hpc_ddp.rundir.run_id import ensure_run_id

    for d in (paths.root, paths.logs, paths.checkpoints, paths.rendezvous):
        d.mkdir(parents=True, exist_ok=True)
    ensure_run_id(paths.root)


def choose_backend(
    requested: str, on_path: Callable[[str], str | None] | None = None
) -> BackendName:
    """The backend ``requested`` names; ``auto``: the first whose login command ``on_path``
    finds (``sbatch`` for Slurm; default: ``shutil.which``), else processes of this machine."""
    if requested == "auto":
        return auto_backend(on_path or _which)
    if is_backend(requested):
        return requested
    raise ConfigError(f"{unknown_backend(requested, auto=True)}. HINT: use auto.")


def _which(command: str) -> str | None:
    import shutil  # not at the top: shutil loads the compression modules, ~3 ms of every submit

    return shutil.which(command)


@dataclass(frozen=True)
class Prepared:
    """A run ready to be written and started; nothing has touched the disk or Slurm yet.

    ``paths`` is where the run would go now; :func:`materialize` returns the copy that names
    the directory it created (``created``), which is the one to start and report. ``plan`` is
    what its backend will write and run there (a local run has no script).
    """

    cfg: JobConfig
    face: Backend
    """The backend's login face that planned it and starts it."""
    paths: RunPaths
    plan: SubmitPlan
    invocation: str
    config_source: str
    runs_dir: Path
    stamp: str
    created: bool = False
    submit_dir: Path | None = None
    """Where the run was submitted from: a resume keeps the first submit's (its ``command:``
    runs there); None: this process's working directory."""
    lemons: Exclusion | None = None
    """The lemon record's nodes and what the submission does with them (``--exclude``);
    None: the record was not asked."""
    lead: LeadTime | None = None
    """What ``requeue.lead_time: auto`` chose (``cfg`` holds the number); None: a number was
    given."""
    grace: str | None = None
    """The warning that a preemption's grace time is shorter than this user's measured stop
    (:func:`~hpc_ddp.submission.leadtime.check_grace`); None: long enough, or not known."""

    @property
    def backend(self) -> BackendName:
        """The name of the backend the run goes to."""
        return self.face.name

    @property
    def script(self) -> str | None:
        """The batch script the run's backend renders (Slurm's ``job.sbatch``), else None."""
        return self.plan.script

    @property
    def sbatch_argv(self) -> tuple[str, ...]:
        """The command that submits :attr:`script` (``sbatch --parsable RUN_DIR/job.sbatch``);
        () where there is no script (``plan.command`` then says what a start runs)."""
        return self.plan.command if self.plan.script is not None else ()


def prepare(
    cfg: JobConfig,
    *,
    backend: Backend,
    config_path: Path,
    runs_dir: Path,
    python: str,
    invocation: Sequence[str],
    now: datetime | None = None,
    lemons: Exclusion | None = None,
    grace: str | None = None,
) -> Prepared:
    """Everything a run of ``cfg`` on ``backend`` (its login face, from the registry) will
    write and run, for a new run directory
    path (:meth:`~hpc_ddp.backends.base.Backend.plan`: on Slurm the script and the sbatch
    command; locally, only the checks that the machine can run it). Asks Slurm nothing (a dry
    run needs no Slurm client). ``lemons``: the nodes it leaves out, decided before
    (:func:`~hpc_ddp.submission.exclusion.lemon_exclusion`, which may ask Slurm)."""
    now = now or datetime.now(timezone.utc)
    lead = None
    if cfg.requeue.lead_time == "auto":  # the history is read only then
        from hpc_ddp.submission.leadtime import resolve_lead_time

        cfg, lead = resolve_lead_time(cfg, os.environ, now.timestamp())
    base = runs_dir.resolve()
    stamp = stamp_of(now)
    paths = RunPaths(new_run_dir(base, cfg.name, stamp))
    invocation_text = shlex.join(invocation)
    exclude = lemons.nodes if lemons is not None else ()
    generated = now.isoformat(timespec="seconds")
    request = PlanRequest(python, config_path, invocation_text, generated, exclude)
    plan = backend.plan(cfg, paths, request)
    return Prepared(
        cfg, backend, paths, plan, invocation_text, str(config_path), base, stamp, lemons=lemons,
        lead=lead, grace=grace,
    )  # fmt: skip


def relocate(prepared: Prepared, run_dir: Path) -> Prepared:
    """``prepared`` for another run directory: the paths, and its backend's plan for them."""
    paths = RunPaths(run_dir)
    plan = prepared.face.moved(prepared.plan, prepared.cfg, paths)
    return dataclasses.replace(prepared, paths=paths, plan=plan)


def materialize(prepared: Prepared) -> Prepared:
    """Create the run directory (atomically, never one another submit holds) and write the
    resolved config, the script (Slurm) and the log directories; returns the run as created.
    """
    if prepared.created:
        raise ValueError(f"{prepared.paths.root} was already materialized")
    root = create_run_dir(prepared.runs_dir, prepared.cfg.name, prepared.stamp)
    if root != prepared.paths.root:
        prepared = relocate(prepared, root)
    prepared = dataclasses.replace(prepared, created=True)
    write_run_files(prepared)
    return prepared


def write_run_files(prepared: Prepared) -> None:
    """Write the run directory's sub-directories, its resolved config and (Slurm) its script
    into ``prepared.paths``, which exists: a fresh claim, or a run going on in place."""
    make_run_dir(prepared.paths)
    write_text_atomic(prepared.paths.config, dump_job_config(prepared.cfg))
    if prepared.script is not None:
        write_text_atomic(prepared.paths.script, prepared.script)


REWRITE_UNDO = ".rewrite-undo"
"""A run directory's copy of the files a resume rewrites (``config.yaml``, ``job.sbatch``) and
of the job its manifest named, kept while the new job is submitted: see :func:`rewriting`."""


@contextmanager
def rewriting(paths: RunPaths, job_before: str | None) -> Iterator[None]:
    """Rewrite a run's files in the ``with`` block (a resume's new config and script) so that
    they stay only if the block records a new job in the manifest.

    sbatch must read the new script at its own path (Slurm knows a job by its script's path,
    and ``status`` finds the job by it), so the new files cannot wait under other names until
    the submission succeeds. Instead the old ones are copied into ``RUN_DIR/.rewrite-undo/``
    first, with the job the manifest named (``job_before``): a refused submission (or any
    error) puts them back before it propagates, and if this process is killed in between, the
    next :func:`settle_rewrite` does (the manifest still names ``job_before``: nothing was
    recorded, so the job that sbatch may have accepted refuses to start, as any job the
    manifest does not name). The manifest write is the commit. The caller holds the run
    directory's record lock.
    """
    import shutil

    settle_rewrite(paths, job_before)
    _stash(paths, job_before)
    try:
        yield
    except BaseException:
        settle_rewrite(paths, job_before)
        raise
    shutil.rmtree(paths.root / REWRITE_UNDO, ignore_errors=True)


def settle_rewrite(paths: RunPaths, job_now: str | None) -> None:
    """Finish a rewrite that a killed process left (:func:`rewriting`): put the stashed files
    back when the manifest still names the job it named before (``job_now``), else drop the
    stash (the new job was recorded: the new files are its). Under the record lock."""
    import shutil

    undo = paths.root / REWRITE_UNDO
    shutil.rmtree(undo.with_name(f"{REWRITE_UNDO}.tmp"), ignore_errors=True)
    try:
        before = (undo / "job").read_text(encoding="utf-8")
    except FileNotFoundError:
        if undo.exists() or undo.is_symlink():
            shutil.rmtree(undo, ignore_errors=True)  # half made: nothing was rewritten yet
        return
    if before == (job_now or ""):
        for path in _rewritten(paths):
            kept = undo / path.name
            if kept.is_file():
                write_text_atomic(path, kept.read_text(encoding="utf-8"))
            else:
                path.unlink(missing_ok=True)
    shutil.rmtree(undo, ignore_errors=True)


def _rewritten(paths: RunPaths) -> tuple[Path, ...]:
    return (paths.config, paths.script)


def _stash(paths: RunPaths, job_before: str | None) -> None:
    import shutil

    # Made whole under another name, then renamed: a stash exists complete or not at all
    # (its ``job`` file, written last, is what settle_rewrite trusts).
    tmp = paths.root / f"{REWRITE_UNDO}.tmp"
    tmp.mkdir()
    for path in _rewritten(paths):
        if path.is_file():
            shutil.copyfile(path, tmp / path.name)
    write_text_atomic(tmp / "job", job_before or "")
    os.rename(tmp, paths.root / REWRITE_UNDO)


def record(
    prepared: Prepared,
    *,
    job_id: str | None,
    command: Sequence[str],
    previous_jobs: Sequence[str] = (),
) -> Manifest:
    """Write and return the manifest of a started run (``previous_jobs``: a resumed run's
    earlier job ids, oldest first), with its provenance: the submit directory, its git commit
    and the digest of the job's code there (:mod:`hpc_ddp.rundir.provenance`)."""
    import sys

    from hpc_ddp.rundir.manifest import Manifest, write_manifest
    from hpc_ddp.rundir.provenance import gather, search_path

    where = prepared.submit_dir or Path.cwd()
    found = gather(prepared.cfg, where, search_path(prepared.cfg, where, sys.path))
    manifest = Manifest(
        name=prepared.cfg.name,
        backend=prepared.backend,
        job_id=job_id,
        submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=list(command),
        config_source=prepared.config_source,
        run_dir=str(prepared.paths.root),
        previous_jobs=list(previous_jobs),
        submit_dir=found.submit_dir,
        git_commit=found.git_commit,
        git_dirty=found.git_dirty,
        code_file=None if found.code is None else found.code.file,
        code_digest=None if found.code is None else found.code.digest,
    )
    write_manifest(prepared.paths, manifest)
    return manifest


@dataclass(frozen=True)
class Launched:
    """A run that was started: where it went, its job id and its manifest."""

    prepared: Prepared
    job_id: str
    manifest: Manifest
    local: Any = None
    """The handle of a job this process holds (a local run's
    :class:`~hpc_ddp.backends.local.controller.LocalJob`, asked through
    :meth:`~hpc_ddp.backends.base.Backends.held`); None on Slurm."""
    follow_from: int = 0
    """Local: where rank 0's log ended before the start (``--wait`` follows it from there)."""

    @property
    def paths(self) -> RunPaths:
        """The run directory the run really went to."""
        return self.prepared.paths


def launch(prepared: Prepared) -> Launched:
    """Write the run directory (unless it was already) and start the run on its backend
    (``sbatch --parsable``, or the local backend's processes). The manifest records the job id.

    The run directory's record lock (:func:`~hpc_ddp.rundir.manifest.record_lock`) is held from the
    submission to the record, so that the job's tasks, should they start at once, wait for the
    record that names their job before they check it.
    """
    from hpc_ddp.rundir.manifest import record_lock

    if not prepared.created:
        prepared = materialize(prepared)
    with record_lock(prepared.paths.root):
        return start(prepared, prepared.face)


def start(prepared: Prepared, backend: Backend, *, previous_jobs: Sequence[str] = ()) -> Launched:
    """Start a written run on ``backend`` (the one ``prepared`` was planned for) and record its
    job in ``manifest.json``; ``previous_jobs`` are the run's earlier job ids (a resumed run).

    The caller holds the run directory's :func:`~hpc_ddp.rundir.manifest.record_lock` and has
    decided, under it, that no other job of the run is live: one job per run directory.
    """
    started = backend.start(prepared.cfg, prepared.paths)
    manifest = record(
        prepared, job_id=started.job_id, command=started.command, previous_jobs=previous_jobs
    )
    return Launched(
        prepared, started.job_id, manifest, local=started.handle, follow_from=started.follow_from
    )


def test_only(prepared: Prepared) -> str:
    """``sbatch --test-only`` (:meth:`~hpc_ddp.backends.base.Backend.test_only`): Slurm's word
    on whether and when the job would start. The run directory is made for it (sbatch reads
    the script there) and removed again."""
    import shutil

    prepared = materialize(prepared)
    try:
        return prepared.face.test_only(prepared.paths)
    finally:
        shutil.rmtree(prepared.paths.root, ignore_errors=True)
