"""The session's checkpoints: restore the newest good one, save the tracked objects (collective).

Every rank calls :meth:`Checkpointer.restore` and :meth:`Checkpointer.save` at the same point:
rank 0 picks, reads and writes the files (the writing on a background thread), the others get
its choice and its errors by broadcast, so every rank resumes from the same step or fails with
the same error. The file format, the writer and the search for the newest good file live in
:mod:`hpc_ddp.runtime.checkpoint`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.config.load import job_config_to_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.layout import checkpoint_name
from hpc_ddp.runtime.checkpoint import (
    CheckpointWriter,
    build_payload,
    capture_rng_state,
    find_latest,
    load_checkpoint,
    restore_rng_state,
    snapshot,
)
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.progress import Progress

log = logging.getLogger("hpc_ddp")


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint of this run: the one resumed from, or the last one saved."""

    step: int
    name: str
    """File name in ``RUN_DIR/checkpoints`` (``step-00000120.pt``), as the ledger records it."""

    @classmethod
    def at(cls, step: int) -> CheckpointRecord:
        """The record of the checkpoint saved at ``step``."""
        return cls(step, checkpoint_name(step))


@dataclass(frozen=True)
class Tracked:
    """The objects a checkpoint saves (named once, by ``session.restore``)."""

    model: nn.Module
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None


@dataclass(frozen=True)
class _Choice:
    """What rank 0 found to resume from, as broadcast to every rank."""

    name: str | None
    error: str | None = None


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a small picklable value; collective)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Checkpointer:
    """One process's side of the run's checkpoints (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        config: JobConfig,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.directory = directory
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.is_main = rank == 0
        self.tracked: Tracked | None = None
        self.last: CheckpointRecord | None = None
        """The checkpoint resumed from or last saved (None: none yet in this attempt)."""
        self._writer = CheckpointWriter(directory, config.train.keep_last)

    def restore(self, tracked: Tracked, progress: Progress) -> CheckpointRecord | None:
        """Track ``tracked`` and load the newest good checkpoint into it and ``progress``.

        Returns the checkpoint loaded, None when there is none (collective).
        """
        self.tracked = tracked
        choice = _Choice(None)
        payload: dict[str, Any] | None = None
        if self.is_main:
            try:
                found = find_latest(self.directory, self.device)
            except CheckpointError as exc:
                choice = _Choice(None, str(exc))
            else:
                if found is not None:
                    choice, payload = _Choice(found[0].name), found[1]
        choice = broadcast_object(choice)
        if choice.error is not None:
            raise CheckpointError(choice.error)
        if choice.name is None:
            return None
        if payload is None:
            payload = load_checkpoint(self.directory / choice.name, self.device)
        self._apply(payload, choice.name, progress)
        self.last = CheckpointRecord.at(progress.step)
        return CheckpointRecord(progress.step, choice.name)

    def _apply(self, payload: dict[str, Any], name: str, progress: Progress) -> None:
        assert self.tracked is not None
        t = self.tracked
        unwrap(t.model).load_state_dict(payload["model"])
        for obj, key in (
            (t.optimizer, "optimizer"),
            (t.scheduler, "scheduler"),
            (t.scaler, "scaler"),
        ):
            if obj is not None and payload.get(key) is not None:
                obj.load_state_dict(payload[key])
        saved_world = int(payload["meta"]["world_size"])
        if saved_world == self.world_size:
            restore_rng_state(payload["rng"][self.rank], self.device)
        else:
            log.warning(
                "%s was written by %d ranks, this run has %d: the RNG states and data order "
                "differ from an uninterrupted run from here on",
                name,
                saved_world,
                self.world_size,
            )
        progress.update_from(payload["progress"], payload.get("extra") or {})
        log.info(
            "resumed from %s: step %d, epoch %d, batch %d of the epoch",
            name,
            progress.step,
            progress.epoch,
            progress.batch_in_epoch,
        )

    def save(self, progress: Progress, *, wait: bool = False) -> Path | None:
        """Save the tracked objects at ``progress.step`` (collective; rank 0 writes).

        A second call at the same step saves nothing. ``wait=True`` returns once the file is
        durable. Returns the path on rank 0.
        """
        t = self.tracked
        assert t is not None, "restore() names what to save"
        record = CheckpointRecord.at(progress.step)
        if self.last is None or self.last.step != record.step:
            rng = capture_rng_state(self.device)
            gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
            dist.gather_object(rng, gathered, dst=0)
            self.sync_errors()  # the previous background write, before starting the next
            if self.is_main:
                assert gathered is not None
                self._writer.submit(self._payload(t, gathered, progress))
            self.last = record
        if wait:
            self.sync_errors()
        return self.directory / record.name if self.is_main else None

    def _payload(self, t: Tracked, rng: list[Any], progress: Progress) -> dict[str, Any]:
        def state(obj: Any) -> Any:
            return None if obj is None else snapshot(obj.state_dict())

        return build_payload(
            model=snapshot(unwrap(t.model).state_dict()),
            optimizer=state(t.optimizer),
            scheduler=state(t.scheduler),
            scaler=state(t.scaler),
            progress=progress,
            rng=rng,
            config=job_config_to_dict(self.config),
        )

    def sync_errors(self) -> None:
        """Rank 0 waits for its writer; a failure becomes the same error on every rank."""
        error = None
        if self.is_main:
            try:
                self._writer.wait()
            except CheckpointError as exc:
                error = str(exc)
        error = broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)

    def wait(self) -> None:
        """Rank 0: wait for the write in flight (at close)."""
        if self.is_main:
            self._writer.wait()
