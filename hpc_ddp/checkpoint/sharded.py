"""Sharded checkpoints: every rank writes its own shard of an FSDP-sharded model, with DCP.

A model sharded with FSDP2 (:mod:`hpc_ddp.runtime.sharding`) is never gathered on one rank to
be saved: each rank writes its shard with ``torch.distributed.checkpoint`` (DCP) into one
directory per save, named like the file checkpoints' stem so that listings sort together::

    RUN_DIR/checkpoints/step-00000120/
        .metadata             DCP's index of every shard (rank 0)
        __0_0.distcp ...      one per rank: its shard of the model, optimizer and named objects
        common.pt             rank 0: progress (the sampler position), extra, scheduler, scaler,
                              the resolved config and meta (world size, grad_accum, run id)
        rank-00000.pt ...     one per rank: that rank's RNG states
        digests.json          written last: {format, version, step, world_size, digest:
                              "xxh3-128", files: {name: {size, xxh3}}}

How a save stays whole or absent. Every rank writes into ``.partial-step-00000120/`` (a name
that never matches ``step-*``); once every rank's files are written and fsync'd and each rank
has hashed its own, rank 0 gathers the digests, writes ``digests.json``, renames the directory
to ``step-00000120`` in one step and fsyncs the parent, and only then updates ``latest`` and
prunes beyond ``train.keep_last``, sparing the best one under ``train.keep_best`` (recorded in
``common.pt``'s ``meta.best`` and carried across resumes, as a file checkpoint's). A save cut
short anywhere leaves a ``.partial-`` directory (removed by the next commit) and never a
``step-N/``. A save that fails on any rank (a full disk, a quota, an I/O error: DCP raises them
wrapped in its ``CheckpointException``, a ``BaseException``) fails on every rank, with the
errno's HINT (:func:`~hpc_ddp.checkpoint.writer.write_failure_hint`); rank 0 removes what it
wrote, and nothing records it as saved.

What counts as a checkpoint (:func:`check_complete`, :func:`verify_files`): ``digests.json``
readable and of this format; ``.metadata``, ``common.pt``, one ``rank-*.pt`` and at least one
``__R_*.distcp`` per rank of the recorded world size listed in it; every listed file present
with its recorded size; and, when verified (resume always verifies), every file hashing to its
recorded digest. Anything less is skipped with a warning, and the newest complete one before
it is loaded. Verification is shared out: each rank hashes every world-size-th file, so a
resume reads each byte once, not once per rank.

A load may come at another world size: DCP reshards the model and optimizer state to the
ranks now present; the data position goes on by global sample index, as for DDP's elastic
resume (:meth:`hpc_ddp.checkpoint.checkpointer.Checkpointer.check_resize`).

Saving is asynchronous, like the file checkpoints' writer: on the training thread each rank
copies its shard into host buffers it keeps from one save to the next (the DTensors rebuilt
around the copies), then a writer thread writes it, hashes its files and hands the digests to
rank 0, which commits. The writer thread talks over a gloo group of its own, so its
collectives never interleave with training's. At most one save is in flight.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import xxhash

from hpc_ddp.checkpoint.format import (
    Best,
    CheckpointInfo,
    CheckpointState,
    best_step,
    capture_rng_state,
    find_latest,
    restore_rng_state,
)
from hpc_ddp.checkpoint.snapshot import SnapshotBuffers, snapshot
from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.checkpoint.writer import (
    no_zip_crc32,
    prune_plan,
    write_failure,
    write_failure_hint,
)
from hpc_ddp.config.elastic import Resize
from hpc_ddp.config.load import job_config_to_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import fsync_dir, write_atomic, write_text_atomic
from hpc_ddp.errors import CheckpointError, ConfigError
from hpc_ddp.rundir.checkpoint_label import config_digest
from hpc_ddp.rundir.checkpoints import (
    SHARDED_COMMON,
    SHARDED_FORMAT,
    SHARDED_METADATA,
    SHARDED_VERSION,
    IncompleteShardSet,
    shard_dirs,
    shard_rank_file,
    shard_set_record,
)
from hpc_ddp.rundir.layout import (
    LATEST_CHECKPOINT,
    SHARDED_RECORD,
    parse_checkpoint_name,
    parse_sharded_checkpoint_name,
    sharded_checkpoint_name,
)
from hpc_ddp.runtime.handoff import Handoff
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.sampler import reseed_rng
from hpc_ddp.runtime.sharding import is_sharded
from hpc_ddp.version import __version__

log = logging.getLogger("hpc_ddp")

DIGESTS = SHARDED_RECORD
PARTIAL_PREFIX = ".partial-"
"""A save in progress: never matches ``step-*``, never loaded."""
_OK = CheckpointState.OK
Failure = tuple[str, int | None]
"""A failed save: what to say, and the errno behind it (for the HINT)."""
_CHUNK = 8 << 20


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes, read in 8 MiB pieces."""
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_complete(path: Path) -> dict[str, Any]:
    """The digest record of ``path`` once every file a checkpoint needs is there with its
    recorded size (no hashing: :func:`~hpc_ddp.rundir.checkpoints.shard_set_record`, the check
    ``status`` and ``resume`` make too); else :class:`CheckpointError` saying what is missing."""
    try:
        return shard_set_record(path)
    except IncompleteShardSet as exc:
        raise CheckpointError(f"{path.name}: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"{path.name}: unreadable ({exc.strerror or exc})") from None


def verify_files(path: Path, record: Mapping[str, Any], *, rank: int = 0, world: int = 1) -> None:
    """Hash every ``world``-th listed file from ``rank`` on and compare it with the record
    (:class:`CheckpointError` naming the first that differs)."""
    for i, (name, entry) in enumerate(sorted(record["files"].items())):
        if i % world == rank and file_digest(path / name) != entry["xxh3"]:
            raise CheckpointError(f"{path.name}: {name} changed on disk (its digest differs)")


def list_sharded(
    directory: Path, *, verify: bool = False, run_id: str | None = None
) -> list[CheckpointInfo]:
    """Every sharded checkpoint (``step-N/``) in a run directory (or its ``checkpoints/``),
    oldest first, as ``hpc-ddp checkpoints`` lists files: complete ones ``ok``, others
    ``damaged`` with the reason, another run's ``stranger``. ``verify=True`` hashes every file
    (all of them, on this one process). Never raises for a bad directory."""
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    out = []
    for step, path in reversed(shard_dirs(directory)):
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        try:
            record = check_complete(path)
            if verify:
                verify_files(path, record)
            common = _load_pt(path / SHARDED_COMMON)
        except Exception as exc:  # a torn common.pt too: listed, never fatal
            reason = str(exc).removeprefix(f"{path.name}: ")
            state = CheckpointState.DAMAGED
            out.append(CheckpointInfo(path, step, None, None, size, None, reason, state))
            continue
        meta = common["meta"]
        written_by = meta.get("run_id")
        stranger = run_id is not None and written_by not in (None, run_id)
        out.append(
            CheckpointInfo(
                path,
                step,
                int(common["progress"]["epoch"]),
                float(meta["time"]),
                size,
                None,  # no one digest of the whole weights: each shard file has its own
                f"written by run {written_by}, not this run ({run_id})" if stranger else None,
                CheckpointState.STRANGER if stranger else CheckpointState.OK,
                version=SHARDED_VERSION,
                run_id=written_by,
            )
        )
    return out


def export_model(directory: Path, out: Path, *, run_id: str | None = None) -> CheckpointInfo:
    """Write the whole model of the newest verified checkpoint of run ``run_id`` (None: any
    run's) in ``directory`` (a run directory or its ``checkpoints/``) to ``out`` as one
    ``torch.save`` state dict, for inference: ``model.load_state_dict(torch.load(out))``.

    An FSDP run's shard set: one process reads every shard (the whole model must fit its
    memory); a DDP run's ``step-N.pt`` file: its weights, every digest checked first. The
    optimizer state is left out. ``out`` is written atomically (a temp file renamed over it):
    the caller decides whether it may be replaced. Returns the checkpoint exported;
    :class:`CheckpointError` when there is none."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sets = [i for i in list_sharded(directory, verify=True, run_id=run_id) if i.state is _OK]
    checkpoints = directory / "checkpoints" if (directory / "checkpoints").is_dir() else directory
    unloadable = None
    try:
        found = find_latest(checkpoints, run_id=run_id)
    except CheckpointError as exc:  # files there, none loads: a shard set may still do
        found, unloadable = None, exc
    if found is not None and (not sets or sets[-1].step < _file_step(found[0])):
        path, payload = found
        _save_pt(payload["model"], out)
        size = path.stat().st_size
        return CheckpointInfo(path, _file_step(path), None, None, size, None, None, _OK)
    if not sets:
        if unloadable is not None:
            raise unloadable
        raise CheckpointError(
            f"{directory} holds no complete checkpoint. HINT: `hpc-ddp checkpoints RUN_DIR "
            "--verify` lists what is there and why each one is not usable."
        )
    info = sets[-1]
    state: dict[str, Any] = {}
    # Private but what torch's own dcp_to_torch_save runs: a load planned from .metadata alone,
    # on one process, of the "model" entries only.
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(info.path),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),  # type: ignore[no-untyped-call]
        no_dist=True,
    )
    _save_pt(state["model"], out)
    return info


def _file_step(path: Path) -> int:
    step = parse_checkpoint_name(path.name)
    assert step is not None  # find_latest lists step-N.pt names only
    return step


def _save_pt(obj: Any, path: Path) -> None:
    write_atomic(path, lambda f: torch.save(obj, f))


def _load_pt(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


class Owner(Protocol):
    """What a :class:`ShardedCheckpoints` needs of its owner, the
    :class:`~hpc_ddp.checkpoint.checkpointer.Checkpointer` that hands over to it: the run's
    place and settings, rank 0's word to the others, and what file and sharded checkpoints
    share (the resume's checks, the ``train.keep_best`` ranking). Declared here so that this
    module never imports the one that uses it."""

    directory: Path
    config: JobConfig
    rank: int
    world_size: int
    device: torch.device
    grad_accum: int
    run_id: str | None
    resize: Resize | None
    best: Best | None

    @property
    def handoff(self) -> Handoff: ...

    def rank_saved(self, step: int) -> Best | None: ...

    def recorded_best(self, payload: Mapping[str, Any]) -> Best | None: ...

    def check_resize(self, payload: dict[str, Any], name: str, elastic: bool) -> Resize | None: ...

    def say_config_changes(self, payload: dict[str, Any], name: str) -> None: ...


class ShardedCheckpoints:
    """The sharded side of a :class:`~hpc_ddp.checkpoint.checkpointer.Checkpointer` (which
    hands over to it when :meth:`restore` is given a sharded model): the same collective
    ``restore`` and ``save``, every rank reading and writing its own shard."""

    def __init__(self, ckpt: Owner) -> None:
        self.ckpt = ckpt
        self.directory = ckpt.directory
        self.rank = ckpt.rank
        self.world_size = ckpt.world_size
        self._config = job_config_to_dict(ckpt.config)
        self._buffers = SnapshotBuffers()
        self._group: Any = None
        self._thread: threading.Thread | None = None
        self._error: Failure | None = None
        self._then: list[Callable[[], None]] = []
        """Called once the save in flight is durable (under :attr:`_lock`, as
        :attr:`_writing`: whether the writer thread has yet to take them)."""
        self._lock = threading.Lock()
        self._writing = False
        self._durable: Path | None = None

    # --- the state ---------------------------------------------------------------------

    def _state(self, t: Tracked) -> dict[str, Any]:
        """What DCP saves and loads in place: the sharded model, its optimizer, the objects."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        optimizers = [] if t.optimizer is None else [t.optimizer]
        model_state, optim_state = get_state_dict(t.model, optimizers)
        state: dict[str, Any] = {"model": model_state}
        if t.optimizer is not None:
            state["optimizer"] = optim_state
        objects = {
            name: get_model_state_dict(obj) if is_sharded(obj) else obj.state_dict()
            for name, obj in t.objects.items()
        }
        if objects:
            state["objects"] = objects
        return state

    def _apply(self, t: Tracked, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        optimizers = [] if t.optimizer is None else [t.optimizer]
        set_state_dict(
            t.model,
            optimizers,
            model_state_dict=state["model"],
            optim_state_dict=state.get("optimizer", {}),
        )
        for name, obj in t.objects.items():
            if is_sharded(obj):
                set_model_state_dict(obj, state["objects"][name])
            else:
                obj.load_state_dict(state["objects"][name])

    def _common(self, t: Tracked, progress: Progress, grad_accum: int) -> dict[str, Any]:
        common: dict[str, Any] = {
            "format": SHARDED_FORMAT,
            "version": SHARDED_VERSION,
            "progress": progress.to_dict(),
            "extra": dict(progress.extra),
            "scheduler": None if t.scheduler is None else t.scheduler.state_dict(),
            "scaler": None if t.scaler is None else t.scaler.state_dict(),
            "objects": sorted(t.objects),
            "config": self._config,
            "meta": {
                "time": time.time(),
                "world_size": self.world_size,
                "grad_accum": grad_accum,
                "run_id": self.ckpt.run_id,
                "config_digest": config_digest(self._config),
                "torch_version": str(torch.__version__),
                "hpc_ddp_version": __version__,
            },
        }
        best = self.ckpt.rank_saved(progress.step)
        if best is not None:
            # As a file's meta.best: pruning spares that shard set, a resume ranks against it.
            common["meta"]["best"] = dataclasses.asdict(best)
        return common

    # --- saving ------------------------------------------------------------------------

    def save(self, t: Tracked, progress: Progress, *, wait: bool = False) -> Path:
        """Save this rank's shard of step ``progress.step`` (collective, every rank).

        The training thread waits for the save before (its buffers are reused), then copies
        this rank's state into kept host buffers and returns; a writer thread writes it, and
        rank 0 commits the directory once every rank's files are written. ``wait=True``
        returns only once it is committed and durable; a failure is raised by the next
        :meth:`wait` (the next save, a stop, the end), the same on every rank.
        """
        self.wait()
        if self._group is None:
            # The writer thread's own group: its collectives never meet training's on the
            # default group (gloo runs one at a time per group, in call order).
            timeout = timedelta(seconds=self.ckpt.config.fault.checkpoint_timeout_s)
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        step = progress.step
        final = self.directory / sharded_checkpoint_name(step)
        state = self._stage(self._state(t))
        rng = snapshot(capture_rng_state(self.ckpt.device), "rng")
        common = None
        if self.rank == 0:
            common = snapshot(self._common(t, progress, self.ckpt.grad_accum), "common")
        self._writing = True  # no thread runs now: no lock needed
        self._thread = threading.Thread(
            target=self._write, args=(final, state, rng, common), name="hpc-ddp-shards"
        )
        # A daemon: an interpreter leaving after an error does not wait for it; a save cut
        # short leaves a .partial- directory, never a step directory.
        self._thread.daemon = True
        self._thread.start()
        if wait:
            self.wait()
        return final

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` in this rank's kept host buffers, each DTensor rebuilt around
        the copy of its local shard (no collective: the global shape and placements are
        known)."""
        from torch.distributed.tensor import DTensor

        def local(obj: Any) -> Any:
            if isinstance(obj, DTensor):
                return obj.to_local()
            if isinstance(obj, Mapping):
                return {k: local(v) for k, v in obj.items()}
            if isinstance(obj, list | tuple):
                return type(obj)(local(v) for v in obj)
            return obj

        def rebuild(orig: Any, copy: Any) -> Any:
            if isinstance(orig, DTensor):
                return DTensor.from_local(
                    copy,
                    orig.device_mesh,
                    orig.placements,
                    run_check=False,
                    shape=orig.shape,
                    stride=orig.stride(),
                )
            if isinstance(orig, Mapping):
                return {k: rebuild(v, copy[k]) for k, v in orig.items()}
            if isinstance(orig, list | tuple):
                return type(orig)(rebuild(o, c) for o, c in zip(orig, copy, strict=True))
            return copy

        copied: dict[str, Any] = rebuild(state, self._buffers.snapshot(local(state), "shard"))
        return copied

    def _write(self, final: Path, state: Any, rng: Any, common: Any) -> None:
        """The writer thread: this rank's files, the digests to rank 0, rank 0's commit; every
        rank ends with the same error (or None) in :attr:`_error`, and the callbacks of
        :meth:`then` are run (after a commit) or dropped (after a failure), whatever raised."""
        failure: Failure | None = ("the writer thread ended unexpectedly", None)
        try:
            failure = self._write_and_commit(final, state, rng, common)
        except BaseException as exc:  # DCP's CheckpointException is one
            failure = write_failure(exc)
        finally:
            if failure is not None:
                failure = (f"saving {final.name}: {failure[0]}", failure[1])
            self._error = failure
            with self._lock:
                if failure is None:
                    self._durable = final
                callbacks, self._then, self._writing = self._then, [], False
        for after in callbacks if failure is None else []:
            _bookkeeping(after, final)

    def _write_and_commit(self, final: Path, state: Any, rng: Any, common: Any) -> Failure | None:
        group = self._group
        partial = self.directory / f"{PARTIAL_PREFIX}{final.name}"
        digests: dict[str, Any] = {}

        def write() -> None:
            digests.update(self._write_files(partial, state, rng, common))

        error = _attempt_write(lambda: _fresh_dir(partial)) if self.rank == 0 else None
        try:
            # Rank 0's word that the directory is empty, or why it is not, before anyone
            # writes: ranks that wrote without rank 0 would wait in DCP's collectives for it.
            box = [None if error is None else (f"rank 0: {error[0]}", error[1])]
            dist.broadcast_object_list(box, src=0, group=group)
            error = box[0]
            if error is None and (error := _attempt_write(write)) is not None:
                error = (f"rank {self.rank}: {error[0]}", error[1])
            gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object((digests, error), gathered, dst=0, group=group)
            if gathered is not None:
                # The first rank's error that names an errno (a peer's may only say the
                # collective failed), else the first rank's.
                errors = sorted(
                    (e for _, e in gathered if e is not None), key=lambda e: e[1] is None
                )
                error = errors[0] if errors else None
                if error is None:
                    files = [d for d, _ in gathered]
                    error = _attempt_write(
                        lambda: self._commit(partial, final, files, best_step(common))
                    )
                if error is not None:
                    # Every rank is done writing: what the failed save wrote goes, so that a
                    # full disk has room for the run to record its end.
                    shutil.rmtree(partial, ignore_errors=True)
            box = [error]
            dist.broadcast_object_list(box, src=0, group=group)
            error = box[0]
        except Exception as exc:  # a peer gone: the group's timeout ends the wait
            error = (f"{type(exc).__name__}: {_first_line(exc)}", None)
        return error

    def _write_files(
        self, partial: Path, state: Any, rng: Any, common: Any
    ) -> dict[str, dict[str, Any]]:
        """This rank's files into ``partial`` (its DCP shard, its RNG states; rank 0 also
        ``common.pt`` and DCP's ``.metadata``), and their sizes and digests."""
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        writer = _noting_writer(FileSystemWriter, partial)
        with no_zip_crc32():
            try:
                dcp_save(state, storage_writer=writer, process_group=self._group)
            except BaseException as exc:  # DCP's CheckpointException is one
                # This rank's own error says which errno; what DCP raises holds every rank's
                # error pickled, without what each one wrapped (the OSError).
                raise _RankFailure(write_failure(writer.failure or exc)) from None
            _save_pt(rng, partial / shard_rank_file(self.rank))
            if common is not None:
                _save_pt(common, partial / SHARDED_COMMON)
        mine = [shard_rank_file(self.rank)]
        mine += [p.name for p in partial.glob(f"__{self.rank}_*.distcp")]
        if common is not None:
            mine += [SHARDED_METADATA, SHARDED_COMMON]
        return {
            name: {"size": (partial / name).stat().st_size, "xxh3": file_digest(partial / name)}
            for name in mine
        }

    def then(self, after: Callable[[], None]) -> None:
        """Run ``after`` once the save in flight is committed (on the writer thread; at once
        when none is in flight); skipped when it failed (see ``CheckpointWriter.then``)."""
        with self._lock:
            if self._writing:
                self._then.append(after)
                return
        if self._error is None:
            _bookkeeping(after, self._durable)

    def wait(self, *, together: bool = True) -> None:
        """Wait for the save in flight and raise its error (the same on every rank).
        ``together=False`` (after an error, a peer may be gone): return at once."""
        thread = self._thread
        if thread is None or not together:
            return
        thread.join()
        self._thread = None
        if self._error is not None:
            (error, code), self._error = self._error, None
            raise CheckpointError(f"{error}. {write_failure_hint(self.directory, code)}")

    def _commit(
        self, partial: Path, final: Path, gathered: list[dict[str, Any]], best: int | None
    ) -> None:
        """Rank 0: the digest record last, then the directory renamed in one step; then the
        pruning, which spares the ``best`` step (``meta.best`` of this save's ``common.pt``)."""
        step = parse_sharded_checkpoint_name(final.name)
        assert step is not None
        files: dict[str, Any] = {}
        for part in gathered:
            files.update(part)
        record = {
            "format": SHARDED_FORMAT,
            "version": SHARDED_VERSION,
            "step": step,
            "world_size": self.world_size,
            "digest": "xxh3-128",
            "files": files,
        }
        write_text_atomic(partial / DIGESTS, json.dumps(record, indent=1, sort_keys=True))
        fsync_dir(partial)
        if final.exists():  # this step saved before (a resume that saved it again): replaced
            old = final.with_name(f"{PARTIAL_PREFIX}old-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(partial, final)
        fsync_dir(self.directory)
        write_text_atomic(self.directory / LATEST_CHECKPOINT, final.name + "\n")
        self._prune(step, best)

    def _prune(self, written: int, best: int | None) -> None:
        """Shard sets beyond ``train.keep_last`` go, all but the ``best`` one
        (``train.keep_best``), as files do (:func:`prune_plan`)."""
        keep = self.ckpt.config.train.keep_last
        listed = {s: p for s, p in shard_dirs(self.directory) if s <= written}
        for step in prune_plan(list(listed), keep, best):
            shutil.rmtree(listed[step], ignore_errors=True)
        # Saves cut short (one save is in flight at a time, and this one is committed).
        for stale in self.directory.glob(f"{PARTIAL_PREFIX}step-*"):
            shutil.rmtree(stale, ignore_errors=True)

    # --- restoring -----------------------------------------------------------------------

    def restore(self, t: Tracked, progress: Progress, *, elastic: bool) -> str | None:
        """Load the newest complete, verified sharded checkpoint into ``t`` and ``progress``
        (collective); its name, or None when there is none. Shard sets there but none of them
        usable (damaged, another run's): :class:`CheckpointError`, the same on every rank, as
        for files (:func:`~hpc_ddp.checkpoint.format.find_latest`): starting over would throw
        the run away, and its pruning would delete sets that still hold intact shards."""
        handoff = self.ckpt.handoff
        candidates: list[str] = []
        skipped: list[list[Any]] = []
        error = None
        if self.rank == 0:
            candidates, skipped, error = self._candidates()
        candidates, skipped, error = handoff.share(
            "rank 0's sharded checkpoints", [candidates, skipped, error]
        )
        if error is not None:
            raise ConfigError(error)
        for name in candidates:
            path = self.directory / name
            why = _attempt(functools.partial(self._verify_share, path))
            why = handoff.meet(f"every rank's check of {name}", why)
            if why is None:
                self._load(path, t, progress, elastic)
                return name
            skipped.append([parse_sharded_checkpoint_name(name), why])
            if self.rank == 0:
                log.warning("skipping checkpoint %s (%s); trying the one before it", path, why)
        if skipped:
            newest = max(skipped, key=lambda s: int(s[0]))[1]
            raise CheckpointError(
                f"{self.directory}: none of {len(skipped)} sharded checkpoints loads (newest: "
                f"{newest}). HINT: move the checkpoints directory aside to start the run "
                "from scratch."
            )
        return None

    def _candidates(self) -> tuple[list[str], list[list[Any]], str | None]:
        """Rank 0: the complete sharded checkpoints of this run, newest first; the
        ``[step, why]`` of the others (logged and left out); or an error when only file
        checkpoints are there."""
        names = []
        skipped: list[list[Any]] = []
        for step, path in shard_dirs(self.directory):
            try:
                check_complete(path)
                common = _load_pt(path / SHARDED_COMMON)
            except Exception as exc:  # a torn common.pt too: never a crash, a skip
                log.warning("skipping checkpoint %s (damaged: %s)", path, _first_line(exc))
                skipped.append([step, _first_line(exc)])
                continue
            run_id = common["meta"].get("run_id")
            if self.ckpt.run_id is not None and run_id not in (None, self.ckpt.run_id):
                log.warning("skipping checkpoint %s (written by run %s)", path, run_id)
                why = f"{path.name}: written by run {run_id}, not by this run ({self.ckpt.run_id})"
                skipped.append([step, why])
                continue
            names.append(path.name)
        files = [p for p in self.directory.glob("step-*.pt") if parse_checkpoint_name(p.name)]
        if not names and not skipped and files:
            return (
                [],
                [],
                (
                    f"{self.directory} holds file checkpoints ({sorted(files)[-1].name}) of an "
                    "unsharded model, and this model is sharded (FSDP). HINT: go on with "
                    "train.strategy: ddp (s.wrap(model, strategy='ddp')), or start a new run."
                ),
            )
        return names, skipped, None

    def _verify_share(self, path: Path) -> None:
        record = check_complete(path)
        verify_files(path, record, rank=self.rank, world=self.world_size)

    def _load(self, path: Path, t: Tracked, progress: Progress, elastic: bool) -> None:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        common = _load_pt(path / SHARDED_COMMON)
        missing = sorted(set(t.objects) - set(common.get("objects") or []))
        if missing:
            raise ConfigError(
                f"{path.name} holds no state for {', '.join(map(repr, missing))}. HINT: pass "
                "restore() the names the run saved them under."
            )
        self.ckpt.resize = self.ckpt.check_resize(common, path.name, elastic)
        state = self._state(t)
        dcp_load(state, storage_reader=FileSystemReader(path))
        self._apply(t, state)
        for obj, key in ((t.scheduler, "scheduler"), (t.scaler, "scaler")):
            if obj is not None and common.get(key) is not None:
                obj.load_state_dict(common[key])
        progress.update_from(common["progress"], common.get("extra") or {})
        self.ckpt.best = self.ckpt.recorded_best(common)
        if self.ckpt.resize is None:
            restore_rng_state(_load_pt(path / shard_rank_file(self.rank)), self.ckpt.device)
        else:
            reseed_rng(self.ckpt.config.train.seed, progress.step, self.rank)
            log.warning(
                "elastic resume from %s: %s; the model and optimizer resharded by DCP, the "
                "data going on at sample %d of epoch %d over %d rank(s)",
                path.name,
                self.ckpt.resize.describe(),
                progress.samples_in_epoch or 0,
                progress.epoch,
                self.world_size,
            )
        self.ckpt.say_config_changes(common, path.name)
        log.info("resumed from sharded %s: step %d, epoch %d", path.name, progress.step,
                 progress.epoch)  # fmt: skip


def _fresh_dir(path: Path) -> None:
    """An empty ``path``: what a killed save left there is removed first."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _attempt(work: Callable[[], object]) -> str | None:
    """None when ``work`` succeeds, else its error in one line (shared with the other ranks).
    A ``BaseException`` too: DCP's ``CheckpointException`` is one (only an interrupt goes
    on)."""
    failure = _attempt_write(work)
    return None if failure is None else failure[0]


def _attempt_write(work: Callable[[], object]) -> Failure | None:
    """None when ``work`` succeeds, else its failure (:func:`write_failure`): what to say and
    the errno behind it, the same on every rank once shared."""
    try:
        work()
    except KeyboardInterrupt:
        raise
    except _RankFailure as exc:
        return exc.failure
    except BaseException as exc:  # DCP's CheckpointException is one
        return write_failure(exc)
    return None


class _RankFailure(Exception):
    """A failure already described on the rank where it happened."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure[0])
        self.failure = failure


def _noting_writer(base: Any, path: Path) -> Any:
    """DCP's ``FileSystemWriter`` at ``path`` (``base``, imported with torch's DCP), noting in
    ``failure`` the error this rank's own writes raised, with what it wraps: DCP gathers every
    rank's error pickled, which drops the ``OSError`` a ``RuntimeError`` of ``torch.save``'s zip
    writer wraps (a full disk)."""

    class NotingWriter(base):  # type: ignore[misc]
        failure: BaseException | None = None

        def write_data(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().write_data(*args, **kwargs)
            except BaseException as exc:
                self.failure = exc
                raise

        def finish(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().finish(*args, **kwargs)
            except BaseException as exc:
                self.failure = exc
                raise

    return NotingWriter(path)


def _bookkeeping(after: Callable[[], None], path: Path | None) -> None:
    try:
        after()
    except Exception:
        log.warning("after checkpoint %s: bookkeeping failed", path, exc_info=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
