"""A launch's standby: the next launch's processes, started early, imported, waiting.

A cold restart spends seconds before its first step that have nothing to do with the fault:
Python's start, ``import torch`` and the ``torch._dynamo`` that DDP's constructor imports to
read one setting (1.7 s and 1.5-2 s of CPU on this project's test machine). Under
``fault.standby`` the supervisor starts the *next* launch's processes once a launch has trained
``fault.standby_after_s`` (so a short job never pays, and their imports never compete with the
launch's own start-up): the same shape and nodes, ``--overlap``, with the next launch's
environment and :data:`~hpc_ddp.rundir.layout.STANDBY_ENV`. Each one loads its imports and
waits on the launch directory's call file (:attr:`~hpc_ddp.rundir.layout.LaunchPaths.standby_call`).

After a fault, a restart of the same shape (a dead, crashed or hung rank: the same nodes) is
*called*: the file says ``go`` and the processes run on as a cold launch would, from the
newest checkpoint (the survivor's save). Any other next step (fewer nodes, a requeue, the
job's end) *dismisses* them: ``dismiss``, and each exits 0 without a word. A standby whose step
has ended or lost a node is never called.

When a fault is found the supervisor guesses the next launch's shape at once
(:func:`~hpc_ddp.fault.plan.likely_exclusion`) and :meth:`Standby.prepare` makes the standby
that shape: a lost node's launch on the spare node, or a launch faulted before its standby
was due. Its processes load while the failed launch is ended and its survivors save, so a
restart onto a spare node no longer waits for a cold start after all that. Each standby
started for one launch has a call file of its own: a dismissed one never reads the next one's
``go``.

The call file is made (``wait``) before the standby starts and rewritten in place, one
fixed-size record, like a beat: a reader on NFS never caches a missing file, and a rename's new
inode never hides behind an old file handle.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar, cast

from hpc_ddp.backends.base import LaunchShape
from hpc_ddp.config.model import JobConfig
from hpc_ddp.fault.blame import Beat
from hpc_ddp.rundir.layout import STANDBY_ENV

log = logging.getLogger("hpc_ddp.supervisor")

Word = Literal["wait", "go", "dismiss"]
CALL_BYTES = 16
"""The call file's size: every word, padded (rewritten in place with one ``pwrite``)."""
CALL_POLL_S = 0.02
"""How often a waiting standby process reads its call file."""
DISMISS_WAIT_S = 2.0
"""How long a dismissed standby has to exit before its step is ended."""

called_at: float | None = None
"""When this process, a standby, was called (wall clock): its launch's start-up counts from
here, not from the process's start (:class:`~hpc_ddp.sessions.startup.StartupMarks`)."""


def write_call(path: Path, word: Word) -> None:
    """Rewrite ``path`` in place with ``word`` (made if missing)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, word.encode().ljust(CALL_BYTES - 1) + b"\n", 0)
    finally:
        os.close(fd)


def read_call(path: Path) -> Word | None:
    """The word in ``path``; None while there is none (missing, blank, unreadable)."""
    try:
        with open(path, "rb") as f:
            word = f.read(CALL_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None
    return cast(Word, word) if word in ("wait", "go", "dismiss") else None


def wait_to_be_called(
    path: Path, *, poll_s: float = CALL_POLL_S, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """Block until ``path`` says ``go`` (True) or ``dismiss`` (False).

    Slurm's warning signals (USR1, USR2) are ignored while waiting: they are the running
    launch's business, and their default action would end this process. A process whose parent
    changed (the local supervisor died) is dismissed.
    """
    global called_at
    parent = os.getppid()
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        while True:
            word = read_call(path)
            if word in ("go", "dismiss"):
                called_at = time.time() if word == "go" else None
                return word == "go"
            if os.getppid() != parent:
                return False
            sleep(poll_s)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def standby_fits(cfg: JobConfig) -> bool:
    """Whether ``cfg``'s launches may have a standby: ``fault.standby``, and ranks that are
    this process's own (a ``command`` or torchrun's workers are other programs)."""
    return cfg.fault.standby and not cfg.command and cfg.dist.launcher != "torchrun"


class StandbyStep(Protocol):
    """What the standby reads of a launch's step (the supervisor's ``Step``)."""

    def poll(self) -> int | None: ...
    def node_failures(self) -> list[tuple[str, str]]: ...
    def refused(self) -> str | None: ...
    def abandon(self) -> None: ...


StepT = TypeVar("StepT", bound=StandbyStep)
StepT_co = TypeVar("StepT_co", bound=StandbyStep, covariant=True)


class StandbyLauncher(Protocol[StepT_co]):
    """What the standby asks of the supervisor's launcher."""

    def start(self, plan: LaunchShape, env: Mapping[str, str]) -> StepT_co: ...


class NumberedShape(LaunchShape, Protocol):
    """A launch's shape and its number (the supervisor's ``Plan``)."""

    @property
    def launch(self) -> int: ...


class Standby(Generic[StepT]):
    """The supervisor's one standby at a time (see the module docstring)."""

    def __init__(self, launcher: StandbyLauncher[StepT], *, enabled: bool, after_s: float) -> None:
        self.launcher = launcher
        self.enabled = enabled
        self.after_s = after_s
        self.shape: NumberedShape | None = None
        self.step: StepT | None = None
        self.call_file: Path | None = None
        self.started_at: float | None = None
        self._armed: NumberedShape | None = None
        self._next: tuple[dict[str, str], Path] | None = None
        self._starts = 0
        self._training_since: float | None = None

    def arm(self, shape: NumberedShape, env: Mapping[str, str], call_file: Path) -> None:
        """A launch began: its standby, when due, is ``shape`` with ``env`` (the next
        launch's), waiting on ``call_file``."""
        self._armed, self._next, self._starts = shape, (dict(env), call_file), 0
        self._training_since = None

    def tend(self, beats: Mapping[int, Beat | None], mono: float, *, settled: bool) -> None:
        """Start the armed standby once every rank has trained ``after_s`` in this launch
        (``beats``: every rank's, read at ``mono``), while the launch is ``settled`` (no
        fault found, no stop asked)."""
        if not settled or not self.enabled or self.step is not None or self._armed is None:
            return
        if not beats or any(b is None or b.launch_steps < 1 for b in beats.values()):
            return
        if self._training_since is None:
            self._training_since = mono
        if mono - self._training_since >= self.after_s:
            self._start_armed(self._armed)

    def prepare(self, shape: NumberedShape, alloc: Sequence[str] = ()) -> None:
        """A fault was found and the next launch will most likely be ``shape`` (``alloc``: the
        allocation's nodes now): start its processes at once, so they load while the failed
        launch is ended, unless the standby already has that place. One of another place is
        dismissed first."""
        if not self.enabled or self._next is None or self._next_launch() != shape.launch:
            return
        if (
            self.step is not None
            and self.shape is not None
            and _same_place(self.shape, shape, alloc)
        ):
            return
        self.dismiss()
        log.info("supervisor: launch %d's processes started now, for the restart", shape.launch)
        self._start_armed(shape)

    def _next_launch(self) -> int | None:
        armed = self._armed or self.shape
        return armed.launch if armed is not None else None

    def _start_armed(self, shape: NumberedShape) -> None:
        assert self._next is not None
        env, call_file = self._next
        self._armed = None
        self._starts += 1
        if self._starts > 1:  # never the file a dismissed standby of this launch still reads
            call_file = call_file.with_name(f"{call_file.stem}-{self._starts}{call_file.suffix}")
        self.start(shape, env, call_file)

    def start(self, shape: NumberedShape, env: Mapping[str, str], call_file: Path) -> None:
        """Start ``shape``'s processes with ``env`` (the next launch's), waiting on
        ``call_file``. A standby that cannot start is only logged: restarts start cold."""
        call_file.parent.mkdir(parents=True, exist_ok=True)
        write_call(call_file, "wait")
        self.shape, self.call_file, self.started_at = shape, call_file, time.monotonic()
        try:
            self.step = self.launcher.start(shape, {**env, STANDBY_ENV: str(call_file)})
        except Exception as exc:  # a standby is an optimisation, never a reason to fail
            log.warning("supervisor: could not start the next launch's standby: %s", exc)
            self.enabled = False
            self._forget()
            return
        log.info("supervisor: launch %d's processes started on standby", shape.launch)

    def call(self, plan: NumberedShape, alloc: Sequence[str] = ()) -> StepT | None:
        """The standby's step, told ``go``, when it was started for this very launch, in its
        place (``alloc``: the allocation's nodes now), and is intact; else None (and it is
        dismissed)."""
        step, shape, call_file = self.step, self.shape, self.call_file
        if step is None or shape is None or call_file is None:
            return None
        fits = (
            _same_place(shape, plan, alloc)
            and step.poll() is None and not step.node_failures() and step.refused() is None
        )  # fmt: skip
        if not fits:
            log.info("supervisor: launch %d starts cold: its standby does not fit", plan.launch)
            self.dismiss()
            return None
        write_call(call_file, "go")
        log.info("supervisor: launch %d: its standby processes called", plan.launch)
        self._forget()
        return step

    def dismiss(self) -> None:
        """Tell the standby's processes to exit, and leave its step to srun if it has not
        ended within :data:`DISMISS_WAIT_S` (in the background: a cold launch never waits)."""
        step, call_file = self.step, self.call_file
        self._forget()
        if step is None or call_file is None:
            return
        write_call(call_file, "dismiss")
        threading.Thread(target=_end_dismissed, args=(step,), daemon=True).start()

    def _forget(self) -> None:
        self.step, self.shape, self.call_file, self.started_at = None, None, None, None


def _same_place(a: NumberedShape, b: NumberedShape, alloc: Sequence[str]) -> bool:
    """Whether ``a`` and ``b`` are one launch in one place: the same launch, node count and
    tasks, leaving out the same nodes of ``alloc`` (a node Slurm has dropped from the job is
    left out either way; without ``alloc``, the same exclusions)."""
    if (a.launch, a.nodes, a.tasks_per_node) != (b.launch, b.nodes, b.tasks_per_node):
        return False
    if not alloc:
        return set(a.exclude) == set(b.exclude)
    return {n for n in a.exclude if n in alloc} == {n for n in b.exclude if n in alloc}


def _end_dismissed(step: StandbyStep) -> None:
    # Never killed: a step that lost a node stays in srun until Slurm settles the node, and
    # ending it by a step id guessed from the job's newest steps once killed the launch that
    # had just started beside it. Its live processes leave on the word; the job's end reaps it.
    deadline = time.monotonic() + DISMISS_WAIT_S
    while step.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if step.poll() is None:
        step.abandon()
