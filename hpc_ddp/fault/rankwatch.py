"""A rank's side of the fault model, as its session wires it: the watchdog told where the rank is
(each phase against its own deadline), and the exit note that says how the rank left (its
``steps`` loop before its end, or an error). A fault the watchdog declares goes to whoever the
session names (:meth:`RankWatch.on_fault`): the attempt's end in the ledger.

Without ``fault.enabled`` (or a watchdog not wanted: a lone process without a supervisor), and
before the session starts (:meth:`RankWatch.off`), every call here does nothing, so the session
calls them unconditionally.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.fault.blame import PEER_ERROR, ExitNote, FaultRecord, task_place
from hpc_ddp.fault.listener import FaultListener
from hpc_ddp.fault.watchdog import (
    Identity,
    Watchdog,
    exit_note_path,
    launch_paths,
    start_watchdog,
    write_exit_note,
)
from hpc_ddp.rundir.layout import TASK_PLACE_ENV, WATCHDOG_OWNER_ENV
from hpc_ddp.runtime.distenv import DistEnv


@dataclass
class RankWatch:
    """This rank's watchdog (None: none runs) and where its exit note goes (None: none)."""

    rank: int
    node: str
    watchdog: Watchdog | None
    own: bool
    """The watchdog was started here (not by ``hpc-ddp run``): :meth:`stop` stops it."""
    exit_note: Path | None
    left: tuple[int, int] | None = None
    """(step, total) of the ``steps`` loop this rank left before its end, as its exit note says
    (None: it did not, or it went on to an agreed stop or a failure)."""
    listener: FaultListener | None = None
    """A ``command:`` child's ear for its launch's fault, whose parent beats for it (None: this
    rank has a watchdog of its own, or nothing watches it)."""

    @classmethod
    def start(
        cls, cfg: FaultConfig, run_dir: Path, env: Mapping[str, str], dist: DistEnv
    ) -> RankWatch:
        """The running watchdog, or one started now when it is wanted, and the exit note's
        path (see :func:`~hpc_ddp.fault.watchdog.start_watchdog`)."""
        watchdog, own = start_watchdog(cfg, run_dir, env, dist)
        note = exit_note_path(cfg, run_dir, env, dist)
        node = dist.node_name or "local"
        listener = None
        if watchdog is None and cfg.enabled and env.get(WATCHDOG_OWNER_ENV) and dist.world_size > 1:
            place = task_place(env.get(TASK_PLACE_ENV), dist.rank, dist.world_size)
            if place is not None:
                task, tasks = place
                me = Identity(task, tasks, node, dist.step_id)
                paths = launch_paths(run_dir, env, dist)
                listener = FaultListener(
                    cfg, paths, me, supervised=dist.supervised, per_task=dist.world_size // tasks
                )
        return cls(dist.rank, node, watchdog, own, note, listener=listener)

    @classmethod
    def off(cls) -> RankWatch:
        """No watchdog and no exit note: every call does nothing (a session not started)."""
        return cls(0, "local", None, False, None)

    def on_fault(self, declared: Callable[[FaultRecord], None]) -> None:
        """Call ``declared`` (on the watchdog's thread) when the watchdog declares a fault."""
        if self.watchdog is not None:
            self.watchdog.on_declared = declared

    @property
    def phase(self) -> str | None:
        """The phase the watchdog times now (None: no watchdog)."""
        return None if self.watchdog is None else self.watchdog.phase

    def enter(self, phase: str, limit: float | None = None) -> None:
        """This rank now works in ``phase``; ``limit`` overrides the phase's own timeout."""
        if self.watchdog is not None:
            self.watchdog.enter(phase, limit)

    @contextlib.contextmanager
    def section(self, name: str, timeout_s: float | None = None) -> Iterator[None]:
        """``name`` timed against ``timeout_s`` (default: the phase's own), then back to the
        phase it interrupted."""
        before = self.phase
        self.enter(name, timeout_s)
        try:
            yield
        finally:
            if before is not None:
                self.enter(before)

    def waiting_for_data(self, waiting: bool) -> None:
        """This rank's main thread waits (True) for its next batch, or has it (False)."""
        if self.watchdog is not None:
            self.watchdog.data_wait = waiting

    def step_done(self, step: int) -> None:
        """Step ``step`` is complete: its time joins the step timeout's sample."""
        if self.watchdog is not None:
            self.watchdog.step_done(step)

    def left_loop(self, step: int, left: tuple[int, int] | None) -> None:
        """Note (or take back, ``left`` None) that this rank left its ``steps`` loop at
        ``left`` (step, total), before its end: its exit note says so from ``step`` on."""
        if left != self.left:
            self.left = left
            self.note_exit(step, total=None if left is None else left[1])

    def note_exit(self, step: int, *, total: int | None = None, error: str | None = None) -> None:
        """This rank's exit note (see :class:`~hpc_ddp.fault.blame.ExitNote`): the supervisor
        ends a launch whose rank left its loop while its peers train on. Best effort: a note
        that cannot be written is no reason to fail the rank."""
        if self.exit_note is None:
            return
        note = ExitNote(self.rank, self.node, os.getpid(), time.time(), step, total, error)
        with contextlib.suppress(OSError, ValueError):
            write_exit_note(self.exit_note, note)

    def crashed(self, exc: BaseException, *, stopping: bool = False) -> None:
        """Claims the launch's fault (unless this rank only lost a peer) before the slow part of
        leaving: the others learn of it from the beats, not from a collective. ``stopping``: a
        stop signal came already (torchrun ending the workers of a node whose other worker
        failed, or Slurm's stop): a ``command:`` child that lost a peer then leaves at once
        rather than wait to be the survivor that saves."""
        if self.watchdog is not None:
            self.watchdog.crashed(f"{type(exc).__name__}: {exc}")
        elif (
            self.listener is not None
            and not stopping
            and PEER_ERROR.search(f"{type(exc).__name__}: {exc}")
        ):
            self.listener.lost_peer()  # the rescue, if this child is the survivor that saves

    def stop(self) -> None:
        """Stop the watchdog if it was started here."""
        if self.own and self.watchdog is not None:
            self.watchdog.stop()
