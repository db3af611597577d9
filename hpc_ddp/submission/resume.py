"""Resuming a run: its job submitted again in the same run directory (``hpc-ddp resume``).

Nothing about the checkpoint is decided here: the runtime always starts from the newest good
checkpoint in ``RUN_DIR/checkpoints`` (verified, with fallback to older ones), exactly as after
a Slurm requeue, and the ledger records the new job's attempts after the earlier ones. What is
decided here is whether resubmitting is safe (:mod:`hpc_ddp.state.resumable`), which config
the new job runs (the run's resolved ``config.yaml``, plus any ``KEY=VALUE`` overrides, e.g. a
larger ``requeue.max_requeues`` after the budget ran out) and how the manifest remembers the
earlier job ids.

The world size (``slurm.nodes x slurm.tasks_per_node``) stays the one the run trained at, unless
``--elastic`` (:func:`fit_world_size`): then ``train.grad_accum`` is rescaled so that the global
batch stays the same (2 ranks x accumulation 1 -> 1 rank x accumulation 2), and the resume is
sample-exact, not bit-exact (:mod:`hpc_ddp.config.elastic`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc_ddp.backends.base import Backend, Backends
from hpc_ddp.config.elastic import (
    RESEEDED,
    SAMPLE_EXACT,
    Resize,
    Shape,
    planned_accum,
    range_problem,
    rescaled_accum,
    worlds_of,
)
from hpc_ddp.config.exactness import resume_clause, total_below_checkpoint
from hpc_ddp.config.load import (
    apply_overrides,
    job_config_from_dict,
    job_config_to_dict,
    load_resolved_config,
)
from hpc_ddp.config.loginnode import LoginNode, this_machine
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.preflight import preflight_job
from hpc_ddp.errors import ConfigError, TargetError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.checkpoints import checkpoint_files, shard_dirs
from hpc_ddp.rundir.layout import MANIFEST_FILE, RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.manifest import Manifest, read_manifest, record_lock
from hpc_ddp.state.report import ask_backend, newest_checkpoint, run_status
from hpc_ddp.state.resumable import check_resumable
from hpc_ddp.state.verdict import BackendView
from hpc_ddp.submission.submit import (
    REWRITE_UNDO,
    Launched,
    Prepared,
    prepare,
    relocate,
    rewriting,
    settle_rewrite,
    start,
    write_run_files,
)


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
    force: bool = False
    """``--force``: a finished run, or one whose state Slurm could not confirm, goes on too."""
    resize: Resize | None = None
    """``--elastic``: how the world size and the accumulation change (None: they do not)."""
    skipped: str | None = None
    """Why newer checkpoint files are not where the job starts (damaged, misnamed, another
    run's), or None."""

    def start_words(self) -> str:
        """Where the new job starts, as far as the login side can tell, and how exact the
        resume is (:func:`~hpc_ddp.config.exactness.resume_clause`).

        Only the zip structure of a checkpoint is checked here (reading its tensors needs
        torch, which the login side never imports); the runtime verifies every part's digest
        and falls back to an older checkpoint when one does not match, so the step is a claim,
        not a promise.
        """
        step = self.checkpoint_step
        if step is None and self.prepared.cfg.command is not None:
            # A program without a session has no checkpoint of hpc-ddp's, but maybe its own.
            return (
                "from step 0 of hpc-ddp's (no checkpoint); a command without a session goes on "
                "from its own snapshot, if it keeps one"
            )
        if step is None:
            return "from step 0 (no checkpoint)"
        exact = resume_clause(self.old, self.prepared.cfg, self.resize)
        return (
            f"from checkpoint step {step} (the newest on disk; the job verifies its digests "
            f"when it starts and falls back to an older checkpoint if any part is damaged); "
            f"{exact}"
        )


def plan_resume(
    run_dir: Path,
    overrides: Sequence[str],
    backends: Backends,
    *,
    force: bool = False,
    elastic: bool = False,
    invocation: Sequence[str] = (),
) -> ResumePlan:
    """Check that ``run_dir`` may be resumed now and prepare its job again, in place.

    A run still queued or running is refused (two jobs must never share a run directory); a
    finished one, or one whose state Slurm could not confirm, needs ``force``. Overrides apply
    over the run's resolved config; the name cannot change, nor the world size without
    ``elastic`` (:func:`fit_world_size`). Raises :class:`TargetError` or
    :class:`ConfigError` with a hint; writes nothing. ``backends``: the registry its
    backend is picked from.
    """
    shown = run_dir
    run_dir = run_dir.resolve()
    manifest = _manifest_of(run_dir)
    if (run_dir / REWRITE_UNDO).exists():  # a resume killed while it submitted: undo it first
        with record_lock(run_dir):
            settle_rewrite(RunPaths(run_dir), _manifest_of(run_dir).job_id)
    backend = backends.backend(manifest)
    row = run_status(run_dir, _view(backend, manifest), backends)
    check = check_resumable(row["state"], str(shown), manifest.job_id, force=force)
    if check.refusal is not None:
        raise TargetError(check.refusal)
    paths = RunPaths(run_dir)
    old = load_resolved_config(paths.config)
    cfg = _with_overrides(old, overrides, paths.config, manifest)
    check_strategy(old, cfg, paths, shown)
    preflight_job(cfg, str(paths.config), _submit_node(manifest))
    backend.check(cfg)  # an override may ask for more processes than this machine has
    attempts = read_ledger(paths.ledger)
    cfg, resize = fit_world_size(cfg, old, attempts, row["ckpt step"], shown, elastic=elastic)
    _check_total(cfg, row["ckpt step"])
    flag = ["--elastic"] if elastic else []
    invocation = invocation or ["hpc-ddp", "resume", str(shown), *overrides, *flag]
    prepared = _prepare_in_place(cfg, manifest, run_dir, invocation, backend)
    return ResumePlan(
        run_dir, manifest, row["state"], int(row["attempts"]), row["ckpt step"], old, prepared,
        tuple(_changes(old, cfg, resize)), force, resize, newest_checkpoint(paths)[1],
    )  # fmt: skip


def resume(plan: ResumePlan, backends: Backends) -> Launched:
    """Write the run's new config (and script) and launch its job again in its run directory
    (on its own backend, the one the plan was made with; ``backends``: the registry, for the
    run's state); the manifest keeps the earlier job ids.

    The decision is taken again under the run directory's record lock, and the lock is held
    until the new job is recorded: of several ``resume`` racing for one run, the first submits
    and every later one finds its job and submits nothing (:class:`TargetError`, exit 2,
    naming that job), whatever the timing.
    """
    backend = plan.prepared.face
    with record_lock(plan.run_dir):
        manifest = _recheck(plan, backend, backends)
        # The new config and script stay only if the new job is recorded (a refused sbatch
        # leaves the run as it was, and so does a kill in between: see `rewriting`).
        with rewriting(plan.prepared.paths, manifest.job_id):
            write_run_files(plan.prepared)
            return start(plan.prepared, backend, previous_jobs=_job_ids(manifest))


def _recheck(plan: ResumePlan, backend: Backend, backends: Backends) -> Manifest:
    """The run's manifest now, once it is certain (under the lock) that it may be resumed."""
    manifest = _manifest_of(plan.run_dir)
    row = run_status(plan.run_dir, _view(backend, manifest), backends)
    if manifest.job_id != plan.manifest.job_id:
        raise TargetError(
            f"{plan.run_dir}: job {manifest.job_id} ({row['state']}) was submitted into this run "
            "directory while this resume waited for it; nothing was submitted (two jobs must "
            f"never write one run directory). HINT: `hpc-ddp status {plan.run_dir}` follows "
            f"that job; to go on with this resume instead, `hpc-ddp cancel {plan.run_dir}` "
            "first and resume again."
        )
    check = check_resumable(row["state"], str(plan.run_dir), manifest.job_id, force=plan.force)
    if check.refusal is not None:
        raise TargetError(check.refusal)
    return manifest


def _job_ids(manifest: Manifest) -> list[str]:
    """The run's job ids so far, oldest first: the new manifest keeps them."""
    return [*manifest.previous_jobs, *([manifest.job_id] if manifest.job_id else [])]


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


def _view(backend: Backend, manifest: Manifest) -> BackendView:
    """What the run's backend says of its job (nothing, where no queue holds it)."""
    jobs = [manifest.job_id] if manifest.job_id else []
    return ask_backend(backend, jobs, jobs)


def _with_overrides(
    cfg: JobConfig, overrides: Sequence[str], source: Path, manifest: Manifest
) -> JobConfig:
    """The run's config with ``overrides``; its name must stay the one it was submitted with
    (the manifest's), whether an override or a hand edit of ``config.yaml`` changed it."""
    new = cfg
    if overrides:
        data = apply_overrides(job_config_to_dict(cfg), overrides)
        new = job_config_from_dict(data, f"{source} (with overrides)")
    if new.name != manifest.name:
        how = "by an override" if new.name != cfg.name else f"in {source}"
        raise ConfigError(
            f"name cannot change on resume: the run was submitted as {manifest.name!r}, and "
            f"{new.name!r} was set {how}. HINT: a new name is a new run: `hpc-ddp submit` it"
            f"{'' if new.name != cfg.name else f'; or put name: {manifest.name} back in {source}'}."
        )
    return new


def check_strategy(old: JobConfig, cfg: JobConfig, paths: RunPaths, shown: Path) -> None:
    """Refuse a change of ``train.strategy`` (``ddp`` <-> ``fsdp``) that the run's checkpoints
    cannot follow, before anything is written or submitted.

    A DDP model is saved as ``step-N.pt`` files and an FSDP one as ``step-N/`` shard sets, and
    the ranks resume only from their own kind: switched with only the other kind on disk, each
    launch would refuse (starting over would throw the run away) until the supervisor stopped
    it as no progress. A run without checkpoints, or one that also holds its new kind, goes on.
    The built-in trainer wraps by ``train.strategy`` alone, so a hand edit of ``config.yaml`` is
    caught too; a script's ``s.wrap`` may name its strategy itself, so for a ``command:`` or
    ``entrypoint:`` only a change made here (an override) is judged.
    """
    after = cfg.train.strategy
    own_code = cfg.command is not None or cfg.entrypoint is not None
    if own_code and old.train.strategy == after:
        return
    try:
        files = checkpoint_files(paths.checkpoints)
        sets = shard_dirs(paths.checkpoints)
    except OSError:
        return  # the plan's own listing (newest_checkpoint) says why it cannot be read
    mine, other = (sets, files) if after == "fsdp" else (files, sets)
    if mine or not other:
        return
    before, kind = ("ddp", "step-N.pt file") if after == "fsdp" else ("fsdp", "step-N/ shard set")
    raise ConfigError(
        f"train.strategy cannot change from {before} to {after} on resume: the run's "
        f"checkpoints are {before}'s ({len(other)} {kind}(s), newest {other[0][1].name}), "
        f"which a {after} model does not load, so every launch would refuse them; nothing was "
        f"written or submitted. HINT: resume with train.strategy={before} (`hpc-ddp resume "
        f"{shown} train.strategy={before}`, or put it back in {paths.config}); to go on as "
        f"{after}, export the weights (`hpc-ddp checkpoints {shown} --export FILE`) and "
        "start a new run from them."
    )


def fit_world_size(
    cfg: JobConfig,
    old: JobConfig,
    attempts: Sequence[Attempt],
    step: int | None,
    shown: Path,
    *,
    elastic: bool = False,
) -> tuple[JobConfig, Resize | None]:
    """``cfg`` as it may go on from the checkpoint at ``step``, and how its shape changes.

    The global batch is the per-rank batch times the world size (``nodes x tasks_per_node``)
    times the accumulation, and each rank's data and RNG come from the checkpoint by rank:
    another size would silently change the batch (2 nodes -> 1 halves it) and the run would no
    longer be the one an uninterrupted run would have been. So it is refused, unless
    ``elastic``: then ``train.grad_accum`` is set to keep the global batch
    (:func:`~hpc_ddp.config.elastic.rescaled_accum`; refused with a hint when it cannot), and
    the runtime deals out the rest of the epoch over the new ranks (sample-exact, not
    bit-exact). A world size within the config's own ``slurm.min_nodes`` range needs no flag.

    The size the checkpoints were written at is the one the ledger's last attempt ran with (a
    hand edit of ``config.yaml`` does not change that), and its accumulation the one it
    recorded, else the old config's. Without a checkpoint the run starts from step 0 and any
    size is as good as the first.
    """
    if step is None:
        return cfg, None
    last = next((a for a in reversed(attempts) if a.world_size is not None), None)
    world = last.world_size if last is not None and last.world_size else old.slurm.ntasks
    accum = last.grad_accum if last is not None and last.grad_accum else _accum_at(old, world)
    before = Shape(world, accum)
    now = cfg.slurm.ntasks
    if world in worlds_of(cfg.slurm):
        return cfg, None
    if not elastic:
        s = old.slurm
        same = f": `hpc-ddp resume {shown} slurm.nodes={s.nodes} slurm.tasks_per_node="
        same = same + f"{s.tasks_per_node}`" if s.ntasks == world else ""
        raise ConfigError(
            f"slurm.nodes x slurm.tasks_per_node = {cfg.slurm.nodes} x "
            f"{cfg.slurm.tasks_per_node} = {now} ranks, but the run trained with {world} (its "
            f"checkpoint at step {step} too): going on at another world size changes the global "
            f"batch ({world} -> {now} times the per-rank batch) and the run would no longer "
            f"match an uninterrupted one. HINT: resume with the same nodes and tasks_per_node "
            f"({world} ranks in all{same}); or add --elastic to go on at {now} ranks with the "
            "same global batch (train.grad_accum is rescaled; sample-exact, not bit-exact)."
        )
    batch = cfg.train.batch_size
    needed = rescaled_accum(before, now, batch_size=batch)
    if cfg.train.grad_accum not in (old.train.grad_accum, needed):
        raise ConfigError(
            f"train.grad_accum is set to {cfg.train.grad_accum}, but --elastic keeps the global "
            f"batch of {before.describe(batch)}, which takes accumulation {needed} at {now} "
            "ranks. HINT: leave train.grad_accum out: --elastic sets it."
        )
    fitted = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, grad_accum=needed))
    problem = range_problem(fitted)
    if problem is not None:
        raise ConfigError(f"slurm.min_nodes {problem}.")
    return fitted, Resize(world, accum, now, needed)


def _check_total(cfg: JobConfig, step: int | None) -> None:
    """Refuse a built-in trainer's ``train.max_steps`` below the checkpoint's step (it would
    end the run at once as finished). A total from ``train.epochs`` needs the dataset's size,
    which only the job knows: the trainer refuses that one when it starts."""
    builtin = cfg.command is None and cfg.entrypoint is None
    total = cfg.train.max_steps
    if step is not None and builtin and total is not None and total < step:
        raise ConfigError(total_below_checkpoint(step, total, f"train.max_steps={total}"))


def _accum_at(cfg: JobConfig, world: int) -> int:
    """The accumulation ``cfg`` ran at ``world`` ranks (its own, where it cannot say)."""
    try:
        return planned_accum(cfg, world)
    except ConfigError:
        return cfg.train.grad_accum


def _submit_node(manifest: Manifest) -> LoginNode:
    """This machine as the job sees it: in the directory the run was submitted from (its
    ``command:`` runs there), when the manifest records one that still exists."""
    node = this_machine()
    where = Path(manifest.submit_dir) if manifest.submit_dir else None
    if where is None or not where.is_dir():
        return node
    return dataclasses.replace(node, cwd=where)


def _prepare_in_place(
    cfg: JobConfig,
    manifest: Manifest,
    run_dir: Path,
    invocation: Sequence[str],
    backend: Backend,
) -> Prepared:
    import os
    import time

    from hpc_ddp.submission.exclusion import lemon_exclusion

    prepared = prepare(
        cfg,
        backend=backend,
        config_path=Path(manifest.config_source),
        runs_dir=run_dir.parent,
        python=sys.executable,
        invocation=invocation,
        lemons=lemon_exclusion(cfg, backend, os.environ, time.time()),
    )
    # The run's code is found where it was first submitted, not where `resume` runs.
    submit_dir = Path(manifest.submit_dir) if manifest.submit_dir else None
    return dataclasses.replace(relocate(prepared, run_dir), created=True, submit_dir=submit_dir)


def _changes(old: JobConfig, new: JobConfig, resize: Resize | None = None) -> list[str]:
    """``key: old -> new`` for every dotted key the overrides changed; after ``--elastic``,
    why ``train.grad_accum`` changed and what the new world size keeps."""
    before, after = _flat(job_config_to_dict(old)), _flat(job_config_to_dict(new))
    lines = [
        f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
        for k in sorted(before.keys() | after.keys())
        if before.get(k) != after.get(k)
    ]
    if resize is None:
        return lines
    # Samples only for the built-in trainer: a script of its own may batch otherwise.
    batch = new.train.batch_size if new.command is None and new.entrypoint is None else None
    kept = Shape(resize.before_world, resize.before_accum or resize.accum).describe(batch)
    lines = [
        f"{line} (--elastic: keeps the global batch of {kept})"
        if line.startswith("train.grad_accum:")
        else line
        for line in lines
    ]
    if not any(line.startswith("train.grad_accum:") for line in lines):
        kept_by = f"(--elastic: keeps the global batch of {kept})"
        lines.append(f"train.grad_accum: {resize.accum} {kept_by}")
    lines.append(
        f"world size: {resize.before_world} -> {resize.world} ranks (--elastic): {SAMPLE_EXACT}: "
        "every step sees the samples the uninterrupted run would, the rest of the interrupted "
        f"epoch dealt out over {resize.world} rank{'s' if resize.world != 1 else ''}; the "
        f"gradients are summed in another order and the RNG is {RESEEDED}"
    )
    return lines


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
