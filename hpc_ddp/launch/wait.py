"""Waiting for launched runs to end (``--wait``): Slurm jobs politely, local runs by their
processes.

Polls of Slurm start fast (short jobs end in about a second) and back off, asking squeue only
for the jobs waited on, so a long wait costs slurmctld one small query every 15 s. A local run
is followed through rank 0's log, its progress printed as it comes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.errors import SlurmError
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.jobstate import JobInfo, JobState
from hpc_ddp.state.report import reason_lines, run_status
from hpc_ddp.state.verdict import SlurmView

if TYPE_CHECKING:
    from hpc_ddp.launch.submission import Launched

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
    client: SlurmClient,
    job_ids: Sequence[str],
    *,
    run_dirs: Sequence[Path] = (),
    first_poll_s: float = FIRST_POLL_S,
    max_poll_s: float = MAX_POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until every job has finished; 0 when all completed.

    With ``run_dirs`` (one per job), "completed" also needs the run's ledger to say finished,
    and the state printed is the one ``status`` shows, followed by the lines ``status`` prints
    under its table: the rank that failed first and why.
    """
    # squeue keeps finished jobs listed for MinJobAge: wait for a finished state, not absence.
    delay = first_poll_s
    while True:
        live = client.job_states(job_ids)
        if all(info.state.finished for info in live.values()):
            break
        sleep(delay)
        delay = min(max_poll_s, delay * 1.5)
    missing = [j for j in job_ids if job_state_of(live, j) is None]
    try:
        accounting = client.sacct_states(missing) if missing else {}
    except SlurmError:
        accounting = None
    view = SlurmView(live, accounting=accounting)
    states = []
    reasons: list[str] = []
    for i, job in enumerate(job_ids):
        if i < len(run_dirs):
            row = run_status(run_dirs[i], view)
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


def wait_for(launched: Launched, client: SlurmClient) -> int:
    """Wait until the launched run has ended; 0 when it completed, else 1 (with the reason
    lines ``status`` prints)."""
    if launched.local is None:
        return wait_for_jobs(client, [launched.job_id], run_dirs=[launched.paths.root])
    from hpc_ddp.local.backend import wait_local
    from hpc_ddp.local.process import was_cancelled

    paths = launched.paths
    result = wait_local(
        launched.local, follow=paths.rank_log(0, "err"), follow_from=launched.follow_from
    )
    cancelled = was_cancelled(paths.root)
    print(result.describe(cancelled), file=sys.stderr)
    if result.state(cancelled) == "FAILED":
        print(f"  logs: {paths.logs}/rank-N.err (tracebacks)", file=sys.stderr)
    return 0 if result.state(cancelled) == "COMPLETED" else 1
