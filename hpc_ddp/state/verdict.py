"""A run's state from its two witnesses, Slurm and the ledger: a pure verdict.

Slurm's word comes from squeue (the controller keeps a finished job for ``MinJobAge``), else
from sacct when accounting exists; :class:`BackendView` holds both answers and :class:`Source`
says where a state came from, or why there is none. :func:`judge` then never takes either
witness alone:

- Slurm calls a job COMPLETED when its batch script exited 0. Unless the ledger's last attempt
  ended ``finished``, the run is INCOMPLETE (FAILED when the ledger or the logs name an error).
- A job Slurm has forgotten, with no accounting to ask, has ended, but nobody can say how:
  ``GONE?`` with the last ledger entry, unless the ledger settles it (finished, crash).
- A job that died before its first attempt leaves no ledger entry: its logs say why.
- Without an answer from Slurm at all, the ledger's guess is shown with a ``?``.

What an end cause means (a failure? which state word?) is read from the one table of
:data:`~hpc_ddp.rundir.endcause.END_CAUSES`, so a cause added later changes nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hpc_ddp.backends.jobs import AccountingRecord, JobInfo, JobState
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause, is_failure, meaning


class Source(str, Enum):
    """Where a run's Slurm state came from, or why there is none."""

    SQUEUE = "squeue"
    SACCT = "sacct"
    GONE_NO_ACCOUNTING = "gone, no accounting"
    """Not held by the controller any more, and no slurmdbd to ask: it ended, how is unknown."""
    GONE_UNACCOUNTED = "gone, not in sacct"
    REUSED = "job id reused"
    """The controller's job of that id runs another script (the cluster's ids restarted)."""
    LOST = "lost by the controller"
    """Not held by the controller, yet sacct's last record of it never ended (``RUNNING``,
    ``REQUEUED``, ``PENDING``): the controller lost the job (its state was wiped)."""
    UNREACHABLE = "Slurm did not answer"
    LOCAL_RUNNING = "local, running"
    LOCAL_ENDED = "local, ended"


@dataclass(frozen=True)
class BackendView:
    """The backend's answers for every job shown, asked once
    (:func:`hpc_ddp.state.report.ask_backend`): its queue and its accounting, in the words of
    :mod:`hpc_ddp.backends.jobs` (Slurm's: squeue's rows and sacct's records)."""

    live: dict[str, JobInfo] | None
    """squeue's rows by ref; None when squeue failed."""
    error: str = ""
    accounting: dict[str, AccountingRecord] | None = None
    """sacct's records of the jobs squeue no longer holds; None: no accounting (or unasked)."""

    def of(self, job_id: str, script: Sequence[str]) -> tuple[JobState | None, Source, Any]:
        """(state, where it came from, squeue's row or sacct's record) of one plain job;
        ``script``: the paths the job's batch script may be known by."""
        if self.live is None:
            return None, Source.UNREACHABLE, None
        info = self.live.get(job_id)
        if info is not None:
            if info.command and info.command not in script:
                return None, Source.REUSED, info
            return info.state, Source.SQUEUE, info
        if self.accounting is None:
            return None, Source.GONE_NO_ACCOUNTING, None
        record = self.accounting.get(job_id)
        record = None if record is None else record.submitted_with(script)  # not a reused id's
        if record is None:
            return None, Source.GONE_UNACCOUNTED, None
        if not record.state.finished:
            return None, Source.LOST, record
        return record.state, Source.SACCT, record


@dataclass(frozen=True)
class Verdict:
    """A run's state as shown, and why when it is not plain Slurm's word."""

    state: str
    note: str | None = None


def _when(t: float) -> str:
    """A ledger time as local time; '?' for one no clock can show (the ledger reader skips
    those, but an :class:`Attempt` may come from elsewhere)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, ValueError, OSError):
        return "?"


def current_attempts(
    attempts: Sequence[Attempt],
    *,
    job_id: str | None = None,
    job_ref: str | None = None,
    since: float | None = None,
) -> list[Attempt]:
    """The attempts of the run's current job, the only ones its verdict may rest on: an earlier
    job's crash says nothing about a later job of the same run (``hpc-ddp resume``).

    An entry names its job by ``job_ref`` (``ARRAYJOB_TASK`` for a sweep task) or ``job_id``;
    one that names none (a local run's, or a very early end written by an older hpc-ddp) is
    the current job's when it started at ``since`` (the job's submit time) or later. With
    nothing to tell them by, every attempt is kept.
    """

    def ours(a: Attempt) -> bool:
        if job_ref is not None and a.job_ref is not None:
            return a.job_ref == job_ref
        if job_id is not None and a.job_id is not None:
            return a.job_id == job_id
        return since is None or a.started >= since

    return [a for a in attempts if ours(a)]


def describe_attempt(a: Attempt) -> str:
    """One ledger entry in words, for a note."""
    where = f" on {a.nodelist}" if a.nodelist else ""
    if a.cause is None:
        return f"attempt {a.attempt} (started {_when(a.started)}{where}) never recorded its end"
    text = f"attempt {a.attempt} ended {a.cause.value!r}"
    if a.steps_done is not None:
        text += f" at step {a.steps_done}"
    if (
        a.blame is not None
        and is_failure(a.cause)
        and not (a.message or "").startswith(a.cause.value)
    ):
        text += f": {a.blame.describe()}"
    if a.requeue_requested:
        text += " and asked for a requeue that never ran"
    return text + (f" ({a.message})" if a.message else "")


def judge(
    slurm: JobState | None,
    source: Source,
    attempts: Sequence[Attempt],
    startup: Callable[[], str | None],
    detail: str = "",
) -> Verdict:
    """The state to show for one run, from Slurm's state (None: Slurm has none, ``source``
    says why) and the ledger; ``startup()`` reads the logs for why a job died without a word
    (only called when that is the question)."""
    last = attempts[-1] if attempts else None
    if slurm is not None:
        return _with_slurm(slurm, last, startup)
    if last is not None and last.cause is EndCause.FINISHED:
        return Verdict("COMPLETED")
    if source is Source.LOCAL_RUNNING:
        return Verdict("RUNNING")
    if source is Source.UNREACHABLE:
        cause = last.cause if last is not None else None
        guess = "RUNNING?" if last is not None and cause is None else ledger_word(cause) + "?"
        return Verdict(guess, f"{detail or 'Slurm did not answer'}; shown from the ledger")
    return _gone(source, last, startup, detail)


def _with_slurm(
    slurm: JobState, last: Attempt | None, startup: Callable[[], str | None]
) -> Verdict:
    """Slurm's word weighed against the ledger's last attempt."""
    cause = last.cause if last is not None else None
    if not slurm.finished:
        return Verdict(slurm.value)
    if cause is EndCause.FINISHED:
        if slurm is JobState.COMPLETED:
            return Verdict("COMPLETED")
        return Verdict(slurm.value, f"training finished, then the job ended {slurm.value}")
    if slurm is JobState.COMPLETED:
        return _not_finished("Slurm says COMPLETED, but", last, startup, "INCOMPLETE")
    # FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    if is_failure(cause) or cause is EndCause.CANCELLED or slurm is JobState.CANCELLED:
        return Verdict(slurm.value)  # the ledger or the cancel itself says why
    why = startup()
    if last is None:
        return Verdict(slurm.value, f"no attempt started: {why or 'the logs say nothing'}")
    return Verdict(slurm.value, f"{describe_attempt(last)}" + (f"; then: {why}" if why else ""))


_GONE = {
    Source.GONE_NO_ACCOUNTING: "Slurm no longer holds the job and there is no accounting "
    "(sacct) to say how it ended",
    Source.GONE_UNACCOUNTED: "the job is neither in squeue nor in sacct",
    Source.LOCAL_ENDED: "the local job's process has exited",
}


def _gone(
    source: Source, last: Attempt | None, startup: Callable[[], str | None], detail: str
) -> Verdict:
    """A job Slurm no longer speaks for (``source`` says why): the ledger settles what it can."""
    gone = _GONE.get(source, source.value)
    if source is Source.REUSED:
        gone = (
            f"the job id now names another job ({detail}): this run directory is a copy of "
            "that job's, or the cluster's job ids restarted"
        )
    elif source is Source.LOST:
        gone = (
            f"Slurm no longer holds the job, yet sacct's last record of it says {detail} and "
            "never ended: the controller lost it (its state was wiped), and it will not run again"
        )
    cause = last.cause if last is not None else None
    if is_failure(cause):
        return Verdict(meaning(cause).status, f"{gone}; {describe_attempt(last)}" if last else gone)
    if cause is EndCause.CANCELLED:
        return Verdict("CANCELLED")
    return _not_finished(f"{gone}; last ledger entry:", last, startup, "GONE?")


def _not_finished(
    lead: str, last: Attempt | None, startup: Callable[[], str | None], state: str
) -> Verdict:
    """A job that ended while its ledger does not say finished: why, as far as anyone knows."""
    if last is not None and is_failure(last.cause):
        return Verdict(meaning(last.cause).status, f"{lead} {describe_attempt(last)}")
    if last is not None and last.cause is EndCause.CANCELLED:
        return Verdict("CANCELLED", f"{lead} {describe_attempt(last)}")
    why = startup()
    if last is None:
        if why:
            return Verdict("FAILED", f"{lead} no attempt started: {why}")
        return Verdict(
            state,
            f"{lead} no attempt is recorded in ledger.jsonl (a `command:` script that does not "
            "use hpc_ddp.session() records none)",
        )
    return Verdict(state, f"{lead} {describe_attempt(last)}" + (f"; logs: {why}" if why else ""))


def ledger_word(cause: EndCause | None) -> str:
    """The state the ledger alone suggests for a run that is not running: its last attempt's
    end ``cause`` in Slurm's words (``UNKNOWN`` without one)."""
    return "UNKNOWN" if cause is None else meaning(cause).status
