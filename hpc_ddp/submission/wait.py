"""Waiting for launched runs to end (``--wait``): Slurm jobs politely, local runs by their
processes; Ctrl-C on a local run cancels it (an agreed stop and a checkpoint), twice forces it.

Polls of Slurm start fast (short jobs end in about a second) and back off, asking squeue only
for the jobs waited on, so a long wait costs slurmctld one small query every 15 s. A local run
is followed through rank 0's log, its progress printed as it comes.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.jobs import JobInfo, JobState
from hpc_ddp.errors import BackendError
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.state.report import reason_lines, run_status
from hpc_ddp.state.verdict import BackendView, current_attempts, describe_attempt

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend, Backends, Forced, Held
    from hpc_ddp.submission.submit import Launched

FIRST_POLL_S = 0.5
MAX_POLL_S = 15.0
"""Polls start fast (short jobs end in about a second) and back off to this: a long job's
wait then costs slurmctld one small squeue every 15 s."""


def job_state_of(live: dict[str, JobInfo], job_id: str) -> JobState | None:
    """One job's state in squeue's rows; for an array, the first task that did not complete."""
    rows = [i for i in live.values() if job_id in (i.job_id, i.ref, i.array_job_id)]
    if not rows:
        return None
    bad = [i.state for i in rows if i.state is not JobState.COMPLETED]
    return bad[0] if bad else JobState.COMPLETED


def wait_for_jobs(
    backends: Backends,
    job_ids: Sequence[str],
    *,
    run_dirs: Sequence[Path] = (),
    first_poll_s: float = FIRST_POLL_S,
    max_poll_s: float = MAX_POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until every Slurm job has finished (``backends``: where Slurm's backend, and each
    run's, is picked); 0 when all completed.

    With ``run_dirs`` (one per job), "completed" also needs the run's ledger to say finished,
    and the state printed is the one ``status`` shows, followed by the lines ``status`` prints
    under its table: the rank that failed first and why.
    """
    queue: Backend = backends.backend("slurm")
    # squeue keeps finished jobs listed for MinJobAge: wait for a finished state, not absence.
    delay = first_poll_s
    while True:
        live = queue.states(job_ids)
        if all(info.state.finished for info in live.values()):
            break
        sleep(delay)
        delay = min(max_poll_s, delay * 1.5)
    missing = [j for j in job_ids if job_state_of(live, j) is None]
    try:
        accounting = queue.accounting(missing) if missing else {}
    except BackendError:
        accounting = None
    view = BackendView(live, accounting=accounting)
    states = []
    reasons: list[str] = []
    for i, job in enumerate(job_ids):
        if i < len(run_dirs):
            row = run_status(run_dirs[i], view, backends)
            states.append(row["state"])
            reasons.extend(reason_lines(row))  # the same words `status` would print
            continue
        state = job_state_of(live, job)
        record = None if accounting is None else accounting.get(job)
        states.append((state or (record.state if record else JobState.UNKNOWN)).value)
    print(
        f"finished: {', '.join(f'{j} {s}' for j, s in zip(job_ids, states, strict=False))}",
        file=sys.stderr,
    )
    for line in reasons:
        print(line, file=sys.stderr)
    return 0 if all(s == "COMPLETED" for s in states) else 1


def wait_for(launched: Launched, backends: Backends) -> int:
    """Wait until the launched run has ended; 0 when it completed, else 1 (with the reason
    lines ``status`` prints). ``backends``: where the run's backend is picked.

    Ctrl-C on a local run stops it as ``hpc-ddp cancel`` does (the ranks agree on a step, rank
    0 saves a checkpoint, the run ends CANCELLED), says where it stopped and returns 130; a
    second Ctrl-C kills the ranks at once and says what that lost. On Slurm it only stops
    waiting: the job goes on (``hpc-ddp cancel`` stops it).
    """
    if launched.local is None:
        try:
            return wait_for_jobs(backends, [launched.job_id], run_dirs=[launched.paths.root])
        except KeyboardInterrupt:
            root = launched.paths.root
            print(
                f"\nstopped waiting; job {launched.job_id} goes on (`hpc-ddp status {root}`; "
                f"`hpc-ddp cancel {root}` stops it)",
                file=sys.stderr,
            )
            return INTERRUPTED_EXIT_CODE
    paths = launched.paths
    held = backends.held(launched.prepared.backend, launched.local, paths.root, launched.job_id)
    with _CtrlC(launched, held) as ctrl_c:
        result = held.wait(
            follow=paths.rank_log(0, "err"),
            follow_from=launched.follow_from,
            on_poll=ctrl_c.act,
        )
        ctrl_c.act()  # a Ctrl-C in the last poll: the run has ended, nothing more to stop
        row = run_status(paths.root, BackendView({}, accounting={}), backends)  # as `status`
        if ctrl_c.stopping and row["state"] != "COMPLETED":
            print(ctrl_c.outcome(row["state"]), file=sys.stderr)
            return INTERRUPTED_EXIT_CODE
    print(result.describe(row["state"]), file=sys.stderr)
    for line in reason_lines(row):
        print(line, file=sys.stderr)
    if row["state"] == "FAILED":
        print(f"  logs: {paths.logs}/rank-N.err (tracebacks)", file=sys.stderr)
    return 0 if row["state"] == "COMPLETED" else 1


INTERRUPTED_EXIT_CODE = 130
"""Exit status after a Ctrl-C (128 + SIGINT), as a shell reports a command it interrupted."""


class _CtrlC:
    """Ctrl-C while ``--wait`` follows a local run: the first cancels it, the second forces it.

    The handler only counts (printing or signalling inside a handler can interrupt this very
    process's own writes); :meth:`act`, called between polls, does the rest. The run's
    controller and ranks ignore SIGINT (:func:`hpc_ddp.backends.local.controller.submit_local`),
    so the same happens whether Ctrl-C reached the whole process group or this process alone.
    A process started with SIGINT ignored (nohup, a background job) keeps ignoring it.
    ``held``: the run, as this process holds it (its stop and forced stop).
    """

    def __init__(self, launched: Launched, held: Held) -> None:
        self.launched = launched
        self.held = held
        self.count = 0
        self.done = 0
        self.forced: Forced | None = None
        self._previous: Any = None

    def __enter__(self) -> _CtrlC:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _count(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.count += 1

    @property
    def stopping(self) -> bool:
        """True once a Ctrl-C stopped the run (not one that came after it had ended)."""
        return self.done == 1 or self.forced is not None

    def act(self) -> None:
        """Cancel the run at the first Ctrl-C, kill its ranks at the second (at once when both
        came before the first was acted on)."""
        root = self.launched.paths.root
        if self.count == 0 or self.done >= min(self.count, 2):
            return
        if self.done == 0 and self.held.ended():
            self.done = 2  # it ended by itself: nothing to stop
            return
        if self.count >= 2:
            self.done = 2
            print("\nCtrl-C again: killing the ranks now", file=sys.stderr)
            self.forced = self.held.force()  # noted as a person's stop: `status` says CANCELLED
            return
        self.done = 1
        print(
            f"\nCtrl-C: stopping {root} at the next step (the ranks agree on it and rank 0 "
            "saves a checkpoint); Ctrl-C again stops it at once and loses the steps since "
            "the last checkpoint",
            file=sys.stderr,
        )
        self.held.stop()

    def outcome(self, state: str) -> str:
        """The one line that says where the stopped run stands and how to go on."""
        root = self.launched.paths.root
        resume = f"`hpc-ddp resume {root}` goes on"
        forced = self.forced
        if forced is not None and forced.ranks:
            go_on = f"`hpc-ddp resume {root}` starts over"
            if forced.checkpoint is not None:
                go_on = f"{resume} from step {forced.checkpoint.step}"
            return f"{state}: killed by a second Ctrl-C; {forced.lost()}; {go_on}"
        attempts = current_attempts(read_ledger(self.launched.paths.ledger), since=self.since)
        last = attempts[-1] if attempts else None
        if last is None or last.cause is None:
            return f"{state} before it saved anything; `hpc-ddp resume {root}` starts it again"
        if last.cause is not EndCause.CANCELLED:
            return f"{state}: {describe_attempt(last)}; {resume}"
        where = f"cancelled at step {last.steps_done}"
        if last.checkpoint is None:
            return f"{where}; no checkpoint (the job saves none); {resume} from the start"
        return f"{where}; checkpoint {last.checkpoint} kept; {resume}"

    @property
    def since(self) -> float:
        """When this job started: the ledger's entries since are its own."""
        return self.held.started
