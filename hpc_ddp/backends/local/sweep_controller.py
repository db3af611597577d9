"""A sweep on this machine: every point a local run, ``max_parallel`` at once (default 1).

The sweep directory is the one a Slurm sweep writes (``sweep.yaml``, ``task_configs.jsonl``,
``tasks/<i>/``), so ``status``, ``results``, ``logs --task`` and ``--resubmit-failed`` read it
alike. What stands in for the job array is the *sweep controller*: one process, started here
and detached from the caller (it holds no terminal and none of the caller's pipes: a script's
``$(hpc-ddp sweep ... --json)`` returns at once), that starts each point as a local run in its
task directory with the local backend's own launch (:func:`hpc_ddp.submission.submit.start`,
so each point is what ``submit --backend local`` would start: its ranks, their identities, its
``manifest.json``), waits for it, and starts the next.

Its identity goes to ``SWEEP_DIR/local.json`` (:mod:`hpc_ddp.backends.local.process`), its command
line naming its points, so that a point it has yet to start reads ``pending`` while it lives, and
``cancelled`` or ``failed`` (never started) once it has gone; its own log is
``SWEEP_DIR/logs/local-sweep.log``. A SIGTERM (a cancel) starts no further point and cancels
the running ones, each stopping at an agreed step with a checkpoint, as a local run's cancel
does.

Why a process of its own, started with ``Popen``, rather than a submitit job like a run's
controller: its job is only to wait and start the next point, which needs no task wrapper, and
it must not hold the caller's stdout (submitit's controller inherits it: the issue the local
backend's own detachment addresses). Each point, though, is started by the local backend's
launch itself, so whatever that does for a run it does for a point.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from hpc_ddp.backends.local.process import identify, identify_started, read_identity, write_identity
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.layout import RunPaths

if TYPE_CHECKING:
    from hpc_ddp.backends.local.controller import LocalJob
    from hpc_ddp.backends.local.process import LocalCancel

log = logging.getLogger(__name__)

CONTROLLER_LOG = "local-sweep.log"
"""The sweep controller's own log, in ``SWEEP_DIR/logs/``."""
DEFAULT_LOCAL_PARALLEL = 1
"""Points at once on this machine when the sweep sets no ``max_parallel``: every point is a
whole set of ranks, and two sets on one laptop slow each other down."""
POLL_S = 0.5

_STARTED: list[subprocess.Popen[bytes]] = []
"""Controllers this process started: kept so that none is reaped by garbage collection while
it runs (``Popen.__del__`` warns), and collected once it has exited (:func:`_reap`)."""


CONTROLLER_MODULE = "hpc_ddp.backends.local.sweep_controller"
"""The module the controller runs as (``python -m``): its command line names its points after
it."""


def local_parallel(max_parallel: int | None) -> int:
    """How many points a local sweep runs at once."""
    return max_parallel or DEFAULT_LOCAL_PARALLEL


def controller_command(sweep_dir: Path, points: Sequence[int], parallel: int) -> list[str]:
    """The sweep controller's command line."""
    listed = ",".join(str(p) for p in points)
    return [sys.executable, "-m", CONTROLLER_MODULE, str(sweep_dir), listed, str(parallel)]


def start_controller(sweep_dir: Path, points: Sequence[int], parallel: int) -> str:
    """Start the sweep controller for ``points`` and return its pid (the sweep's job id).

    Detached: its stdin is /dev/null, its stdout and stderr its log, and it leads a session of
    its own, so neither a caller waiting on its output nor a Ctrl-C at the caller's terminal
    reaches it (``hpc-ddp cancel SWEEP_DIR`` stops it).
    """
    logs = RunPaths(sweep_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / CONTROLLER_LOG).open("ab") as out:
        proc = subprocess.Popen(
            controller_command(sweep_dir, points, parallel),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _STARTED.append(proc)
    ident = identify_started(proc.pid)
    if ident is not None:
        write_identity(sweep_dir, ident)
    return str(proc.pid)


def _reap() -> None:
    """Collect the controllers this process started that have exited (no zombie lingers in a
    notebook that started a sweep)."""
    _STARTED[:] = [p for p in _STARTED if p.poll() is None]


def controller_alive(sweep_dir: Path) -> bool:
    """True while the sweep's controller (recorded in ``local.json``) still runs as recorded
    (a zombie, or another process that got its pid, does not match the record)."""
    return controller_points(sweep_dir) is not None


def controller_points(sweep_dir: Path) -> frozenset[int] | None:
    """The points the sweep's live controller runs (from its recorded command line); None
    when no controller runs."""
    _reap()
    expected = read_identity(sweep_dir)
    if expected is None or identify(expected.pid) != expected:
        return None
    try:
        listed = expected.cmdline[expected.cmdline.index(CONTROLLER_MODULE) + 2]
        return frozenset(int(p) for p in listed.split(",") if p)
    except (ValueError, IndexError):
        return frozenset()


def cancel_local_sweep(sweep_dir: Path) -> LocalCancel:
    """Cancel a local sweep and wait until it has stopped, as a local run's cancel waits.

    Its controller, while it runs as recorded, gets the SIGTERM: it starts no further point and
    stops the running ones (:func:`~hpc_ddp.backends.local.stop.stop_local`: each at an agreed
    step with a checkpoint, SIGKILLed after the grace), then exits; a controller still there past
    :func:`_stop_deadline_s` is SIGKILLed. Any point still running without it is stopped the
    same way. Points not started are then ``cancelled`` (``--resubmit-failed`` starts them).
    """
    from hpc_ddp.backends.local.process import LocalCancel, mark_cancelled, signal_if_same

    expected = read_identity(sweep_dir)
    live = expected is not None and identify(expected.pid) == expected
    mark_cancelled(sweep_dir)
    said = []
    if live and expected is not None and signal_if_same(expected, signal.SIGTERM):
        deadline = time.monotonic() + _stop_deadline_s()
        while controller_alive(sweep_dir) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if controller_alive(sweep_dir):
            signal_if_same(expected, signal.SIGKILL)
            said.append(f"its controller {expected.pid} was killed after {_stop_deadline_s():g} s")
        else:
            said.append(f"its controller {expected.pid} stopped the running points and exited")
    stopped, left = _stop_points(sweep_dir)
    if stopped:
        said.append(f"stopped point(s) {', '.join(stopped)}")
    if left:
        return LocalCancel(
            "still_running",
            f"{sweep_dir}: point(s) {', '.join(left)} of the local sweep still run after "
            "SIGTERM and SIGKILL. HINT: `hpc-ddp cancel SWEEP_DIR/tasks/N` says which process",
        )
    if said:
        return LocalCancel("cancelled", f"cancelled local sweep {sweep_dir}: {'; '.join(said)}")
    return LocalCancel(
        "already_finished", f"{sweep_dir}: local sweep already ended; nothing was signalled"
    )


def _stop_deadline_s() -> float:
    """How long a cancel waits for the sweep controller: its points' grace and then some."""
    from hpc_ddp.backends.local.process import KILL_WAIT_S
    from hpc_ddp.backends.local.stop import GONE_WAIT_S

    return KILL_WAIT_S + GONE_WAIT_S + 10.0


def _stop_points(sweep_dir: Path) -> tuple[list[str], list[str]]:
    """Stop every point of the sweep still running (:func:`stop_local`); (stopped, left)."""
    from hpc_ddp.backends.local.process import local_alive
    from hpc_ddp.backends.local.stop import stop_local
    from hpc_ddp.rundir.manifest import read_manifest

    stopped: list[str] = []
    left: list[str] = []
    tasks = RunPaths(sweep_dir).tasks
    for task in sorted(tasks.iterdir()) if tasks.is_dir() else []:
        if not (task / "manifest.json").exists():
            continue
        job = read_manifest(task).job_id
        if not local_alive(task, job):
            continue
        outcome = stop_local(task, job).outcome
        (left if outcome == "still_running" else stopped).append(task.name)
    return stopped, left


# --- in the controller --------------------------------------------------------------------------


def start_point(sweep_dir: Path, index: int) -> LocalJob:
    """Start point ``index`` as a local run in ``tasks/<index>``: its config written from the
    packed configs the first time, then the local backend's launch, which records the run's
    ``manifest.json`` (a point started again keeps its earlier job ids)."""
    from hpc_ddp.backends.base import PlanRequest
    from hpc_ddp.backends.local.backend import LocalBackend
    from hpc_ddp.config.load import load_resolved_config
    from hpc_ddp.errors import RunDirError
    from hpc_ddp.rundir.layout import MANIFEST_FILE
    from hpc_ddp.rundir.manifest import read_manifest, record_lock
    from hpc_ddp.rundir.taskconfig import materialise_task_config
    from hpc_ddp.submission.submit import Prepared, make_run_dir, stamp_of, start

    task = RunPaths(sweep_dir).task(index)
    task.root.mkdir(parents=True, exist_ok=True)
    if materialise_task_config(sweep_dir, index) is None:
        raise RunDirError(
            f"{task.root}: point {index} has no config.yaml and no line in "
            f"{RunPaths(sweep_dir).task_configs.name}. HINT: the sweep directory is incomplete"
        )
    cfg = load_resolved_config(task.config)
    make_run_dir(task)
    previous: list[str] = []
    if (task.root / MANIFEST_FILE).exists():
        earlier = read_manifest(task.root)
        previous = [*earlier.previous_jobs, *([earlier.job_id] if earlier.job_id else [])]
    backend = LocalBackend()
    now = datetime.now(timezone.utc)
    invocation = f"hpc-ddp sweep (local): point {index}"
    request = PlanRequest(sys.executable, sweep_dir, invocation, now.isoformat(timespec="seconds"))
    prepared = Prepared(
        cfg, backend, task, backend.plan(cfg, task, request), invocation, str(sweep_dir),
        sweep_dir, stamp_of(now), created=True,
    )  # fmt: skip
    with record_lock(task.root):
        launched = start(prepared, backend, previous_jobs=previous)
    assert launched.local is not None  # a local start
    job: LocalJob = launched.local
    return job


def run_points(sweep_dir: Path, points: Sequence[int], parallel: int) -> int:
    """Run ``points`` in order, ``parallel`` at once, until each has ended; 0 once all ran
    (a point that failed is the sweep's to show, not the controller's to fail on)."""
    from hpc_ddp.backends.local.stop import stop_local

    stopping: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        del frame
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    queue = list(points)
    running: dict[int, LocalJob] = {}
    cancelled = False
    while running or (queue and not stopping):
        while queue and len(running) < parallel and not stopping:
            index = queue.pop(0)
            try:
                running[index] = start_point(sweep_dir, index)
                log.info("point %d started as local job %s", index, running[index].job_id)
            except (HpcDdpError, OSError) as exc:
                log.error("point %d could not start: %s", index, exc)
        if stopping and not cancelled:
            cancelled = True
            for index, job in running.items():
                task = RunPaths(sweep_dir).task(index).root
                log.info("%s", stop_local(task, job.job_id).message)
        for index, job in list(running.items()):
            if job.ended():
                del running[index]
                log.info("point %d ended", index)
        time.sleep(POLL_S)
    if stopping:
        log.info("stopped: point(s) not started: %s", ",".join(map(str, queue)) or "none")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpc_ddp.backends.local.sweep_controller SWEEP_DIR POINTS PARALLEL``: the
    sweep controller."""
    parser = argparse.ArgumentParser(prog=f"python -m {CONTROLLER_MODULE}")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("points", help="comma-separated point indices, in order")
    parser.add_argument("parallel", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    points = [int(p) for p in args.points.split(",") if p]
    # A Ctrl-C meant for the submitting terminal never reaches here (a session of its own);
    # SIGINT is ignored all the same, so that the points' ranks inherit that.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("sweep controller %d: points %s, %d at once", os.getpid(), args.points, args.parallel)
    return run_points(args.sweep_dir, points, max(1, args.parallel))


if __name__ == "__main__":
    sys.exit(main())
