"""The session's checkpoints: restore the newest good one, save the tracked objects.

Every rank calls :meth:`Checkpointer.restore` and :meth:`Checkpointer.save` at the same point:
rank 0 picks, reads and writes the files (the writing on a background thread), the others get
its choice and its errors, so every rank resumes from the same step or fails with the same
error. While rank 0 does file I/O the others wait on the rendezvous store
(:class:`~hpc_ddp.runtime.handoff.Handoff`, bounded by ``fault.checkpoint_timeout_s``), never in
a collective: a collective's timeout (``dist.timeout_s``, and under NCCL the watchdog) would
otherwise end them while a large checkpoint is read or written on a slow file system.

Every rank loads the checkpoint to the CPU and lets ``load_state_dict`` place it: the model's
weights are copied into its parameters wherever they live, the optimizer moves its state to
each parameter's device and keeps its ``step`` counters on the CPU, as a fresh run does. The
file format and the search for the newest good file live in :mod:`hpc_ddp.checkpoint.format`,
the snapshot and the writer in :mod:`hpc_ddp.checkpoint.snapshot` and
:mod:`hpc_ddp.checkpoint.writer`. A model sharded with FSDP is saved and restored by
:mod:`hpc_ddp.checkpoint.sharded` instead: every rank writes and reads its own shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.checkpoint.format import (
    Best,
    build_payload,
    capture_rng_state,
    find_latest,
    load_checkpoint,
    restore_rng_state,
    unverified_sections,
)
from hpc_ddp.checkpoint.sharded import ShardedCheckpoints
from hpc_ddp.checkpoint.snapshot import SnapshotBuffers
from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.checkpoint.writer import CheckpointWriter, write_checkpoint
from hpc_ddp.config.elastic import Resize, Shape, rescaled_accum
from hpc_ddp.config.load import job_config_to_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError, ConfigError, HpcDdpError
from hpc_ddp.rundir.checkpoint_label import config_digest, shaping_config
from hpc_ddp.rundir.checkpoints import newest_checkpoint, shard_dirs
from hpc_ddp.rundir.layout import Checkpoint, checkpoint_name
from hpc_ddp.runtime.handoff import Handoff
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.sampler import reseed_rng
from hpc_ddp.runtime.sharding import is_sharded

log = logging.getLogger("hpc_ddp")


def _metric_value(value: Any) -> float | None:
    """A logged metric as a number that ranks (None: not a finite number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _stateful(obj: Any) -> Any:
    """``obj``, or the module inside a DDP wrapper (its state without ``module.``)."""
    return unwrap(obj) if isinstance(obj, nn.Module) else obj


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a small picklable value; collective)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclasses.dataclass(frozen=True)
class SavedNote:
    """What rank 0 is told of a durable save (``on_saved``)."""

    step: int
    stall_s: float
    """C: how long the training thread waited in :meth:`Checkpointer.save`."""
    durable_s: float
    """W: from the call of :meth:`Checkpointer.save` until the file was durable."""
    asked_at: float
    """Wall-clock time of the call."""
    note: Any = None
    """What the caller passed along with the save (the auto interval in force)."""


class Checkpointer:
    """One process's side of the run's checkpoints (see the module docstring).

    ``handoff``: how rank 0's results reach the others; by default over the default process
    group's store (made on first use, so the group must exist by then). ``run_id``: the run
    (``RUN_DIR/run_id``) its checkpoints are recorded as; another run's are never restored
    (None: neither recorded nor checked). ``on_saved``: told on rank 0 of each step saved, once
    per step, once the save is durable and off the training thread, with how long training
    waited for the save, how long it took to be durable and when it was asked for
    (:class:`SavedNote`: the ledger's ``checkpoint`` line).
    """

    def __init__(
        self,
        directory: Path,
        config: JobConfig,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        handoff: Handoff | None = None,
        grad_accum: int = 1,
        run_id: str | None = None,
        on_saved: Callable[[SavedNote], None] | None = None,
    ) -> None:
        self.directory = directory
        self.run_id = run_id
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.device = device
        """This rank's device: only its CUDA RNG state is restored there (loads go to the CPU)."""
        self.is_main = rank == 0
        self.grad_accum = grad_accum
        """Micro-batches each rank accumulates per step in this run (saved with each
        checkpoint; a resume at another world size checks it keeps the global batch)."""
        self.resize: Resize | None = None
        """Set by :meth:`restore` when the checkpoint was written at another world size."""
        self.tracked: Tracked | None = None
        self.last: Checkpoint | None = None
        """The checkpoint resumed from or last saved (None: none yet in this attempt); after a
        failed save, the one before it again (what a crash record names must be on disk)."""
        self._durable: Checkpoint | None = None
        """The newest of :attr:`last` known to be on disk (a save in flight is not)."""
        self._writer = CheckpointWriter(directory, config.train.keep_last)
        self._keep_best = config.train.keep_best
        self._metric: tuple[int, float] | None = None
        """The newest ``(step, value)`` of ``keep_best``'s metric logged (rank 0)."""
        self.best: Best | None = None
        """Rank 0: the best checkpoint so far under ``train.keep_best`` (None: none yet)."""
        self._buffers = SnapshotBuffers()
        self._config = job_config_to_dict(config)  # the same in every checkpoint of an attempt
        self._handoff = handoff
        self.sharded: ShardedCheckpoints | None = None
        """Set by :meth:`restore` for an FSDP-sharded model: its checkpoints are sharded."""
        self._on_saved = on_saved
        self._recorded: int | None = None  # the step of the last save told to on_saved

    def on_saved(self, told: Callable[[SavedNote], None]) -> None:
        """Set who is told of each durable save (see the class docstring)."""
        self._on_saved = told

    def settle(self) -> None:
        """Rank 0 waits until its write in flight is durable and what was queued after it
        has run; a failed write's error is left for the next save to raise on every rank.
        A sharded save is not waited for (its writers are every rank's)."""
        if self.is_main and self.sharded is None:
            self._writer.idle()

    def observe(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Note a metrics row logged at ``step`` (rank 0): under ``train.keep_best`` a
        checkpoint is ranked by the newest value of its metric logged at its step or before."""
        if self._keep_best is None:
            return
        value = _metric_value(metrics.get(self._keep_best.metric))
        if value is not None:
            self._metric = (step, value)

    def _rank(self, step: int) -> Best | None:
        """The best checkpoint once one at ``step`` is saved."""
        keep = self._keep_best
        if keep is None or self._metric is None or self._metric[0] > step:
            return self.best
        value = self._metric[1]
        if self.best is None or self.best.beaten_by(value):
            log.info("best %s so far: %.6g, checkpoint of step %d", keep.metric, value, step)
            return Best(keep.metric, keep.mode, step, value)
        return self.best

    def recorded_best(self, payload: Mapping[str, Any]) -> Best | None:
        """The best checkpoint that ``payload`` (a file's, or a shard set's ``common.pt``)
        records under this run's ``train.keep_best`` (None: none, or none is kept)."""
        return None if self._keep_best is None else Best.recorded(payload, self._keep_best)

    def rank_saved(self, step: int) -> Best | None:
        """Rank 0, as a checkpoint of ``step`` is saved: the best one once it is (kept in
        :attr:`best`)."""
        self.best = self._rank(step)
        return self.best

    @property
    def writer(self) -> CheckpointWriter:
        """Rank 0's background writer (its :attr:`~CheckpointWriter.durable_at` times saves)."""
        return self._writer

    @property
    def handoff(self) -> Handoff:
        """How rank 0's word reaches the others, bounded by ``fault.checkpoint_timeout_s``."""
        if self._handoff is None:
            timeout = self.config.fault.checkpoint_timeout_s
            if self.world_size == 1:
                self._handoff = Handoff(None, rank=0, world_size=1, timeout_s=timeout)
            else:
                # Private but stable since torch 1.8: the store the default group was formed on.
                store = dist.distributed_c10d._get_default_store()
                self._handoff = Handoff(
                    store, rank=self.rank, world_size=self.world_size, timeout_s=timeout
                )
        return self._handoff

    def restore(
        self, tracked: Tracked, progress: Progress, *, elastic: bool = False
    ) -> Checkpoint | None:
        """Track ``tracked`` and load the newest good checkpoint into it and ``progress``.

        Returns the checkpoint loaded, None when there is none. Every rank calls it: rank 0
        finds and verifies the file, then every other rank reads and verifies that same file,
        and nothing is applied until all of them hold it (a rank that cannot read it fails
        every rank, with its error).

        A checkpoint written at another world size is restored only with ``elastic`` (the
        caller's loop runs :attr:`grad_accum` micro-batches per step and takes its data from a
        :class:`~hpc_ddp.runtime.sampler.ResumableLoader`), and only if this run's
        accumulation keeps its global batch; then the RNG states are reseeded
        (:func:`reseed_rng`) and :attr:`resize` says so. Otherwise a :class:`ConfigError`,
        the same on every rank.

        At a world size other than the one ``slurm.nodes`` asks for (a ``slurm.min_nodes``
        allocation), where :attr:`grad_accum` is not ``train.grad_accum``, a restore without
        ``elastic`` is refused before anything is read, checkpoint or not.
        """
        if not elastic and self.grad_accum != self.config.train.grad_accum:
            raise ConfigError(
                f"this launch has {self.world_size} ranks of the {self.config.slurm.ntasks} "
                "that slurm.nodes x slurm.tasks_per_node ask for (slurm.min_nodes), so each "
                f"rank must accumulate {self.grad_accum} micro-batches per step, not "
                f"{self.config.train.grad_accum}, but this training loop did not say it "
                "adapts. HINT: run `s.grad_accum` micro-batches per optimizer step, take the "
                "data from `s.loader(...)` and pass `elastic=True` to `s.restore(...)`; or drop "
                "slurm.min_nodes."
            )
        self.tracked = tracked
        if is_sharded(tracked.model):  # every rank reads and writes its own shard
            return self._restore_sharded(tracked, progress, elastic)
        name, error, payload = self._choose() if self.is_main else (None, None, None)
        name, error = self.handoff.share("rank 0's choice of checkpoint", [name, error])
        if error is not None:
            raise CheckpointError(error)
        if name is None:
            return None
        if payload is None:
            try:
                payload = load_checkpoint(self.directory / name, run_id=self.run_id)
            except CheckpointError as exc:
                error = str(exc)
        # Nobody applies anything until every rank holds a verified copy of the same file.
        error = self.handoff.meet(f"every rank's read of {name}", error)
        if error is not None:
            raise CheckpointError(error)
        assert payload is not None
        self.resize = self.check_resize(payload, name, elastic)
        self._apply(payload, name, progress)
        self.best = self.recorded_best(payload)
        self.last = self._durable = Checkpoint(progress.step, name)
        return self.last

    def _choose(self) -> tuple[str | None, str | None, dict[str, Any] | None]:
        """Rank 0: (name, error, payload) of the newest good checkpoint file."""
        try:
            found = find_latest(self.directory, run_id=self.run_id)
        except CheckpointError as exc:
            return None, str(exc), None
        if found is None and (shard_sets := shard_dirs(self.directory)):
            return (
                None,
                (
                    f"{self.directory} holds sharded checkpoints ({shard_sets[0][1].name}/) of an "
                    "FSDP model, and this model is not sharded: starting over would throw the run "
                    "away. HINT: go on with train.strategy: fsdp (s.wrap(model, strategy='fsdp')), "
                    "or export the weights with `hpc-ddp checkpoints RUN_DIR --export FILE`."
                ),
                None,
            )
        return (None, None, None) if found is None else (found[0].name, None, found[1])

    def _restore_sharded(
        self, tracked: Tracked, progress: Progress, elastic: bool
    ) -> Checkpoint | None:
        self.sharded = ShardedCheckpoints(self)
        loaded = self.sharded.restore(tracked, progress, elastic=elastic)
        self.last = None if loaded is None else Checkpoint(progress.step, loaded)
        self._durable = self.last
        return self.last

    def _apply(self, payload: dict[str, Any], name: str, progress: Progress) -> None:
        assert self.tracked is not None
        t = self.tracked
        saved = payload.get("objects") or {}
        missing = sorted(set(t.objects) - set(saved))
        if missing:
            raise ConfigError(
                f"{name} holds no state for {', '.join(map(repr, missing))} (it holds "
                f"{', '.join(map(repr, sorted(saved))) or 'no named objects'}): restoring it "
                "would leave them as they are now, not as they were at its step. HINT: pass "
                "restore() the names the run saved them under; to add an object to a run, "
                "start a new run (another run directory)."
            )
        for left in sorted(set(saved) - set(t.objects)):
            log.warning("%s holds the state of %r, which restore() was not given: not restored",
                        name, left)  # fmt: skip
        unwrap(t.model).load_state_dict(payload["model"])
        for obj, key in (
            (t.optimizer, "optimizer"),
            (t.scheduler, "scheduler"),
            (t.scaler, "scaler"),
        ):
            if obj is not None and payload.get(key) is not None:
                obj.load_state_dict(payload[key])
        for key, obj in t.objects.items():
            _stateful(obj).load_state_dict(saved[key])
        progress.update_from(payload["progress"], payload.get("extra") or {})
        if self.resize is None:
            restore_rng_state(payload["rng"][self.rank], self.device)
        else:
            # One world's per-rank streams cannot map onto another's: a fresh, reproducible
            # stream per (seed, step, rank), the same whichever attempt resumes here.
            reseed_rng(self.config.train.seed, progress.step, self.rank)
            log.warning(
                "elastic resume from %s: %s; the data goes on at sample %d of epoch %d, the "
                "rest of the epoch dealt out over %d rank(s)",
                name,
                self.resize.describe(),
                progress.samples_in_epoch or 0,
                progress.epoch,
                self.world_size,
            )
        self.say_config_changes(payload, name)
        unverified = unverified_sections(payload)
        if unverified:
            log.warning(
                "%s is a format-%d checkpoint: only its weights have a digest; its %s were "
                "restored unverified",
                name,
                payload["version"],
                ", ".join(unverified),
            )
        where = (
            f"batch {progress.batch_in_epoch}"
            if progress.samples_in_epoch is None
            else f"sample {progress.samples_in_epoch}"
        )
        log.info(
            "resumed from %s: step %d, epoch %d, %s of the epoch",
            name,
            progress.step,
            progress.epoch,
            where,
        )

    def say_config_changes(self, payload: dict[str, Any], name: str) -> None:
        """Log which config keys that shape the state differ from those ``name`` was written
        with (an elastic resume's accumulation, a forced resume's overrides): the resume goes
        on, but it is no longer the uninterrupted run. A file without a recorded config
        digest (an older hpc-ddp) is not compared."""
        recorded = payload["meta"].get("config_digest")
        if recorded is None or recorded == config_digest(self._config):
            return
        before = shaping_config(payload.get("config") or {})
        after = shaping_config(self._config)
        changed = [
            f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
            for k in sorted(before.keys() | after.keys())
            if before.get(k) != after.get(k)
        ]
        log.warning(
            "resuming from %s with a changed config (%s): it goes on from that state, but it "
            "is no longer the run that wrote it",
            name,
            "; ".join(changed) or "the config the file recorded is not readable",
        )

    def check_resize(self, payload: dict[str, Any], name: str, elastic: bool) -> Resize | None:
        """None at the checkpoint's world size; else the :class:`Resize`, once it is certain
        that it can carry over (a :class:`ConfigError` with a hint otherwise)."""
        meta, progress = payload["meta"], payload["progress"]
        before = int(meta["world_size"])
        if before == self.world_size:
            return None
        world = self.world_size
        if not elastic:
            raise ConfigError(
                f"{name} was written by {before} ranks and this run has {world}, but this "
                "training loop did not say it can go on at another world size: its global batch "
                "and data order would change. HINT: run `s.grad_accum` micro-batches per "
                "optimizer step, take the data from `s.loader(...)` and pass `elastic=True` to "
                f"`s.restore(...)` (sample-exact, not bit-exact); or go on with {before} ranks."
            )
        if progress.get("samples_in_epoch") is None and progress["batch_in_epoch"]:
            raise ConfigError(
                f"{name} was written by an hpc-ddp that counted the data position in batches of "
                f"{before} ranks, which cannot be dealt out over {world}. HINT: go on with "
                f"{before} ranks until the next checkpoint, then change the world size."
            )
        accum = meta.get("grad_accum")
        if accum is not None:
            needed = rescaled_accum(Shape(before, int(accum)), world)
            if needed != self.grad_accum:
                raise ConfigError(
                    f"{name} was trained with a global batch of "
                    f"{Shape(before, int(accum)).describe()}, which needs accumulation {needed} "
                    f"at {world} ranks, but this run accumulates {self.grad_accum} "
                    f"(train.grad_accum {self.config.train.grad_accum}): the global batch would "
                    "change. HINT: resume with `hpc-ddp resume RUN_DIR slurm.nodes=N --elastic`, "
                    "which sets train.grad_accum; a script of your own that sets its own config "
                    f"sets train.grad_accum so that `s.grad_accum` is {needed}."
                )
        return Resize(before, None if accum is None else int(accum), world, self.grad_accum)

    def save(self, progress: Progress, *, wait: bool = False, note: Any = None) -> Path | None:
        """Save the tracked objects at ``progress.step`` (every rank calls it; rank 0 writes).

        A second call at the same step saves nothing. ``wait=True`` returns once the file is
        durable. Returns the path on rank 0, where ``on_saved`` is told of the step (once),
        with ``note`` as it was at this call.
        """
        began = time.monotonic()
        step = progress.step
        path = self._save(progress, wait)
        if path is not None and self._on_saved is not None and step != self._recorded:
            self._recorded = step  # a second save of a step is told nothing
            stall, now, told = time.monotonic() - began, time.time(), self._on_saved
            # Told by the checkpoint's writer thread once the file is durable, not by the
            # training thread: the ledger line (a directory check and an fsync'd append) held
            # it up for longer than the snapshot itself with a small model. The same thread
            # reads the clock for W: the write job before this one is the save.
            self.then(lambda: told(SavedNote(step, stall, time.monotonic() - began, now, note)))
        return path

    def _save(self, progress: Progress, wait: bool) -> Path | None:
        t = self.tracked
        if t is None:
            raise HpcDdpError(
                "nothing to checkpoint. HINT: call session.restore(model=..., optimizer=...) "
                "first: it names the objects a checkpoint saves."
            )
        if self.sharded is not None:
            if self.last is None or self.last.step != progress.step:
                self.sync_errors()  # the save before: its error, if any, raised here
                path = self.sharded.save(t, progress)
                self.last = Checkpoint(progress.step, path.name)
            if wait:
                self.sync_errors()
            return self.directory / self.last.name if self.is_main else None
        record = Checkpoint(progress.step, checkpoint_name(progress.step))
        if self.last is None or self.last.step != record.step:
            rng = capture_rng_state(self.device)
            gathered: list[Any] | None = [rng] if self.world_size == 1 else None
            if self.world_size > 1:
                gathered = [None] * self.world_size if self.is_main else None
                dist.gather_object(rng, gathered, dst=0)
            # The previous background write, before its snapshot buffers are reused.
            self.sync_errors()
            if self.is_main:
                assert gathered is not None
                self._writer.submit(self._payload(t, gathered, progress))
            self.last = record
        if wait:
            self.sync_errors()
        return self.directory / record.name if self.is_main else None

    def _payload(self, t: Tracked, rng: list[Any], progress: Progress) -> dict[str, Any]:
        return self._build(self._buffers.snapshot(self.live_state()), rng, progress)

    def live_state(self) -> dict[str, Any]:
        """The tracked objects' state dicts as they are now (``model``, ``optimizer``,
        ``scheduler``, ``scaler``, ``objects``), their tensors not copied."""
        t = self.tracked
        assert t is not None, "restore() names what to save"
        return {
            "model": unwrap(t.model).state_dict(),
            "optimizer": None if t.optimizer is None else t.optimizer.state_dict(),
            "scheduler": None if t.scheduler is None else t.scheduler.state_dict(),
            "scaler": None if t.scaler is None else t.scaler.state_dict(),
            "objects": {k: _stateful(obj).state_dict() for k, obj in t.objects.items()},
        }

    def _build(
        self, state: Mapping[str, Any], rng: list[Any], progress: Progress
    ) -> dict[str, Any]:
        payload = build_payload(
            model=state["model"],
            optimizer=state["optimizer"],
            scheduler=state["scheduler"],
            scaler=state["scaler"],
            objects=state["objects"] or None,
            progress=progress,
            rng=rng,
            config=self._config,
            grad_accum=self.grad_accum,
            run_id=self.run_id,
        )
        best = self.rank_saved(progress.step)
        if best is not None:
            # Recorded in every checkpoint, so that pruning spares it (write_checkpoint) and a
            # resume goes on ranking against it.
            payload["meta"]["best"] = dataclasses.asdict(best)
        return payload

    # --- a survivor's save (fault/rescue), on the watchdog's thread ------------------------

    def newest_saved(self) -> Checkpoint | None:
        """The newest checkpoint of this run on disk, once rank 0's write in flight (if this is
        rank 0) has ended (its error is the periodic save's, not the rescue's)."""
        if self.is_main:
            with contextlib.suppress(Exception):
                self._writer.wait()
        return newest_checkpoint(self.directory, run_id=self.run_id)

    def write_now(self, state: Mapping[str, Any], progress: Progress, rng: list[Any]) -> Path:
        """Write ``state`` (as :meth:`live_state` gives it) as the checkpoint of
        ``progress.step`` on the calling thread, durably (temp file, fsync, rename), as any
        checkpoint of the run: its digests, run id and config; older ones pruned."""
        payload = self._build(state, rng, progress)
        return write_checkpoint(self.directory, payload, self.config.train.keep_last)

    def sync_errors(self) -> None:
        """Rank 0 waits for its writer; a failure becomes the same error on every rank (the
        others wait for rank 0's word on the store, not in a collective)."""
        try:
            if self.sharded is not None:
                self.sharded.wait()  # every rank gets the same error from the writer threads
            else:
                error = None
                if self.is_main:
                    try:
                        self._writer.wait()
                    except CheckpointError as exc:
                        error = str(exc)
                error = self.handoff.share("rank 0's checkpoint write", error)
                if error is not None:
                    raise CheckpointError(error)
        except CheckpointError:
            self.last = self._durable  # the failed save is not on disk: never named
            raise
        self._durable = self.last

    def wait(self, *, together: bool = False) -> None:
        """Wait for the write in flight (at close). ``together``: every rank calls this now and
        gets rank 0's write error, if any, as from :meth:`sync_errors`; otherwise (after an
        error, when a peer may be gone) only rank 0 waits, for its own writer."""
        if together:
            self.sync_errors()
        elif self.is_main:
            self._writer.wait()

    def then(self, after: Callable[[], None]) -> None:
        """Run ``after`` on rank 0 once the save in flight is durable, off the training thread
        (see :meth:`CheckpointWriter.then`)."""
        if self.sharded is not None:
            self.sharded.then(after)
        else:
            self._writer.then(after)
