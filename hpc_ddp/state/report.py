"""One run's status row: what Slurm says about its job weighed against what its files say.

:func:`run_status` never raises for a damaged run: it becomes one DAMAGED row, so one bad run
never hides the others. Never imports torch: checkpoints are judged by their zip structure.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc_ddp.backends.base import Backend, Backends, Postmortem
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.durable import append_line
from hpc_ddp.errors import BackendError, RunDirError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.checkpoints import newest_step
from hpc_ddp.rundir.endcause import EndCause, is_failure
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import lost_stop, read_ledger
from hpc_ddp.rundir.ledger_events import lost_stop_lines
from hpc_ddp.rundir.live_progress import read_live_progress
from hpc_ddp.rundir.manifest import Manifest, read_manifest
from hpc_ddp.rundir.provenance import CodeRun, code_change, read_code_runs
from hpc_ddp.rundir.run_id import recorded_run_id
from hpc_ddp.state.artifacts import last_metric, metric_rows, step_times
from hpc_ddp.state.goodput import Goodput, account
from hpc_ddp.state.task import TaskState
from hpc_ddp.state.verdict import (
    BackendView,
    Source,
    Verdict,
    current_attempts,
    describe_attempt,
    judge,
)

log = logging.getLogger(__name__)

DAMAGED = "DAMAGED"
_CAUSE_WORDS = frozenset(c.value for c in EndCause if is_failure(c))


def ask_backend(backend: Backend, job_ids: Sequence[str], plain: Sequence[str]) -> BackendView:
    """The backend's queue (squeue) for every job id; its accounting (sacct, once) for the
    ``plain`` run jobs the queue no longer holds: :meth:`~hpc_ddp.backends.base.Backend.states` and
    :meth:`~hpc_ddp.backends.base.Backend.accounting` of ``backend``."""
    try:
        live = backend.states(job_ids) if job_ids else {}
    except BackendError as exc:
        return BackendView(None, _said(exc))
    gone = [j for j in plain if j not in live]
    if not gone:
        return BackendView(live, accounting={})
    try:
        accounting = backend.accounting(gone)
    except BackendError as exc:
        return BackendView(live, _said(exc), None)
    return BackendView(live, accounting=accounting)


def with_accounting(backend: Backend, view: BackendView, job_ids: Sequence[str]) -> BackendView:
    """``view`` with sacct's records of ``job_ids`` too (the array jobs of sweep tasks squeue no
    longer holds), in one more sacct call; unchanged when there is nothing to ask, or no
    accounting to ask (``view.accounting`` None: sacct said so, or failed)."""
    if not job_ids or view.live is None or view.accounting is None:
        return view
    try:
        more = backend.accounting(job_ids)
    except BackendError as exc:
        return BackendView(view.live, view.error or _said(exc), view.accounting)
    if more is None:
        return BackendView(view.live, view.error, None)
    return BackendView(view.live, view.error, {**view.accounting, **more})


def _said(exc: BackendError) -> str:
    """``squeue failed (exit 1): <Slurm's words>`` from a :class:`BackendError`'s message (a
    backend's own error names the command it ran)."""
    lines = str(exc).splitlines()
    said = next((x.removeprefix("Slurm said: ") for x in lines if x.startswith("Slurm said:")), "")
    return f"{lines[0].rstrip('.')}: {said}" if said else lines[0]


# --- one row ----------------------------------------------------------------------------------


def fmt_elapsed(seconds: float | None) -> str:
    """Seconds as ``H:MM:SS`` for a table; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))  # clocks of login and compute nodes may disagree a little
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


_FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY"})


def _failed_rank(
    paths: RunPaths, state: str, attempts: list[Attempt], postmortem: Postmortem
) -> str | None:
    """The rank (and node) to blame for a run whose last attempt failed: the supervisor's word
    in the ledger (``fault:``), else the launcher's account of the rank that failed first
    (``postmortem``: srun's, in Slurm's batch log).

    A rank killed outright leaves no word of its own; the ledger then holds a peer's
    "connection reset", which names the wrong rank. The supervisor (beats, srun's lines, the
    nodes' state) and srun's log name the right one.
    """
    last = attempts[-1] if attempts else None
    if last is not None and last.blame is not None and is_failure(last.cause):
        return f"{last.cause.value}: {last.blame.describe()}"
    crashed = last is not None and last.cause in (None, EndCause.CRASH)
    if state not in _FAILED_STATES or not crashed:
        return None
    failure = postmortem.failed_rank(paths.logs)
    return None if failure is None else failure.describe()


def newest_checkpoint(paths: RunPaths) -> tuple[int | None, str | None]:
    """(newest step whose file looks whole and is this run's, a note on the newer ones that
    are not: damaged, misnamed, another run's)."""
    damaged: list[tuple[int, str]] = []
    step = newest_step(
        paths.checkpoints,
        run_id=recorded_run_id(paths),
        on_skip=lambda s, why: damaged.append((s, why)),
        unlistable_ok=False,
    )
    return step, _damage_note(damaged, every=step is None)


def _damage_note(damaged: list[tuple[int, str]], *, every: bool) -> str | None:
    """What the newer files passed over say (``every``: no file was whole)."""
    if not damaged:
        return None
    step, why = damaged[0]
    if every:
        return (
            f"all {len(damaged)} checkpoint(s) damaged (newest step {step}: {why}): a requeue "
            "cannot resume. HINT: `hpc-ddp checkpoints RUN_DIR` says more; move checkpoints/ "
            "aside to start over"
        )
    return f"{len(damaged)} newest checkpoint(s) damaged (step {step}: {why}); resume skips them"


def run_status(run_dir: Path, view: BackendView, backends: Backends) -> dict[str, Any]:
    """One status row (a plain dict) for ``run_dir``; a damaged run is a DAMAGED row.
    ``backends``: where the backend its manifest names is picked (it asks nothing itself:
    ``view`` holds the queue's word)."""
    try:
        return _row(run_dir, read_manifest(run_dir), view, backends)
    except (RunDirError, OSError) as exc:
        return damaged_row(run_dir, exc)


def damaged_row(run_dir: Path, exc: BaseException) -> dict[str, Any]:
    """The row of a run whose files cannot be read: its state is DAMAGED, the note says why."""
    text = str(exc) if isinstance(exc, RunDirError) else f"{type(exc).__name__}: {exc}"
    return {
        "run": str(run_dir), "job": None, "backend": None, "state": DAMAGED, "nodes": "-",
        "elapsed": "-", "elapsed_s": None, "attempts": None, "causes": "-", "ckpt step": None,
        "loss": None,
        "failed_rank": None, "note": text, "code_changed": None, "attempt_list": [],
    }  # fmt: skip


def _slurm_word(
    run_dir: Path, manifest: Manifest, paths: RunPaths, view: BackendView, backend: Backend
) -> tuple[JobState | None, Source, Any, str | None]:
    """(Slurm's state, its source, squeue's row or sacct's record, a note) for the run's job:
    the view's word, unless the backend speaks for the job itself
    (:meth:`~hpc_ddp.backends.base.Backend.word`: a local run's processes)."""
    job = manifest.job_id or ""
    word = backend.word(run_dir, job)
    if word is None:
        return (*view.of(job, _scripts(run_dir, manifest, paths)), None)
    state = JobState.CANCELLED if word.cancelled else None
    return state, Source.LOCAL_RUNNING if word.running else Source.LOCAL_ENDED, None, word.note


def _scripts(run_dir: Path, manifest: Manifest, paths: RunPaths) -> list[str]:
    """The paths the run's batch script may be known to Slurm by: its own, and the one in the
    directory the manifest was written for if that is this one or gone (the run was moved).
    A copy (``cp -r``) of a run whose original still stands is not the original's job."""
    scripts = [str(paths.script.resolve())]
    recorded = Path(manifest.run_dir)
    try:
        if not recorded.exists() or os.path.samefile(recorded, run_dir):
            scripts.append(str(recorded / "job.sbatch"))
    except OSError:
        pass
    return scripts


def _notes(
    verdict: Verdict,
    source: Source,
    view: BackendView,
    attempts: list[Attempt],
    paths: RunPaths,
    postmortem: Postmortem,
) -> list[str]:
    """What the row's note says beside the verdict's own word."""
    notes = [verdict.note] if verdict.note else []
    last = attempts[-1] if attempts else None
    if not notes and verdict.state == "FAILED" and last is not None and is_failure(last.cause):
        notes.append(describe_attempt(last))  # Slurm's FAILED stands; the ledger says why
    if source is Source.GONE_NO_ACCOUNTING and view.error:
        notes.append(view.error)
    queued_job = source not in (Source.LOCAL_RUNNING, Source.LOCAL_ENDED)
    if queued_job and not attempts and verdict.state in _FAILED_STATES:
        silence = postmortem.no_log(paths.logs)  # the batch script never started?
        if silence is not None:
            notes.append(silence)
    return notes


def _lost_stops(
    paths: RunPaths, attempts: list[Attempt], *, running: bool, now: float
) -> list[str]:
    """The note of each stop whose save the kill beat (:func:`lost_stop`), and the ledger
    line of the last attempt's, when its job has ended and no later attempt recorded it (the
    ranks died with the save; an earlier attempt's is recorded by the attempt after it)."""
    notes = []
    for index, a in enumerate(attempts):
        lost = lost_stop(a, over=index < len(attempts) - 1 or not running)
        if lost is not None:
            notes.append(f"attempt {a.attempt}: {lost.describe()}")
    if attempts and not running:
        for line in lost_stop_lines(attempts[-1:], found_by="status", now=now):
            try:
                append_line(paths.ledger, line)
            except OSError as exc:  # a run directory status may not write: shown, not kept
                log.warning("%s: the lost stop not recorded (%s)", paths.ledger, exc)
    return notes


def _startup(run_dir: Path, manifest: Manifest, backend: Backend) -> Callable[[], str | None]:
    """Why a job ended without a word in its ledger, as its backend tells it
    (:meth:`~hpc_ddp.backends.base.Backend.startup_failure`), asked only when needed."""
    return lambda: backend.startup_failure(run_dir, manifest.job_id)


def _nodes_and_elapsed(
    source: Source, record: Any, attempts: list[Attempt], wall: float
) -> tuple[str, float | None]:
    """Where the job ran, and the run's wall time: ``wall`` over all the ledger's attempts
    (the goodput account's), or Slurm's elapsed time of the current job when longer (an
    attempt that died without a word after its start) or when the ledger has none yet. Slurm's
    own counts only the job's latest start: a requeue starts it again."""
    nodes, elapsed = "-", None
    if source is Source.SQUEUE:
        nodes, elapsed = record.nodes or "-", record.elapsed_s
    elif source is Source.SACCT:
        elapsed = record.elapsed_s
    if not attempts:
        return nodes, elapsed
    if nodes == "-":
        nodes = attempts[-1].nodelist or "-"
    return nodes, wall if elapsed is None else max(wall, float(elapsed))


def _submitted(manifest: Manifest) -> float | None:
    """When the run's current job was submitted (epoch seconds); None if the manifest's time
    is not a time (an older or edited manifest: the ledger is then read without it)."""
    try:
        when = datetime.fromisoformat(manifest.submitted_at)
    except (TypeError, ValueError):
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _row(
    run_dir: Path, manifest: Manifest, view: BackendView, backends: Backends
) -> dict[str, Any]:
    paths = RunPaths(run_dir)
    # A resumed local job's early crash is told from the old job's ends by its submit time: its
    # old ranks were provably gone before the resume. Not so on Slurm: a rank may still write
    # its end a moment after Slurm has called the job FAILED (seen on 22.05).
    backend = backends.backend(manifest)  # asks nothing itself: the view holds the queue's word
    submitted = _submitted(manifest)
    since = submitted if backend.ledger_since_submit else None
    attempts = read_ledger(paths.ledger, since=since, provisional=True)
    # The verdict is the current job's: an earlier job's crash never speaks for a later one.
    job = None if backend.ledger_since_submit else manifest.job_id
    current = current_attempts(attempts, job_id=job, job_ref=job, since=submitted)
    slurm_state, source, record, word_note = _slurm_word(run_dir, manifest, paths, view, backend)
    detail = view.error if source is Source.UNREACHABLE else ""
    if source is Source.REUSED:
        detail = f"script {record.command}"
    elif source is Source.LOST:
        detail = record.raw_state
    verdict = judge(slurm_state, source, current, _startup(run_dir, manifest, backend), detail)
    postmortem = backends.postmortem(manifest)
    notes = _notes(verdict, source, view, current, paths, postmortem)
    if word_note:
        notes.append(word_note)
    rows = metric_rows(paths)
    now = time.time()
    notes.extend(_lost_stops(paths, attempts, running=still_running(verdict.state), now=now))
    attempts, unkept = restarts_kept(attempts, running=still_running(verdict.state))
    if unkept is not None:
        notes.append(unkept)
    wall = account(attempts, step_times(rows), now, running=still_running(verdict.state)).wall_s
    nodes, elapsed = _nodes_and_elapsed(source, record, attempts, wall)
    step, ckpt_note = newest_checkpoint(paths)
    if ckpt_note:
        notes.append(ckpt_note)
    changed = code_change(read_code_runs(paths.ledger))
    if changed is not None:
        notes.append(describe_code_change(*changed))
    live = read_live_progress(paths.live_progress) if still_running(verdict.state) else None
    if live is not None:  # rank 0's last progress line (a loop that logs rows with a step)
        notes.insert(0, live.describe(time.time()))
    return {
        "run": str(run_dir),
        "job": manifest.job_id,
        "backend": manifest.backend,
        "state": verdict.state,
        "nodes": nodes,
        "elapsed": fmt_elapsed(elapsed),
        "elapsed_s": None if elapsed is None or not math.isfinite(elapsed) else max(0.0, elapsed),
        "attempts": len(attempts),
        "causes": ",".join(a.cause.value if a.cause else "running" for a in attempts) or "-",
        "ckpt step": step,
        "loss": last_metric(rows, "loss"),
        "failed_rank": _failed_rank(paths, verdict.state, current, postmortem),
        "note": "; ".join(notes) or None,
        "code_changed": None if changed is None else code_change_json(*changed),
        "attempt_list": [
            {
                "attempt": a.attempt,  # numbered across the run's jobs
                "job": a.job_ref,
                "restart": a.restart,  # within its job: what the requeue budget counts
                "cause": a.cause.value if a.cause else None,
                "steps_done": a.steps_done,
                "checkpoint": a.checkpoint,
                "nodelist": a.nodelist,
                "launch": a.launch,  # within its Slurm attempt: in-job restarts count up
                "world": a.world_size,
                # An elastic resume: from which world size and accumulation, and how exact.
                "resized_from": None if a.resize is None else a.resize.before_world,
                "resize": None if a.resize is None else a.resize.describe(),
                "blame": None if a.blame is None else a.blame.describe(),
                "next": a.next,
            }
            for a in attempts
        ],
    }


def describe_code_change(first: CodeRun, last: CodeRun) -> str:
    """The note of a run whose latest attempt ran other code than its first."""
    name = Path(last.file).name
    where = "" if last.file == first.file else f" (was {first.file})"
    return (
        f"code changed since the first attempt: {name} digest {_short(first.digest)} -> "
        f"{_short(last.digest)}{where}"
    )


def code_change_json(first: CodeRun, last: CodeRun) -> dict[str, Any]:
    """``code_changed`` of ``status --json``: the file and the first and latest digests."""
    return {
        "file": last.file,
        "first_file": first.file,
        "first_digest": first.digest,
        "digest": last.digest,
    }


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


_STILL_GOING = frozenset(
    {
        JobState.RUNNING.value,
        JobState.COMPLETING.value,
        JobState.CONFIGURING.value,
        JobState.SUSPENDED.value,
        TaskState.RUNNING.value,
        "RUNNING?",  # Slurm did not answer, and the ledger's last attempt is open
    }
)


def restarts_kept(attempts: list[Attempt], *, running: bool) -> tuple[list[Attempt], str | None]:
    """The attempts, the last one's ``restart`` said as ``stop`` when the job has ended without
    that launch (the supervisor died first: a full disk, a killed batch host), and a note
    saying so; a job still running may be about to relaunch, and keeps its word."""
    if running or not attempts or attempts[-1].next != "restart":
        return attempts, None
    last = attempts[-1]
    note = (
        f"attempt {last.attempt}: the supervisor chose to restart, but the job ended before a "
        "new launch began (see the batch log)"
    )
    return [*attempts[:-1], replace(last, next="stop")], note


def still_running(state: str) -> bool:
    """Whether a status row's ``state`` says the last attempt is still going, so that its
    goodput counts up to now. A run's state is Slurm's word or the verdict's (``RUNNING``), a
    sweep task's a :class:`~hpc_ddp.state.task.TaskState` (``running``): both are known here."""
    return state in _STILL_GOING


def run_goodput(run_dir: Path, *, running: bool, now: float | None = None) -> Goodput:
    """The goodput account of one run (:mod:`hpc_ddp.state.goodput`): its ledger and
    metrics; ``running``: its last attempt is still going (its end is now)."""
    paths = RunPaths(run_dir)
    attempts = read_ledger(paths.ledger, provisional=True)  # a program running without a session
    return account(
        attempts,
        step_times(metric_rows(paths)),
        time.time() if now is None else now,
        running=running,
    )


def reason_lines(row: dict[str, Any]) -> list[str]:
    """The lines ``status`` prints under its table for one row: the rank srun saw fail
    first, and the note (why the run stands where it does). ``submit --wait`` prints them too."""
    lines = []
    if row["failed_rank"]:
        where = (
            "ledger.jsonl"
            if row["failed_rank"].split(":")[0] in _CAUSE_WORDS
            else "srun, in the batch log: hpc-ddp logs RUN --batch"
        )
        lines.append(f"{row['run']}: failed first: {row['failed_rank']} ({where})")
    if row["note"]:
        lines.append(f"{row['run']}: {row['note']}")
    return lines
