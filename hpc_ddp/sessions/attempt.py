"""A session's attempt of its run: the checkpoints it saves and the ledger entries it writes
(through the attempt recorder, :class:`~hpc_ddp.fault.coordinator.Coordinator`), in the order
that keeps every checkpoint an entry names on disk.

* Its start: rank 0 writes it; an attempt past the requeue budget ends there, on every rank.
* Its restore and its saves: each timed by the watchdog as a checkpoint; a save is recorded in
  the ledger by rank 0 once it is durable (with how long training waited for it).
* Its end: at an agreed stop the step is saved and durable first, then rank 0 records the stop
  and asks for the requeue, its answer heard by every rank; at a clean end the final step is
  saved, then ``finished`` written; a crash or a fault the rank's watchdog declared is written
  as it happens, naming only a checkpoint on disk.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from hpc_ddp.backends.allocation import Allocation
from hpc_ddp.checkpoint.checkpointer import Checkpointer, SavedNote, broadcast_object
from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.config.model import JobConfig
from hpc_ddp.fault.blame import FaultRecord
from hpc_ddp.fault.coordinator import Coordinator
from hpc_ddp.fault.rankwatch import RankWatch
from hpc_ddp.fault.rescue import Rescue, RescueOutcome, writer_rank
from hpc_ddp.rundir.attempt import AutoInterval
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.savetimes import SaveTimes, history_path
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.stopflag import StopFlag
from hpc_ddp.sessions.autointerval import AutoCheckpoints
from hpc_ddp.sessions.startup import Rank

log = logging.getLogger("hpc_ddp")

SHARDED_WHY = (
    "an FSDP model's shards of the lost rank exist nowhere else: the newest committed shard set "
    "stands"
)


class SessionAttempt:
    """One session's attempt: its checkpoints and its ledger entries (see the module docstring).

    ``progress`` is the session's own: each entry names the step it holds then. ``watch`` times
    the saves and says where the rank left its loop; ``stop_flag``'s agreement in flight is
    settled before the final save, a collective.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        coordinator: Coordinator,
        progress: Progress,
        watch: RankWatch,
        stop_flag: StopFlag,
    ) -> None:
        self.checkpointer = checkpointer
        self.coordinator = coordinator
        self._progress = progress
        self._watch = watch
        self._stop_flag = stop_flag
        self._rescue: Rescue | None = None
        self._armed = False
        self.on_durable: Callable[[SavedNote], None] | None = None
        """Told of each durable save after its ledger line (rank 0; the auto interval)."""
        self._auto: Callable[[], AutoCheckpoints] | None = None
        self._save_times: SaveTimes | None = None
        """Rank 0's record of its saves' W in the user's history (requeue.lead_time: auto)."""

    @classmethod
    def open(
        cls,
        rank: Rank,
        paths: RunPaths,
        config: JobConfig,
        progress: Progress,
        *,
        run_id: str,
        allocation: Allocation,
        since: float,
        env: Mapping[str, str],
    ) -> SessionAttempt:
        """The attempt of a rank just started: its recorder (asking ``allocation`` for
        requeues; ``since``: when the session began, before any peer could write the start),
        its checkpointer (each save recorded in the ledger), a fault its watchdog declares
        recorded as its end, and rank 0 makes the checkpoint directory; ``env``: the session's
        environment (the auto interval's history)."""
        dist = rank.dist
        coordinator = Coordinator(dist, paths.ledger, config.requeue, allocation, since=since)
        checkpointer = Checkpointer(
            paths.checkpoints,
            config,
            rank=dist.rank,
            world_size=dist.world_size,
            device=rank.device,
            grad_accum=rank.grad_accum,
            run_id=run_id,
        )
        attempt = cls(checkpointer, coordinator, progress, rank.watch, rank.stop_flag)
        # The user's histories live where this process's XDG_STATE_HOME says, whatever task
        # variables the session was handed (a given env of SLURM_* alone must not send them to
        # ~/.local/state).
        env = {**os.environ, **env}
        if dist.is_main:  # requeue.lead_time: auto is sized from these at the next submit
            path = history_path(env, Path.home())
            attempt._save_times = SaveTimes(path, run_id=run_id, name=config.name)
        attempt._auto = partial(
            AutoCheckpoints, config.train, is_main=dist.is_main,
            broadcast=broadcast_object if dist.world_size > 1 else lambda value: value,
            settle=checkpointer.settle, ledger=paths.ledger, env=env, run_id=run_id, began=since,
        )  # fmt: skip
        checkpointer.on_saved(attempt._saved)
        rank.watch.on_fault(attempt.fault)
        if dist.is_main:
            paths.checkpoints.mkdir(parents=True, exist_ok=True)
        return attempt

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint this attempt resumed from or saved last (None: none yet)."""
        last = self.checkpointer.last
        return None if last is None else last.name

    def restore(self, tracked: Tracked, *, elastic: bool) -> str | None:
        """Track ``tracked`` and load the newest good checkpoint into it and the progress
        (collective; see :meth:`Checkpointer.restore`), timed against the checkpoint deadline;
        the name of the one loaded (None: none)."""
        with self._watch.section("checkpoint"):
            loaded = self.checkpointer.restore(tracked, self._progress, elastic=elastic)
        return None if loaded is None else loaded.name

    def save(self, *, wait: bool, auto: AutoInterval | None = None) -> Path | None:
        """Save the tracked objects at this step (collective; see :meth:`Checkpointer.save`),
        timed against the checkpoint deadline; rank 0 records it once it is durable, with the
        auto interval in force (``auto``)."""
        with self._watch.section("checkpoint"):
            return self.checkpointer.save(self._progress, wait=wait, note=auto)

    def auto_checkpoints(self) -> AutoCheckpoints:
        """The interval of this attempt's loop under ``checkpoint_every="auto"``
        (:class:`~hpc_ddp.sessions.autointerval.AutoCheckpoints`); rank 0's is told of each
        durable save (W)."""
        assert self._auto is not None, "SessionAttempt.open makes an attempt's auto interval"
        auto = self._auto()
        if auto.is_main:
            self.on_durable = auto.durable
        return auto

    def _saved(self, note: SavedNote) -> None:
        """Rank 0's writer thread: a save is durable; the ledger's line, then the listener."""
        auto = note.note if isinstance(note.note, AutoInterval) else None
        self.coordinator.record_checkpoint(
            note.step, note.stall_s, durable_s=note.durable_s, auto=auto, now=note.asked_at
        )
        if self._save_times is not None:
            self._save_times.saved(note.durable_s)
        listener = self.on_durable
        if listener is not None:
            listener(note)

    def begin(self, checkpoint: str | None) -> int | None:
        """Rank 0 writes the attempt's start (from ``checkpoint``, None: from scratch; with the
        run's accumulation and, after an elastic resume, its resize); every rank gets the exit
        code of an attempt past the budget (it must end at once), else None. Collective."""
        ckpt = self.checkpointer
        outcome = self.coordinator.begin(
            resumed_from_step=self._progress.step if checkpoint else None,
            checkpoint=checkpoint,
            grad_accum=ckpt.grad_accum,
            resize=ckpt.resize,
        )
        code: int | None = broadcast_object(None if outcome is None else outcome.exit_code)
        return code

    def save_at_stop(self) -> None:
        """At an agreed stop (collective): the tracked objects saved at this step and durable
        (nothing new when this step is saved); without any, rank 0's write errors heard."""
        if self.checkpointer.tracked is not None:
            # Said before it begins: a kill before it is durable leaves this line alone, and
            # the next attempt (or status) records the save as lost.
            self.coordinator.record_stop_save(self._progress.step)
            self.save(wait=True)
        else:
            self.checkpointer.sync_errors()  # every rank got here, nothing is being written

    def stop(self, signum: int) -> tuple[bool, int]:
        """The agreed stop, its checkpoint durable (:meth:`save_at_stop`): the data workers are
        let go (:func:`let_data_workers_go`), rank 0 records the stop and asks for the requeue;
        every rank gets (requeue asked, exit code). Collective.

        Timed as a ``stop`` phase on every rank, not as the step it follows: the other ranks
        wait here while rank 0 asks Slurm (up to three ``scontrol`` calls, each of up to a
        minute), which a busy controller can make longer than the step deadline."""
        let_data_workers_go()
        with self._watch.section("stop"):
            outcome = None
            if self.coordinator.dist.is_main:
                step = self._progress.step
                outcome = self.coordinator.stop(signum, step=step, checkpoint=self.checkpoint)
            asked, code = broadcast_object(
                (False, 0) if outcome is None else (outcome.requeue_requested, outcome.exit_code)
            )
        return bool(asked), int(code)

    def finish(self, *, began: bool) -> None:
        """A clean end: the final step saved (when the attempt ``began``: see
        :meth:`_save_final`), then rank 0 writes ``finished``, or where this rank left its
        ``steps`` loop before its end. After a stop the end is written already: none is added."""
        if began:
            self._save_final()
        left = self._watch.left
        said = "training finished" if left is None else (
            f"left the training loop at step {left[0]} of {left[1]}"
        )  # fmt: skip
        self.coordinator.finish(step=self._progress.step, checkpoint=self.checkpoint, message=said)

    def _save_final(self) -> None:
        """The final step saved (collective, durable before ``finished`` is written), so a loop
        that never saves after its last step loses nothing; a step already saved (a
        ``checkpoint_every`` multiple, an explicit ``s.checkpoint()``, the step resumed from) is
        not saved twice. Nothing is saved without tracked objects (no ``restore``)."""
        ckpt = self.checkpointer
        if ckpt.tracked is None:
            return
        if self._watch.left is not None and self.coordinator.dist.world_size > 1:
            # This rank left its loop early: its peers may still be training, and a save is
            # a collective they would never join (the supervisor ends the launch instead).
            return
        self._stop_flag.settle()  # a loop left early: its agreement in flight goes first
        if self._progress.step > 0:
            self.save(wait=True)
        else:
            ckpt.sync_errors()

    def crash(self, exc: BaseException) -> None:
        """An exception left the session on this rank: its exit note names the error (in place
        of a note of the loop it unwound), the ledger records the crash (see
        :meth:`Coordinator.crash`), and the watchdog claims the launch's fault."""
        step = self._progress.step
        self._watch.note_exit(step, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:400])
        self.coordinator.crash(step=step, checkpoint=self.checkpoint, error=exc)
        self._watch.crashed(exc, stopping=self._stop_flag.received is not None)

    def arm_rescue(self, seed: int) -> None:
        """As training starts (once): when a peer dies, hangs or loses its node, the lowest
        surviving rank writes the last step every rank completed (:mod:`hpc_ddp.fault.rescue`),
        or the ledger says why it cannot (a sharded model). Nothing without ``fault.rescue``, a
        watchdog, tracked objects or a peer."""
        watchdog, listener = self._watch.watchdog, self._watch.listener
        ckpt, dist = self.checkpointer, self.coordinator.dist
        if not ckpt.config.fault.rescue:
            return
        if self._armed or ckpt.tracked is None or dist.world_size < 2:
            return
        if watchdog is None and listener is None:
            return
        self._armed = True
        if ckpt.sharded is None:
            self._rescue = Rescue(
                ckpt.tracked, ckpt, seed=seed, rank=dist.rank, world=dist.world_size,
                device=ckpt.device, model=unwrap(ckpt.tracked.model),
            )  # fmt: skip
        if watchdog is not None:
            watchdog.rescue = self._rescued
        elif listener is not None:
            listener.start(self._rescued)

    def completed(self) -> None:
        """This rank completed the step :attr:`progress` holds (every step: see
        :meth:`Rescue.completed`)."""
        if self._rescue is not None:
            self._rescue.completed(self._progress)

    def _rescued(self, record: FaultRecord) -> bool:
        """The launch's fault is known (on the watchdog's thread): the rescue, recorded; True
        when this rank is the survivor that saves (it wrote, or says why it could not)."""
        began = time.monotonic()
        if self._rescue is not None:
            outcome = self._rescue.save(record.ranks)
        elif (
            writer_rank(self.coordinator.dist.world_size, record.ranks)
            == self.coordinator.dist.rank
        ):
            outcome = RescueOutcome(None, None, SHARDED_WHY)
        else:
            return False
        if outcome.checkpoint is None and outcome.why is None:
            return False  # another rank writes
        took = time.monotonic() - began
        if outcome.why is None:
            log.warning("rescue: saved step %s, the last every rank completed, as %s in %.2f s",
                        outcome.step, outcome.checkpoint, took)  # fmt: skip
        else:
            log.warning("rescue: no survivor's save: %s", outcome.why)
        self.coordinator.record_rescue(
            step=outcome.step, checkpoint=outcome.checkpoint, why=outcome.why, took_s=took
        )
        return True

    def fault(self, record: FaultRecord) -> None:
        """The rank's watchdog declared a fault (on its thread): the attempt ends with it."""
        self.coordinator.fault(record, step=self._progress.step, checkpoint=self.checkpoint)


def let_data_workers_go() -> None:
    """From here on a data-loader worker that dies is no error in this process.

    Once rank 0 asks Slurm to requeue, Slurm SIGTERMs every process of the step, the
    data-loader workers too (even ``scontrol`` itself, before it returns), and torch's SIGCHLD
    handler would raise "DataLoader worker ... is killed by signal" in whatever the rank does
    next: asking Slurm what became of the request, writing the ledger, hearing rank 0's answer.
    A clean stop would be recorded as a crash. The attempt is over and no batch is wanted, so
    the default disposition comes back (not SIG_IGN, which would break ``waitpid``), and stays
    until the process is gone. Only the main thread may set a handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
