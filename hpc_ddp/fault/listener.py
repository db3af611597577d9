"""A ``command:`` child's ear for its launch's fault (:class:`FaultListener`).

The child runs no watchdog: its parent, ``hpc-ddp run``, beats for it and ends it when the
launch ends (:mod:`hpc_ddp.fault.watchdog`). But the child's session holds the training state,
so the survivor's save (:mod:`hpc_ddp.fault.rescue`) is made here, when the launch's fault is
declared. The launch numbers its ranks by task; a child that runs several ranks of a task
(torchrun's workers) maps each record onto its own ranks first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.exitcodes import PEER_FAULT_EXIT_CODE
from hpc_ddp.fault.blame import FaultRecord
from hpc_ddp.fault.watchdog import Identity, declared_fault, ring_peers
from hpc_ddp.rundir.layout import LaunchPaths

log = logging.getLogger(__name__)

TORCHRUN_END_S = 10.0
"""How much longer a torchrun worker that lost a peer waits for the launch's fault than a
rank of its own task does: torchrun's time to end a failed node's workers."""

__all__ = ["FaultListener"]


class FaultListener:
    """The ear of a ``command:`` child's session for its launch's fault.

    The child has no watchdog (its parent, ``hpc-ddp run``, beats for it and ends it when the
    launch ends); but the child holds the training state, so a survivor's save
    (:mod:`hpc_ddp.fault.rescue`) must run here. Once :meth:`start` ed, a thread reads what the
    watchdog reads for a declared fault, once a beat; on one it runs ``on_fault`` and ends the
    process with the peer-fault code. :meth:`start` writes the rescue note that tells the
    parent to let this process finish before ending it.

    ``me`` is the parent's task (the launch's numbering: beats, fault records, rescue notes);
    ``per_task``: the program's ranks in each task (torchrun's workers), onto which a record's
    ranks are mapped before ``on_fault`` sees it (:meth:`FaultRecord.for_program`).
    """

    def __init__(
        self,
        cfg: FaultConfig,
        launch: LaunchPaths,
        me: Identity,
        *,
        supervised: bool,
        per_task: int = 1,
        exit: Callable[[int], NoReturn] = os._exit,
    ) -> None:
        self.cfg, self.launch, self.me, self.supervised = cfg, launch, me, supervised
        self.per_task = per_task
        self.on_fault: Callable[[FaultRecord], bool] | None = None
        self._exit = exit
        self._peers = ring_peers(me)
        self._since = time.time()
        self._gone = threading.Event()
        self._saving = False
        self._thread: threading.Thread | None = None

    def start(self, on_fault: Callable[[FaultRecord], bool]) -> None:
        """Listen, and run ``on_fault`` (on this thread) when a fault is declared: True when
        this process made the rescue (or tried) and is to end now; False leaves it to its
        parent, which ends it as before."""
        if self._thread is not None:
            return
        self.on_fault = on_fault
        with contextlib.suppress(OSError):
            self.launch.rescue_note(self.me.rank).write_text(f"{os.getpid()}\n")
        self._thread = threading.Thread(target=self._run, name="hpc-ddp-fault-ear", daemon=True)
        self._thread.start()

    def lost_peer(self) -> None:
        """The main thread lost a peer: wait for the fault to be declared and this process to
        end after the rescue (or, if none is declared, go on leaving).

        A SIGTERM ends the wait unless this process is saving: its own launcher is ending it
        (torchrun, whose other worker failed, ends its node's workers and waits for them before
        its task can tell the launch; or a stop forwarded by the parent)."""
        if self._thread is None:
            return
        wait_s = self.cfg.stale_s + 3 * self.cfg.beat_s
        if self.per_task > 1:
            # The failed node's torchrun ends its other workers before its task can claim the
            # fault: seconds more on a busy machine (5.5 s after the kill was seen on CI's).
            wait_s += TORCHRUN_END_S
        if threading.current_thread() is not threading.main_thread():
            self._gone.wait(wait_s)
            return
        before = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._woken)
        try:
            self._gone.wait(wait_s)
        finally:
            signal.signal(signal.SIGTERM, before)

    def _woken(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM during :meth:`lost_peer`: stop waiting, unless saving."""
        del signum, frame
        if not self._saving:
            self._gone.set()

    def _run(self) -> None:
        while True:
            time.sleep(self.cfg.beat_s)
            try:
                record = declared_fault(self.launch, self._peers, self.supervised, self._since)
            except Exception:  # a bad file: listen on
                continue
            if record is None:
                continue
            done = True
            if self.on_fault is not None:
                self._saving = True  # and so it stays if it saved: the process ends next
                try:
                    done = self.on_fault(record.for_program(self.per_task))
                except Exception:
                    log.exception("the survivor's save failed")
            if not done:
                self._saving = False
                return  # not the survivor that saves: the parent ends this process
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            self._exit(PEER_FAULT_EXIT_CODE)
            self._gone.set()  # only where ``exit`` returns (a test)
            return
