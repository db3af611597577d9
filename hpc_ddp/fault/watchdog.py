"""Every rank's watchdog: its heartbeat, its phase deadlines, its peers' beats, and the way out.

One daemon thread per rank (``hpc-ddp-watchdog``), started by ``hpc-ddp run`` once torch is
imported, before the rendezvous (or by a session of its own). Once per ``fault.beat_s`` it

1. rewrites this rank's beat (:mod:`hpc_ddp.fault.blame`: rank, node, step, phase, ``seq``)
   in place in ``RUN_DIR/launches/<key>/rank-<r>.beat``: one ``open``/``pwrite``/``close``, no
   new file, no fsync (about 10 µs, measured; the beat thread runs while the main thread
   waits in gloo or NCCL, which release the GIL);
2. reads the supervisor's beat (or, without one, the launch's fault record) and the beats of
   two ring peers (rank+1, rank+2): a fault declared anywhere is adopted at once;
3. checks its own phase's deadline (:func:`phase_timeout`: start-up, the step, a checkpoint);
4. checks that its ring peers still beat (:class:`~hpc_ddp.fault.blame.StaleWatch`).

A fault, declared here or adopted, ends this process without any collective: the fault record
is claimed (the first declaration wins), this rank's Python stacks (every thread) go to its log,
a last beat says how it left, and ``os._exit`` ends it (:data:`~hpc_ddp.exitcodes.FAULT_EXIT_CODE`
for the declarer, :data:`~hpc_ddp.exitcodes.PEER_FAULT_EXIT_CODE` for the others). A process
frozen by SIGSTOP cannot run its watchdog: its ring predecessor sees its beat stop and declares
the hang, and the supervisor wakes it (SIGCONT) and asks for its stacks (:data:`DUMP_SIGNAL`,
answered by :mod:`faulthandler` in C). Under NCCL the survivors of a dead rank do not raise;
they leave here, well before NCCL's own timeout.

The main thread only stores plain attributes (:meth:`Watchdog.enter`, :meth:`Watchdog.step_done`):
no I/O and no lock on the training path.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.exitcodes import FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE
from hpc_ddp.fault.blame import (
    ALIVE,
    EARLY_EXIT_GRACE_S,
    EXITED,
    FAULT,
    HARDWARE_ERROR,
    PEER_ERROR,
    RESCUE_PHASE,
    STARTING,
    Beat,
    ExitNote,
    FaultRecord,
    StaleWatch,
    assign_blame,
    early_exit_why,
    encode_beat,
    encode_exit_note,
    encode_fault,
    parse_beat,
    parse_exit_note,
    parse_fault,
    task_place,
)
from hpc_ddp.rundir.layout import (
    LAUNCH_DIR_ENV,
    TASK_PLACE_ENV,
    WATCHDOG_OWNER_ENV,
    LaunchPaths,
    RunPaths,
    launch_key,
)
from hpc_ddp.runtime.distenv import DistEnv

log = logging.getLogger("hpc_ddp")

DUMP_SIGNAL = signal.SIGURG
"""Asks a rank for its Python stacks (every thread), written by :mod:`faulthandler` in C, so a
rank stuck holding the GIL still answers. SIGURG's default action is to be ignored: sent to a
whole step it harms no process that did not register it (a DataLoader worker, a command's
child), unlike SIGQUIT (a core dump) or USR1/USR2 (maybe the requeue signal)."""
EXIT_GRACE_S = 10.0
"""After a rank says it is leaving, how long its interpreter may take to exit (closing files,
threads) before the watchdog ends it: an error path must never wait on a collective teardown."""
STEP_WINDOW = 200
"""Step times kept for the step timeout's percentile."""
MIN_SAMPLES = 20
"""Step times needed before the percentile counts (until then the floor alone applies)."""
DEADLINE_SLACK_S = 0.05
"""How long after a phase's deadline the extra check runs, so it finds the deadline passed."""


class StepTimes:
    """The recent step durations of this launch (checkpoint phases excluded)."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=STEP_WINDOW)

    def add(self, seconds: float) -> None:
        """One step took ``seconds``."""
        self._times.append(seconds)

    def p99(self) -> float | None:
        """The 99th percentile, or None with fewer than :data:`MIN_SAMPLES` samples."""
        if len(self._times) < MIN_SAMPLES:
            return None
        ordered = sorted(self._times)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def phase_timeout(
    phase: str, cfg: FaultConfig, times: StepTimes, launch_steps: int, limit: float | None = None
) -> float:
    """How long a rank may stay in ``phase`` (pure).

    ``startup`` and the first ``warmup_steps`` steps of a launch: ``startup_timeout_s``. A step:
    max(``step_timeout_s``, ``step_timeout_factor`` x p99 of recent steps), the floor while too
    few steps were seen. ``checkpoint`` and any other named phase (an evaluation,
    ``Session.phase``): ``limit`` if given, else ``checkpoint_timeout_s``. ``command`` (a user
    program this process only watches) has no deadline of its own.
    """
    if phase == "command":
        return float("inf")
    if phase == "startup" or (phase == "step" and launch_steps < cfg.warmup_steps):
        return float(cfg.startup_timeout_s)
    if phase == "step":
        p99 = times.p99()
        floor = float(cfg.step_timeout_s)
        return floor if p99 is None else max(floor, cfg.step_timeout_factor * p99)
    return float(limit if limit is not None else cfg.checkpoint_timeout_s)


@dataclass(frozen=True)
class Identity:
    """Who this rank is, for its beat."""

    rank: int
    world: int
    node: str
    slurm_step: str | None = None


def write_beat(path: Path, beat: Beat) -> None:
    """Rewrite ``path`` in place with ``beat`` (the file keeps its inode and its size)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, encode_beat(beat), 0)
    finally:
        os.close(fd)


def read_beat(path: Path) -> Beat | None:
    """The beat in ``path``; None when it is missing, empty or unreadable."""
    try:
        with open(path, "rb") as f:
            return parse_beat(f.read())
    except OSError:
        return None


def read_beats(launch: LaunchPaths, world: int) -> dict[int, Beat | None]:
    """Every rank's beat in one pass."""
    return {r: read_beat(launch.beat(r)) for r in range(world)}


def write_exit_note(path: Path, note: ExitNote) -> None:
    """Rewrite ``path`` in place with ``note`` (as a beat: one fixed-size ``pwrite``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, encode_exit_note(note), 0)
    finally:
        os.close(fd)


def read_exit_note(path: Path) -> ExitNote | None:
    """The exit note in ``path``; None when none was written (or it is unreadable)."""
    try:
        with open(path, "rb") as f:
            return parse_exit_note(f.read())
    except OSError:
        return None


def read_exit_notes(launch: LaunchPaths, world: int) -> dict[int, ExitNote | None]:
    """Every rank's exit note (None: none written, or unreadable)."""
    return {r: read_exit_note(launch.exit_note(r)) for r in range(world)}


def exit_note_path(
    cfg: FaultConfig, run_dir: Path, env: Mapping[str, str], dist: DistEnv
) -> Path | None:
    """Where this rank's session writes its exit note: its launch's directory (a ``command:``
    child's too, whose parent beats for it); None without ``fault.enabled``, and for one of
    several ranks of a task (torchrun's workers): the notes are numbered by task, and the
    task's end is its parent's to tell."""
    if not cfg.enabled:
        return None
    place = task_place(env.get(TASK_PLACE_ENV), dist.rank, dist.world_size)
    if place is None or place[1] != dist.world_size:
        return None
    return launch_paths(run_dir, env, dist).exit_note(dist.rank)


def claim_fault(path: Path, record: FaultRecord) -> bool:
    """Write ``record`` as the launch's fault record if nobody has yet (exclusive create,
    atomic on local file systems and NFSv3+); True for the one who did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, encode_fault(record))
    finally:
        os.close(fd)
    return True


def read_fault(path: Path) -> FaultRecord | None:
    """The launch's fault record; None when there is none (or it is still being written)."""
    try:
        return parse_fault(path.read_bytes())
    except OSError:
        return None


_stacks: tuple[str, int] | None = None
"""The stacks file :data:`DUMP_SIGNAL` writes to and its descriptor: faulthandler writes to it
from C, so it stays open for the life of the process."""


def install_stack_dump(path: Path) -> None:
    """Let :data:`DUMP_SIGNAL` append every thread's stacks to ``path`` (the launch's
    :meth:`~hpc_ddp.rundir.layout.LaunchPaths.stacks`); idempotent: Slurm may deliver a step
    signal twice, and each dump is appended.

    Every thread includes hpc-ddp's own (this watchdog, the checkpoint writer): a dump for
    hpc-ddp's diagnosis, so it goes to hpc-ddp's file, never into the program's stderr, where
    the user reads their own program's words. The supervisor asks every rank after every
    fault, a crash loop's survivors included.
    """
    global _stacks
    if _stacks is not None and _stacks[0] == str(path):
        return
    with contextlib.suppress(ValueError, RuntimeError, OSError):  # no writable launch dir
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(
            fd,
            f"hpc-ddp: the thread stacks of pid {os.getpid()}, written on a fault (the "
            "supervisor's SIGURG, or its watchdog leaving), most recent call first\n".encode(),
        )
        faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
        before, _stacks = _stacks, (str(path), fd)
        if before is not None:
            os.close(before[1])


_current: Watchdog | None = None


def current() -> Watchdog | None:
    """This process's running watchdog, if it has one."""
    return _current


class Watchdog:
    """One rank's watchdog thread (see the module docstring)."""

    def __init__(
        self,
        cfg: FaultConfig,
        launch: LaunchPaths,
        me: Identity,
        *,
        supervised: bool,
        on_declared: Callable[[FaultRecord], None] | None = None,
        clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        exit: Callable[[int], NoReturn] = os._exit,
    ) -> None:
        self.cfg = cfg
        self.launch = launch
        self.me = me
        self.supervised = supervised
        self.on_declared = on_declared
        """Called on the thread with the fault this rank declared and won the claim for (the
        session records it in the ledger)."""
        self.before_exit: list[Callable[[], None]] = []
        """Called before the process ends for a fault (a command's parent kills its child)."""
        self.rescue: Callable[[FaultRecord], object] | None = None
        """A survivor's save (:mod:`hpc_ddp.fault.rescue`), run on this thread once a fault is
        known and before the process ends; the beat says ``rescue`` meanwhile, so that the
        supervisor does not end the launch under it."""
        self._gone = threading.Event()
        self._clock, self._mono, self._exit = clock, mono, exit
        self.started = clock()
        self.step = 0
        self.phase = "startup"
        self.since = self.started
        self.launch_steps = 0
        self.data_wait = False
        """The main thread waits for its next batch (set by the session's loader)."""
        self.limit: float | None = None
        self.times = StepTimes()
        self.child: int | None = None
        """A ``command:`` child's pid: a child stopped for ``stale_s`` is this rank's hang."""
        self._seq = 0
        self._state = STARTING
        self._code: int | None = None
        self._error: str | None = None
        self._frozen: float | None = None
        self._fault: FaultRecord | None = None
        self._peers = ring_peers(me)
        self._watch = StaleWatch()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one way out, even if the main thread leaves too
        self._child_stopped: float | None = None
        self._left_seen: float | None = None
        self._thread = threading.Thread(target=self._run, name="hpc-ddp-watchdog", daemon=True)

    @property
    def leaving(self) -> bool:
        """This process is leaving for a fault (the thread ends it when done): the one way
        out is taken, and never given back."""
        return self._lock.locked()

    # --- the main thread's side: plain stores, no I/O ---------------------------------------

    def enter(self, phase: str, limit: float | None = None) -> None:
        """This rank now works in ``phase`` (``step``, ``checkpoint``, ``eval``...); ``limit``
        overrides the phase's own timeout."""
        self.phase, self.since, self.limit = phase, self._clock(), limit
        if self._state == STARTING and phase != "startup":
            self._state = ALIVE

    def step_done(self, step: int) -> None:
        """Step ``step`` is complete: its time joins the step timeout's sample."""
        now = self._clock()
        if self.phase == "step" and self.launch_steps >= self.cfg.warmup_steps:
            self.times.add(now - self.since)
        self.step = step
        self.launch_steps += 1
        self.phase, self.since, self.limit = "step", now, None
        self._state = ALIVE

    def exiting(self, code: int, error: str | None = None) -> None:
        """This rank is leaving with ``code``: a last beat says so (and names ``error``), and
        the process is ended if it is still here :data:`EXIT_GRACE_S` later."""
        self._state, self._code, self._error = EXITED, code, error
        self._stop.set()
        with contextlib.suppress(OSError):
            write_beat(self.launch.beat(self.me.rank), self._beat())
        timer = threading.Timer(EXIT_GRACE_S, self._exit, args=(code,))
        timer.daemon = True
        timer.start()

    def crashed(self, error: str) -> None:
        """This rank raised ``error``: unless it only lost a peer, that is the launch's fault
        (claimed now, so the others leave at their next beat instead of blocking)."""
        if PEER_ERROR.search(error) and self._fault is None and self.rescue is not None:
            # A lost peer: the fault is about to be declared (by the supervisor, a peer or
            # this thread), and this process may be the survivor that saves the step every
            # rank completed. Leaving now would end it before the save. Its beat says so at
            # once: with the peer silent and its node not answering, the supervisor needs no
            # stale_s to call the node lost.
            self._error = error[:400]
            with contextlib.suppress(OSError):
                write_beat(self.launch.beat(self.me.rank), self._beat())
            self._gone.wait(self.cfg.stale_s + 3 * self.cfg.beat_s)
        if self.leaving and self.rescue is not None:
            # The watchdog has the fault (before this raise, or while this thread waited for
            # it) and may be writing the survivor's save: a hung peer woken to leave died, and
            # the collective raised here. Unwinding would end the process under the save, and
            # the step every rank completed would be trained again. The watchdog ends the
            # process when it is done.
            self._gone.wait(self.cfg.checkpoint_timeout_s + EXIT_GRACE_S)
            return
        if PEER_ERROR.search(error) or self._fault is not None:
            return
        record = FaultRecord(
            kind="crash",
            by=f"rank {self.me.rank} on {self.me.node}",
            time=self._clock(),
            ranks=(self.me.rank,),
            nodes=(self.me.node,),
            why=error[:400],
            node_level=HARDWARE_ERROR.search(error) is not None,
            last_progress=self.since,
        )
        with contextlib.suppress(OSError):
            if claim_fault(self.launch.fault, record):
                self._fault = record
                write_beat(self.launch.beat(self.me.rank), self._beat())

    # --- the thread -----------------------------------------------------------------------

    def start(self) -> Watchdog:
        """Write the first beat and start the thread; becomes :func:`current`."""
        global _current
        self.launch.root.mkdir(parents=True, exist_ok=True)
        install_stack_dump(self.launch.stacks(self.me.rank))
        write_beat(self.launch.beat(self.me.rank), self._beat())
        self._thread.start()
        _current = self
        return self

    def stop(self) -> None:
        """Stop beating (a test, or a session that ends while the process goes on)."""
        global _current
        self._stop.set()
        if _current is self:
            _current = None

    def _beat(self) -> Beat:
        return Beat(
            rank=self.me.rank,
            node=self.me.node,
            pid=os.getpid(),
            seq=self._seq,
            time=self._clock(),
            step=self.step,
            phase=self.phase,
            since=self.since,
            launch_steps=self.launch_steps,
            state=self._state,
            code=self._code,
            error=self._error,
            frozen_s=self._frozen,
            slurm_step=self.me.slurm_step,
            fault=self._fault,
            data_wait=self.data_wait,
            rescues=self.rescue is not None,
        )

    def _run(self) -> None:
        last = self._mono()
        while not self._stop.wait(self._next_wait()):
            now = self._mono()
            if now - last > self.cfg.stale_s:
                self._frozen = now - last
                log.warning("watchdog: this process did not run for %.1f s", now - last)
            last = now
            try:
                self.tick(now)
            except Exception:  # the watchdog must never die of a bad file or a full disk
                log.exception("watchdog: check failed")

    def _next_wait(self) -> float:
        """A beat's wait, or less when this rank's phase deadline falls before the next beat:
        ticking once a beat alone finds a stuck step up to ``beat_s`` after its deadline."""
        limit = phase_timeout(self.phase, self.cfg, self.times, self.launch_steps, self.limit)
        left = limit - (self._clock() - self.since)
        if 0.0 <= left < self.cfg.beat_s:
            return left + DEADLINE_SLACK_S
        return float(self.cfg.beat_s)

    def tick(self, now: float) -> None:
        """One round: beat, adopt a declared fault, check own deadline, child and ring peers."""
        self._seq += 1
        began = self._mono()
        try:
            write_beat(self.launch.beat(self.me.rank), self._beat())
        except OSError as exc:
            log.warning("watchdog: cannot write the heartbeat (%s); declaring nothing", exc)
            return
        # A write that took half the stale time says the shared file system is the suspect.
        trust = self._mono() - began < self.cfg.stale_s / 2
        adopted = self._declared_elsewhere()
        if adopted is not None:
            self._leave(adopted, declared=False)
        if self._stop.is_set() or not trust:
            return
        wall = self._clock()
        limit = phase_timeout(self.phase, self.cfg, self.times, self.launch_steps, self.limit)
        if wall - self.since > limit:
            kind = "startup" if self._state == STARTING else "hang"
            why = (
                f"its {self.phase} phase at step {self.step} ran {wall - self.since:.0f} s, "
                f"past its {limit:.0f} s deadline"
            )
            self.declare(kind, why, own=True)
        if self._child_frozen(now):
            self.declare("hang", f"its program (pid {self.child}) stayed stopped", own=True)
        beats = {}
        for peer in self._peers:
            beats[peer] = read_beat(self.launch.beat(peer))
            self._watch.observe(peer, beats[peer], now)
        stale = [
            p
            for p in self._watch.stale(self._peers, now, self.cfg.stale_s, self.cfg.startup_stale_s)
            if not ((b := beats.get(p)) is not None and b.exited)
        ]
        if stale:
            quiet = max(self._watch.quiet_for(p, now) or 0.0 for p in stale)
            self.declare("hang", f"heartbeat stopped {quiet:.1f} s ago", silent=stale)
        if not self.supervised:  # a supervisor sees every rank's note itself
            self._peer_left(now)

    def _peer_left(self, now: float) -> None:
        """A ring peer left its training loop early (its exit note) while this rank did not:
        after :data:`EARLY_EXIT_GRACE_S` (the time an early stop all ranks agreed on takes to
        reach them all) it is the launch's fault, before this rank blocks for
        ``dist.timeout_s`` in a collective the peer never joins."""
        notes = {p: read_exit_note(self.launch.exit_note(p)) for p in self._peers}
        left = tuple(p for p, n in notes.items() if n is not None and n.left_early)
        mine = read_exit_note(self.launch.exit_note(self.me.rank))
        if not left or (mine is not None and mine.left_early):
            self._left_seen = None
            return
        if self._left_seen is None:
            self._left_seen = now
        if now - self._left_seen < max(EARLY_EXIT_GRACE_S, 3 * self.cfg.beat_s):
            return
        record = FaultRecord(
            kind="early_exit",
            by=f"rank {self.me.rank} on {self.me.node}",
            time=self._clock(),
            ranks=left,
            nodes=tuple(dict.fromkeys(n.node for p in left if (n := notes[p]) is not None)),
            why=early_exit_why(left, (self.me.rank,), notes),
            last_progress=max(n.time for p in left if (n := notes[p]) is not None),
        )
        self._claim(record)

    def _declared_elsewhere(self) -> FaultRecord | None:
        """A fault the supervisor, the fault record or a ring peer declared in this launch."""
        return declared_fault(self.launch, self._peers, self.supervised, self.started)

    def _child_frozen(self, now: float) -> bool:
        if self.child is None:
            return False
        if _proc_state(self.child) != "T":
            self._child_stopped = None
            return False
        if self._child_stopped is None:
            self._child_stopped = now
        return now - self._child_stopped >= self.cfg.stale_s

    def declare(
        self, kind: str, why: str, *, own: bool = False, silent: list[int] | None = None
    ) -> None:
        """Declare a fault in this launch and end this process (never returns on the thread).

        ``own``: this rank's own deadline passed (the others are read to see who stands out);
        ``silent``: ring peers that stopped beating.
        """
        beats = read_beats(self.launch, self.me.world)
        beats[self.me.rank] = self._beat()
        now = self._clock()
        blame = assign_blame(self.me.world, beats, silent=silent or [], now=now).blame
        ranks, nodes, evidence = blame.ranks, blame.nodes, blame.evidence
        if silent:
            evidence = why
        elif own and ranks in ((), (self.me.rank,)):
            ranks, nodes, evidence = (self.me.rank,), (self.me.node,), why
        elif own:
            evidence = f"{evidence}; rank {self.me.rank}: {why}"
        record = FaultRecord(
            kind=kind,
            by=f"rank {self.me.rank} on {self.me.node}",
            time=now,
            ranks=ranks,
            nodes=nodes,
            why=evidence,
            node_level=blame.node_level,
            last_progress=blame.last_progress_at,
        )
        self._claim(record)

    def _claim(self, record: FaultRecord) -> None:
        """Claim ``record`` as the launch's fault (or adopt the claim that won) and leave."""
        kind = record.kind
        if claim_fault(self.launch.fault, record):
            log.error(
                "watchdog: %s: %s (%s); ending this launch",
                kind,
                ", ".join(f"rank {r}" for r in record.ranks),
                record.why,
            )
            if self.on_declared is not None:
                with contextlib.suppress(Exception):
                    self.on_declared(record)
            self._leave(record, declared=True)
        else:
            self._leave(read_fault(self.launch.fault) or record, declared=False)

    def _leave(self, record: FaultRecord, *, declared: bool) -> None:
        if not self._lock.acquire(blocking=False):
            return  # already leaving
        self._stop.set()
        self._fault = record
        self._state = FAULT
        if not declared:
            log.error(
                "watchdog: %s declared a fault (%s) in this launch: %s; leaving",
                record.by,
                record.kind,
                record.why,
            )
        with contextlib.suppress(OSError):
            write_beat(self.launch.beat(self.me.rank), self._beat())
        self._write_stacks(record, declared=declared)
        if self.rescue is not None:
            self.phase, self.since = RESCUE_PHASE, self._clock()
            with contextlib.suppress(OSError):
                write_beat(self.launch.beat(self.me.rank), self._beat())
            try:
                self.rescue(record)
            except Exception:  # the way out must stay open
                log.exception("watchdog: the survivor's save failed")
        for hook in self.before_exit:
            with contextlib.suppress(Exception):
                hook()
        code = FAULT_EXIT_CODE if declared else PEER_FAULT_EXIT_CODE
        self._state, self._code = EXITED, code
        self._error = f"{record.kind} declared by {record.by}: {record.why}"
        with contextlib.suppress(OSError):
            write_beat(self.launch.beat(self.me.rank), self._beat())
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        self._exit(code)
        self._gone.set()  # only where ``exit`` returns (a test)

    def _write_stacks(self, record: FaultRecord, *, declared: bool) -> None:
        """Every thread's stacks to hpc-ddp's stacks file; a hang's main thread to stderr.

        The program's stderr gets only what concerns the program: where its main thread
        stood when a hang or an overrun start-up ended the launch (its own code, or the
        collective it waits in), which is what the user needs to find a hang. Not after a
        crash: the culprit's traceback already says it, and a survivor's main thread only
        waited for it. Not in a ``command:`` task's parent either: its main thread is
        hpc-ddp's wait for the child, not the user's code. hpc-ddp's own threads never go
        there (:func:`install_stack_dump`)."""
        path = self.launch.stacks(self.me.rank)
        how = "declared" if declared else "adopted"
        with contextlib.suppress(Exception), open(path, "a", encoding="utf-8") as stacks:
            stacks.write(
                f"hpc-ddp watchdog: rank {self.me.rank} leaving for a {record.kind} it "
                f"{how} ({record.why}); every thread, most recent call first:\n"
            )
            stacks.flush()
            faulthandler.dump_traceback(file=stacks, all_threads=True)
        if record.kind not in ("hang", "startup") or self.child is not None:
            return
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        if frame is None:
            return
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"hpc-ddp watchdog: rank {self.me.rank}'s main thread when the launch ended "
                f"({record.kind}), most recent call first (every thread: {path}):\n"
                + "".join(reversed(traceback.format_stack(frame)))
            )
            sys.stderr.flush()


def ring_peers(me: Identity) -> list[int]:
    """The two ranks after ``me`` in the ring (fewer in a smaller world): whose beats it reads."""
    return sorted({(me.rank + d) % me.world for d in (1, 2)} - {me.rank})


def declared_fault(
    launch: LaunchPaths, peers: Sequence[int], supervised: bool, since: float
) -> FaultRecord | None:
    """A fault the supervisor (or, unsupervised, the fault record) or one of ``peers``
    declared in ``launch`` since ``since``: a record from before belongs to an earlier run of
    the same launch key."""
    found: list[FaultRecord | None] = []
    if supervised:
        beat = read_beat(launch.supervisor)
        found.append(beat.fault if beat is not None else None)
    else:
        found.append(read_fault(launch.fault))
    for peer in peers:
        beat = read_beat(launch.beat(peer))
        found.append(beat.fault if beat is not None else None)
    fresh = [f for f in found if f is not None and f.time >= since - 1.0]
    return fresh[0] if fresh else None


def _proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``T``: stopped), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[0]


def wanted(cfg: FaultConfig, env: Mapping[str, str], dist: DistEnv) -> bool:
    """Whether a rank runs a watchdog: ``fault.enabled``, under a supervisor or with peers to
    watch (a lone process without a supervisor gains nothing from being ended), and not the
    child of a ``command:`` task whose parent already beats for it."""
    watched = dist.supervised or dist.world_size > 1
    return cfg.enabled and watched and not env.get(WATCHDOG_OWNER_ENV)


def launch_paths(run_dir: Path, env: Mapping[str, str], dist: DistEnv) -> LaunchPaths:
    """This launch's directory: the supervisor's (``HPC_DDP_LAUNCH_DIR``), else
    ``RUN_DIR/launches/<job>.<restart>.<launch>`` (a rank started without one: torchrun, srun
    by hand; a record left there by an earlier run is told apart by its time)."""
    given = env.get(LAUNCH_DIR_ENV)
    if given:
        return LaunchPaths(Path(given))
    job = dist.job_ref or env.get("TORCHELASTIC_RUN_ID")
    return RunPaths(run_dir).launch(launch_key(job, dist.restart_count, dist.launch))


def start_watchdog(
    cfg: FaultConfig, run_dir: Path, env: Mapping[str, str], dist: DistEnv
) -> tuple[Watchdog | None, bool]:
    """This process's watchdog: the running one, else one started now if :func:`wanted`;
    and whether it was started here (its starter stops it)."""
    running = current()
    if running is not None:
        return running, False
    if not wanted(cfg, env, dist):
        return None, False
    me = Identity(dist.rank, dist.world_size, dist.node_name or "local", dist.step_id)
    paths = launch_paths(run_dir, env, dist)
    return Watchdog(cfg, paths, me, supervised=dist.supervised).start(), True
