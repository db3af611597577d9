"""A survivor's save: the state of the last step every rank completed, written by one surviving
rank when a peer dies, hangs or loses its node, so that the restart trains no step twice.

In data-parallel training every rank holds the same weights and optimizer state after each
step. What a rank holds alone is small, and each part is made recoverable without it:

* its RNG streams are seeded from ``(seed, step, rank)`` at every step's start, in every run
  (:mod:`hpc_ddp.runtime.rng`), so the survivor records what each rank's streams are as the
  next step begins (:func:`~hpc_ddp.runtime.rng.step_rng_state`);
* its data position is the same on every rank (the step, the epoch and the samples consumed);
* buffers (BatchNorm's running stats) and the objects given to ``s.restore`` are saved from
  rank 0, so a save without rank 0 is only complete when the model has no buffer a step
  changes and nothing was given to ``s.restore`` beyond the model, optimizer, scheduler and
  scaler. Otherwise the restart falls back to the newest periodic checkpoint, and the ledger
  says why.

**Never a state between two steps.** The survivor may be caught anywhere: blocked in the
gradient all-reduce of the next step, inside ``optimizer.step()``, or between it and the end of
the step. The training thread publishes each completed step (:meth:`Rescue.completed`: its data
position, a copy of the buffers a step changes, and a fingerprint of the optimizer's, the
scheduler's and the scaler's progress), and hooks on the optimizer count the updates begun and
finished. The rescue runs on the watchdog's thread (the training thread may be blocked in a
collective until the process-group timeout). It freezes the training thread at its next update
or step boundary, then writes the published step if nothing has changed since (no update begun
after it), or waits for the next boundary if an update already began, or falls back. On a GPU
the next step's kernels may be queued behind a collective that never ends (the process ends
without aborting the communicator, so they never run), so nothing the rescue does may wait for
the device: it waits, at most :data:`GPU_STEP_WAIT_S`, on the host for the event recorded as
the published step ended, then copies on a side stream made when the launch started. Both
measured on an H200 (torch 2.11), with a spin kernel queued as the hung collective: a process's
first ``torch.cuda.Stream()`` waited for it (4 s behind a 4 s spin), and so did a copy to
pageable host memory issued on a side stream waiting on an event not yet reached (13 s behind
1 + 12 s); a copy on a stream made earlier, after the event, took 0.4 ms. A published step whose
event is not reached in time (the host ran a step ahead of a GPU now stuck) is not written: the
newest periodic checkpoint stands, and the ledger says why.

An FSDP model's shard of a lost rank exists nowhere else: a sharded run is never rescued (its
restart resumes from the newest committed shard set).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.rundir.layout import Checkpoint
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.rng import step_rng_state

__all__ = ["CompletedStep", "Rescue", "RescueOutcome", "RescueWriter", "writer_rank"]

log = logging.getLogger("hpc_ddp.rescue")

NEXT_BOUNDARY_WAIT_S = 2.0
"""How long the rescue waits for a training thread that is past an optimizer update to reach
the end of that step (the scheduler's step, the scaler's update: local work, milliseconds)."""
GPU_STEP_WAIT_S = 2.0
"""How long a GPU rank's rescue waits on the host for the published step's work to end on the
device before it gives the step up (a fault is found seconds after the step ended, so its
work has long ended unless it never will)."""


@dataclass(frozen=True)
class CompletedStep:
    """What the training thread published at the end of step ``step``."""

    step: int
    updates: int
    """Optimizer updates begun by then (the hooks' count)."""
    fingerprint: tuple[Any, ...]
    """The scheduler's and the scaler's progress then: a change after it is a newer state."""
    progress: dict[str, Any]
    extra: dict[str, Any]
    event: Any = None
    """A CUDA event recorded after the step's work (None on the CPU)."""


@dataclass(frozen=True)
class RescueOutcome:
    """What a rescue did: the checkpoint of the last step every rank completed, and why it
    wrote none (None: it wrote ``checkpoint``)."""

    step: int | None
    """The last step every rank completed (None: none known)."""
    checkpoint: str | None
    """The checkpoint that holds it (written now, or saved already); None: none does."""
    why: str | None


class RescueWriter(Protocol):
    """What the rescue needs of the session's checkpointer."""

    def newest_saved(self) -> Checkpoint | None:
        """The newest checkpoint of the run on disk (a periodic save in flight is waited for
        first)."""
        ...

    def live_state(self) -> dict[str, Any]:
        """The tracked objects' state dicts as they are now (``model``, ``optimizer``,
        ``scheduler``, ``scaler``, ``objects``), tensors not copied."""
        ...

    def write_now(self, state: Mapping[str, Any], progress: Progress, rng: list[Any]) -> Path:
        """Write ``state`` (as :meth:`live_state` gives it) as the checkpoint of
        ``progress.step``, durably, on the calling thread."""
        ...


def writer_rank(world: int, blamed: tuple[int, ...]) -> int | None:
    """The one survivor that writes: the lowest rank not blamed (None: no survivor)."""
    return next((r for r in range(world) if r not in blamed), None)


class Rescue:
    """This rank's side of the survivor's save (see the module docstring)."""

    def __init__(
        self,
        tracked: Tracked,
        writer: RescueWriter,
        *,
        seed: int,
        rank: int,
        world: int,
        device: torch.device,
        model: torch.nn.Module,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracked, self.writer = tracked, writer
        self.seed, self.rank, self.world, self.device = seed, rank, world, device
        # The rescue's side stream is made here, on the training thread as the launch starts:
        # a process's first torch.cuda.Stream() waits for the kernels queued on its device
        # (seen on an H200, torch 2.11: 13 s, behind a 12 s stand-in for a hung collective),
        # and in a rescue those may never end.
        self._side: Any = (
            torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._frozen = False
        self._updates = 0
        self._finished = 0
        self._last: CompletedStep | None = None
        self._parked = threading.Event()
        saved = set(model.state_dict())
        self._buffers = [(n, b) for n, b in model.named_buffers() if n in saved]
        self._sources = [b for _, b in self._buffers]
        # Only rank 0's buffers are saved, so only rank 0 keeps a copy as each step ends (a
        # few tens of microseconds for a ResNet's BatchNorms).
        self._kept: list[torch.Tensor] = (
            [b.detach().clone() for b in self._sources] if rank == 0 else []
        )
        # Whether a step changes a buffer is read from its values, not its version counter,
        # which batch_norm's in-place update of the running stats leaves as it was.
        self._initial = [b.detach().to("cpu", copy=True) for _, b in self._buffers]
        self._handles: list[Any] = []
        if tracked.optimizer is not None:
            self._handles = [
                tracked.optimizer.register_step_pre_hook(self._update_begins),
                tracked.optimizer.register_step_post_hook(self._update_ends),
            ]

    def close(self) -> None:
        """Remove the optimizer hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # --- the training thread --------------------------------------------------------------

    def _update_begins(self, *_: Any) -> None:
        with self._lock:
            frozen = self._frozen
            if not frozen:
                self._updates += 1
        if frozen:
            self._park()

    def _update_ends(self, *_: Any) -> None:
        with self._lock:
            self._finished += 1

    def completed(self, progress: Progress) -> None:
        """Step ``progress.step`` is complete on this rank: publish it (every step, on the
        training thread: a few microseconds, no host read of a GPU value)."""
        with self._lock:
            if self._kept:
                torch._foreach_copy_(self._kept, self._sources)
            event = None
            if self.device.type == "cuda":
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
            self._last = CompletedStep(
                step=progress.step,
                updates=self._updates,
                fingerprint=self._fingerprint(),
                progress=progress.to_dict(),
                extra=dict(progress.extra),
                event=event,
            )
            frozen = self._frozen
        if frozen:
            self._park()

    def _fingerprint(self) -> tuple[Any, ...]:
        t = self.tracked
        scheduler = getattr(t.scheduler, "last_epoch", None)
        scaler = None
        if t.scaler is not None:
            scale = getattr(t.scaler, "_scale", None)
            tracker = getattr(t.scaler, "_growth_tracker", None)
            scaler = tuple(
                x._version if isinstance(x, torch.Tensor) else x for x in (scale, tracker)
            )
        return (scheduler, scaler)

    def _park(self) -> None:
        """The rescue owns the state now: this thread waits for the process to end."""
        self._parked.set()
        threading.Event().wait()

    # --- the watchdog's thread ------------------------------------------------------------

    def why_not(self, blamed: tuple[int, ...]) -> str | None:
        """Why this launch's survivors cannot write a complete checkpoint without ``blamed``
        (None: they can)."""
        if self.world < 2:
            return "a world of one rank has no survivor"
        writer = writer_rank(self.world, blamed)
        if writer is None:
            return "every rank is blamed: no survivor"
        if 0 not in blamed:
            return None
        lost = []
        last = self._last
        # This rank's own buffers: a buffer a step changes differs from its start by now.
        behind = None if last is None else self._gpu_behind(last)
        if behind is not None:
            return behind
        now = _to_host(self._sources, None if last is None else last.event, self._side)
        changed = [
            name
            for (name, _), value, first in zip(self._buffers, now, self._initial, strict=True)
            if not torch.equal(value, first)
        ]
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            lost.append(f"the buffers a step changes ({', '.join(changed[:3])}{more})")
        if self.tracked.objects:
            lost.append("the objects given to s.restore (" + ", ".join(self.tracked.objects) + ")")
        if lost:
            return f"rank 0 was lost, and with it {' and '.join(lost)}, which only rank 0 saves"
        return None

    def save(
        self, blamed: tuple[int, ...], *, wait_s: float = NEXT_BOUNDARY_WAIT_S
    ) -> RescueOutcome:
        """On the watchdog's thread, once a fault is known: freeze the training thread and, if
        this rank is the one writer, write the last completed step. Never raises."""
        if writer_rank(self.world, blamed) != self.rank:
            with self._lock:
                self._frozen = True
            return RescueOutcome(None, None, None)
        why = self.why_not(blamed)
        if why is not None:
            with self._lock:
                self._frozen = True
                last = self._last
            # The step still counts: the goodput account's steps trained again come from it,
            # not from a beat that may be half a second behind.
            return RescueOutcome(None if last is None else last.step, None, why)
        deadline = self._clock() + wait_s
        with self._lock:
            self._frozen = True
        while True:
            self._lock.acquire()
            try:
                last = self._last
                if last is None:
                    return RescueOutcome(None, None, "no step was completed in this launch")
                moving = self._updates != self._finished
                past = self._updates != last.updates or self._fingerprint() != last.fingerprint
                if not moving and not past:
                    return self._write(last)
            finally:
                self._lock.release()
            if self._clock() >= deadline:
                where = "inside" if moving else "past"
                return RescueOutcome(
                    last.step,
                    None,
                    f"rank {self.rank} was {where} the optimizer update of step "
                    f"{last.step + 1} and did not end that step within {wait_s:.0f} s",
                )
            time.sleep(0.005)

    def _write(self, last: CompletedStep) -> RescueOutcome:
        """Write ``last`` (the lock is held: the training thread cannot change the state)."""
        try:
            newest = self.writer.newest_saved()
            if newest is not None and newest.step >= last.step:
                return RescueOutcome(
                    newest.step, newest.name, f"step {newest.step} is saved already"
                )
            behind = self._gpu_behind(last)
            if behind is not None:
                return RescueOutcome(last.step, None, behind)
            state = self._state(last)
            progress = Progress()
            progress.update_from(last.progress, last.extra)
            rng = [step_rng_state(self.seed, last.step + 1, r) for r in range(self.world)]
            path = self.writer.write_now(state, progress, rng)
        except Exception as exc:  # a second fault, a full disk: the periodic one stands
            log.exception("rescue: writing step %d failed", last.step)
            return RescueOutcome(last.step, None, f"the write failed: {type(exc).__name__}: {exc}")
        return RescueOutcome(last.step, path.name, None)

    def _gpu_behind(self, last: CompletedStep) -> str | None:
        """Why ``last`` cannot be copied: its work never ended on this rank's GPU within
        :data:`GPU_STEP_WAIT_S`, asked on the host (None: it ended, or there is no GPU)."""
        if _reached(last.event, self._clock, GPU_STEP_WAIT_S):
            return None
        return (
            f"rank {self.rank}'s GPU did not end step {last.step}: its work was not done "
            f"{GPU_STEP_WAIT_S:.0f} s after the fault (queued behind a collective that never "
            "ends): the newest periodic checkpoint stands"
        )

    def _state(self, last: CompletedStep) -> dict[str, Any]:
        state = self.writer.live_state()
        model = dict(state["model"])
        for (name, _), kept in zip(self._buffers, self._kept, strict=False):
            model[name] = kept  # rank 0's, as the step ended, before the next forward
        state["model"] = model
        on_host: dict[str, Any] = _to_host(state, last.event, self._side)  # the CPU's: as is
        return on_host


def _reached(event: Any, clock: Callable[[], float], wait_s: float) -> bool:
    """Whether the device has done the work recorded before ``event`` (None: no device), asked
    on the host every 5 ms for at most ``wait_s``: never a wait for the device itself."""
    if event is None:
        return True
    deadline = clock() + wait_s
    while not event.query():
        if clock() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _to_host(state: Any, event: Any, side: Any) -> Any:
    """``state`` with every GPU tensor copied to host memory on the ``side`` stream (made
    before any fault), which waits only for ``event`` (the completed step's work), never for
    what is queued after it."""
    if side is None:
        return state
    if event is not None:
        side.wait_event(event)
    with torch.cuda.stream(side):
        copied = _walk(state)
    side.synchronize()
    return copied


def _walk(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", non_blocking=False) if obj.is_cuda else obj
    if isinstance(obj, dict):
        return {k: _walk(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v) for v in obj)
    return obj
