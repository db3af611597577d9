"""A local run's stop: a cancel that waits until every process of the run has ended, killing
those that outlast the grace, and a forced stop (a second Ctrl-C); what each lost.

:func:`stop_local` is the local backend's cancel: the SIGTERM a cancel gives
(:func:`~hpc_ddp.backends.local.process.cancel_local`: the ranks agree on a step, rank 0
saves), then, after ``--kill-wait``, SIGKILL for whatever of the run still runs, as Slurm's
``KillWait``. :func:`force_stop` kills at once. A killed rank writes nothing, so both record the
attempt's end in the ledger themselves (``cancelled``, with what was lost: :class:`ForcedStop`).
Every signal goes only to a process that provably is the run's
(:mod:`hpc_ddp.backends.local.process`).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.backends.local.process import (
    IDENTITY_FILE,
    KILL_WAIT_S,
    LocalCancel,
    ProcIdentity,
    cancel_local,
    describe_processes,
    live_ranks,
    run_processes,
    signal_if_same,
)
from hpc_ddp.durable import append_line
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.checkpoints import newest_checkpoint
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import Checkpoint, RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.ledger_events import LaunchId, end_event
from hpc_ddp.rundir.metrics import drop_replayed
from hpc_ddp.rundir.run_id import recorded_run_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForcedStop:
    """What a forced stop killed, and what it lost."""

    ranks: list[int]
    """The rank processes killed (those still running)."""
    reached: int | None
    """The last step training logged (``metrics.jsonl``); None when it logged none."""
    checkpoint: Checkpoint | None
    """The newest checkpoint on disk that looks whole, as listed (a file ``step-N.pt`` or a
    shard set ``step-N``, :func:`~hpc_ddp.rundir.checkpoints.newest_checkpoint`): the run goes
    on from there."""

    def lost(self) -> str:
        """What was lost, in words: the steps since the newest checkpoint."""
        if self.reached is None:
            return "no step was logged, so none is known lost"
        if self.checkpoint is None:
            return f"no checkpoint was saved: the {self.reached} step(s) trained are lost"
        lost = max(0, self.reached - self.checkpoint.step)
        return (
            f"training had logged step {self.reached}; the {lost} step(s) after checkpoint "
            f"{self.checkpoint.name} are lost"
        )


def force_stop(run_dir: Path, job_id: str | None, since: float) -> ForcedStop:
    """Stop a local run at once (a second Ctrl-C): SIGKILL its ranks, then its controller and
    every other process of its session (a ``command``'s children), each only while it
    provably is this run's, and record the attempt's end.

    A killed rank writes nothing, so the attempt's end is written here, as the ``hpc_ddp run``
    parent writes a killed child's: ``cancelled`` (a person stopped it), with what was lost.
    ``since``: when this job was started (its attempt is the one that started since).
    """
    forced = _kill_all(run_dir, job_id)
    _record_forced_end(RunPaths(run_dir), since, forced, "forced by a second Ctrl-C")
    return forced


def _kill_all(run_dir: Path, job_id: str | None) -> ForcedStop:
    """SIGKILL every process of the run still running (:func:`run_processes`), ranks first;
    what that lost."""
    ranks = [r for r, ident in live_ranks(run_dir).items() if signal_if_same(ident, signal.SIGKILL)]
    for ident in run_processes(run_dir, job_id):
        signal_if_same(ident, signal.SIGKILL)
    paths = RunPaths(run_dir)
    logged = [r["step"] for r in _metric_rows(paths.metrics) if isinstance(r.get("step"), int)]
    newest = newest_checkpoint(paths.checkpoints, run_id=recorded_run_id(paths))
    return ForcedStop(ranks, max(logged) if logged else None, newest)


GONE_WAIT_S = 10.0
"""After the SIGKILL, how long ``cancel`` waits to see every process gone (the kernel ends a
killed process at once unless it is stuck in the kernel, e.g. on a dead file system)."""


def stop_local(
    run_dir: Path, job_id: str | None, *, kill_wait_s: float = KILL_WAIT_S, poll_s: float = 0.1
) -> LocalCancel:
    """Cancel a local run and wait until every process of it has ended.

    :func:`cancel_local` sends the SIGTERM (the stop a cancel gives); then this waits up to
    ``kill_wait_s`` for the controller, the ranks and every other process of the run's
    session (:func:`run_processes`) to end, SIGKILLs those still running, records the
    attempt's end (a killed rank writes none) and waits again, :data:`GONE_WAIT_S`. It says
    ``cancelled`` only once nothing of the run runs; else ``still_running``, naming what does.
    """
    said = cancel_local(run_dir, job_id)
    if said.outcome != "cancelled":
        return said
    began = time.monotonic()
    stubborn = _wait_gone(run_dir, job_id, began + kill_wait_s, poll_s)
    if not stubborn:
        took = time.monotonic() - began
        return LocalCancel("cancelled", f"{said.message}; every process ended in {took:.1f} s")
    forced = _kill_all(run_dir, job_id)
    why = f"killed by cancel: still running {kill_wait_s:g} s after SIGTERM"
    _record_forced_end(RunPaths(run_dir), _job_started(run_dir), forced, why)
    left = _wait_gone(run_dir, job_id, time.monotonic() + GONE_WAIT_S, poll_s, kill=True)
    if not left:
        return LocalCancel(
            "cancelled",
            f"{said.message}; killed after {kill_wait_s:g} s: {len(stubborn)} process(es) "
            f"still ran after SIGTERM (pid {', '.join(str(i.pid) for i in stubborn)}) and were "
            f"sent SIGKILL; {forced.lost()}",
        )
    return LocalCancel(
        "still_running",
        f"{run_dir}: local job {job_id} still runs after SIGTERM and, {kill_wait_s:g} s later, "
        f"SIGKILL: {describe_processes(left)}. HINT: a process that survives SIGKILL is stuck "
        "in the kernel (a dead file system, a device): `ps -o pid,stat,wchan -p PID` says where.",
    )


def _wait_gone(
    run_dir: Path, job_id: str | None, deadline: float, poll_s: float, *, kill: bool = False
) -> list[ProcIdentity]:
    """Poll until no process of the run runs, or ``deadline``: those still running ([]).
    ``kill``: SIGKILL each one seen (a process started meanwhile, e.g. by a supervisor not yet
    killed, dies too)."""
    while True:
        left = run_processes(run_dir, job_id)
        if not left or time.monotonic() >= deadline:
            return left
        if kill:
            for ident in left:
                signal_if_same(ident, signal.SIGKILL)
        time.sleep(poll_s)


def _job_started(run_dir: Path) -> float:
    """When the run's current local job was started: ``local.json`` is written just after its
    controller starts, before any rank writes an attempt (0 when there is none)."""
    try:
        return (run_dir / IDENTITY_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _metric_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` that count (:func:`drop_replayed`); [] if unreadable."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return drop_replayed(rows)


def _record_forced_end(paths: RunPaths, since: float, forced: ForcedStop, why: str) -> None:
    """The attempt's end, unless it has one (rank 0 may have written it just before) or none
    started (killed before the session wrote a start: there is no attempt to end)."""
    try:
        attempts = read_ledger(paths.ledger)
    except RunDirError as exc:
        log.warning("%s", exc)
        return
    mine = [a for a in attempts if a.started >= since]
    if not mine or not mine[-1].is_open:
        return
    last = mine[-1]
    checkpoint = None if forced.checkpoint is None else forced.checkpoint.name
    restart = last.attempt if last.restart is None else last.restart
    line = end_event(
        attempt=last.attempt,
        launch_id=LaunchId(last.job_id, last.job_ref, restart, last.launch),
        cause=EndCause.CANCELLED,
        steps_done=forced.reached,
        checkpoint=checkpoint,
        requeue_requested=False,
        message=f"{why}: the ranks were killed; {forced.lost()}",
    )
    append_line(paths.ledger, line)
