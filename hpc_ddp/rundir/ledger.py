"""The attempt ledger read back: ``RUN_DIR/ledger.jsonl``'s events folded into attempts. Pure.

The events themselves (one JSON line each, who writes which) are
:mod:`hpc_ddp.rundir.ledger_events`. Here is how they fold into attempts
(:class:`~hpc_ddp.rundir.attempt.Attempt`, with its
:class:`~hpc_ddp.rundir.endcause.EndCause`, blame and saves) as they are read back
(:func:`read_ledger`), and the number a process writes its attempt's events with
(:func:`attempt_number`). Which code each attempt ran is :mod:`hpc_ddp.rundir.provenance`'s.

``attempt`` numbers the run's attempts from 0 across all its jobs (Slurm's requeues and
``hpc-ddp resume`` alike); ``restart`` is the attempt's ``SLURM_RESTART_COUNT`` within its job,
which the requeue budget counts. Ledgers written before ``restart`` existed numbered each job's
attempts from 0 again: :func:`read_ledger` numbers every attempt by its place in the run, so
old and new ledgers read the same, and an old event's ``attempt`` is read as its ``restart``.

Under ``fault:`` the supervisor's events (``launch``, ``launch_end``, ``node_fail``) and rank
0's ``checkpoint`` are keyed by (job, restart, launch) rather than by number. A ``launch_end``
closes its launch's attempt when no rank could (a rank killed, frozen, or lost with its node),
and its fault verdict replaces a rank's own ``crash`` (a survivor's "connection reset" names
the wrong rank); a launch whose ranks wrote nothing becomes an attempt of its own.
``node_fail`` (srun's late word on a lost node) upgrades the cause; ``checkpoint`` is rank 0's
record of each save and how long it held training up (for the goodput account).

A ``command_start`` (a ``command:`` program started without a session) is no attempt of its
own: the attempt's ``attempt_start`` (the session's, or the one ``hpc-ddp run`` writes with the
program's end) supersedes it. Only the readers that show a run (``status``, its goodput) ask
for one that nothing supersedes (``provisional=True``): a program still running, or one that
died without a word; the node side's numbering never sees it.

Nothing here writes, so the login side (``status``, ``results``) imports the same module
without torch. A crash can still leave a torn last line; readers skip any line that does not
parse, and writers start on a fresh line after one. An attempt with a start and no end is
still running, or died without a word (SIGKILL, node failure): :func:`read_ledger` reports it
with ``ended=None``. An end with no start is an attempt that failed before rank 0 wrote its
start (every rank records its own crash): it is reported as an attempt that started when it
ended. Why a stop came and whether another attempt follows is the requeue coordinator's to say
(:mod:`hpc_ddp.fault.requeue`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_ddp.config.elastic import RESEEDED, SAMPLE_EXACT, Resize
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.attempt import (
    Attempt,
    AutoInterval,
    Blame,
    LostStop,
    Rescue,
    Save,
    StopSave,
)
from hpc_ddp.rundir.endcause import EndCause, is_fault, is_restartable

log = logging.getLogger(__name__)


def read_ledger(
    path: Path, *, since: float | None = None, provisional: bool = False
) -> list[Attempt]:
    """The attempts recorded in ``path``, in the order they started; [] if there is no file.

    Lines that do not parse (a torn last line) or are not ledger events are skipped, never fatal,
    and so is an event whose attempt number or time is not a sane number (negative, not finite,
    out of any clock's range); an optional number that is not (a negative step, a world size of
    0) is read as unknown. A ledger that cannot be read at all (a directory in its place, no
    permission) is a :class:`~hpc_ddp.errors.RunDirError` with a hint, not a traceback.

    A second start of the same attempt number (the same step relaunched) opens a new entry; an
    end closes the latest open entry of its attempt. An end with no open entry is the end of an
    attempt that failed before rank 0 recorded its start (a model that cannot be built, a bad
    checkpoint): it becomes an attempt of its own, started when it ended, unless the attempt
    has ended already (every rank of a crashed attempt writes its end; the first written wins).
    ``since``: when the run's current job was submitted (its manifest's ``submitted_at``), to
    tell the ends of a resumed run's new job from old ones in a ledger written before attempts
    were numbered across the run (each job's counted from 0 again); only for runs whose old
    processes had all ended by then (the local backend's). Each attempt returned has its
    number in the run: its place in the list.

    ``provisional``: also an open attempt for each ``command_start`` that no entry of its
    launch supersedes (a ``command:`` program without a session, still running or dead without
    a word), where it was written. Only for showing a run: the node side numbers attempts
    without them.
    """
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:  # IsADirectoryError, PermissionError, EIO...
        raise RunDirError(
            f"{path}: unreadable ledger ({exc.strerror or exc}). HINT: ledger.jsonl must be a "
            "readable file; check its permissions, or move whatever is in its place aside "
            "(the next attempt starts a new ledger)."
        ) from None
    attempts: list[Attempt] = []
    launched: _Launched = {}
    commands: list[tuple[int, Attempt]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if isinstance(event, dict) and event.get("event") == "command_start":
                commands.append((len(attempts), _command_attempt(event)))
            else:
                _fold(attempts, event, since, launched)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            log.warning("%s:%d: skipping an unreadable ledger line (%s)", path, number, exc)
    if provisional:
        attempts = _with_commands(attempts, commands)
    attempts = _then(attempts)
    attempts = [_with_launch(a, launched) for a in attempts]
    # Events pair up by the number they were written with; the run numbers them by place.
    return [replace(a, attempt=index) for index, a in enumerate(attempts)]


def _command_attempt(event: Any) -> Attempt:
    """The open attempt a ``command_start`` stands for until its attempt's start supersedes it."""
    return Attempt(
        attempt=0,  # numbered by its place, as every attempt
        started=_time(event["time"]),
        ended=None,
        cause=None,
        steps_done=None,
        checkpoint=None,
        nodelist=str(event.get("nodelist") or ""),
        job_ref=_opt_str(event.get("job_ref")),
        resumed_from_step=None,
        job_id=_opt_str(event.get("job_id")),
        world_size=_opt_count(event.get("world_size"), "world_size", low=1),
        restart=_opt_count(event.get("restart"), "restart"),
        launch=_launch(event),
    )


def _with_commands(attempts: list[Attempt], commands: list[tuple[int, Attempt]]) -> list[Attempt]:
    """``attempts`` with each command's open attempt that no entry supersedes, at the place
    its ``command_start`` was written."""
    out = list(attempts)
    for place, command in reversed(commands):  # from the last: earlier places stay put
        if not any(_supersedes(a, command) for a in attempts):
            out.insert(place, command)
    return out


def _supersedes(a: Attempt, command: Attempt) -> bool:
    """``a`` is the attempt ``command`` started: its launch's, and without a job id to tell
    jobs apart (a local run), one that started or ended since the command started (an earlier
    local job's entries of the same restart and launch ended before it)."""
    key = _entry_key(command)
    if _entry_key(a) != key:
        return False
    if key[0] is not None:
        return True
    last = a.started if a.ended is None else max(a.started, a.ended)
    return last >= command.started - _SKEW_S


def _then(attempts: list[Attempt]) -> list[Attempt]:
    """Each attempt's ``next``, with a requeue said as one: the supervisor sees a launch whose
    ranks stopped and asked for the requeue (or that Slurm requeued) end cleanly, ``stop``."""
    newest: dict[str, int] = {}  # each job's latest restart in the ledger
    for a in attempts:
        job = a.job_ref or a.job_id
        if job is not None:
            newest[job] = max(newest.get(job, 0), a.restart or 0)
    out = []
    for a in attempts:
        job = a.job_ref or a.job_id
        later = job is not None and newest[job] > (a.restart or 0)  # Slurm ran it again
        requeued = a.cause is not None and (bool(a.requeue_requested) or later)
        said = requeued and a.next == "stop" and a.cause is not EndCause.FINISHED
        out.append(replace(a, next="requeue") if said else a)
    return out


def lost_stop(attempt: Attempt, *, over: bool) -> LostStop | None:
    """The stop of ``attempt`` whose save was not durable before the kill, or None: a stop's
    save was begun (``stop_save``) and no durable save of that step (a ``checkpoint`` line,
    written once it is durable) followed. ``over``: nothing more of the attempt will come (a
    later attempt started, or its job has ended); an attempt still saving is never judged."""
    if attempt.lost is not None:
        return attempt.lost
    stop = attempt.stop_save
    if stop is None or not over:
        return None
    if any(save.step >= stop.step for save in attempt.saves):
        return None
    if attempt.resumed_from_step is not None and attempt.resumed_from_step >= stop.step:
        return None  # the step was on disk already: the stop had nothing new to save
    steps = [s.step for s in attempt.saves if s.step < stop.step]
    if attempt.resumed_from_step is not None:
        steps.append(attempt.resumed_from_step)
    return LostStop(stop.step, max(steps) if steps else None, stop.time, stop.lead_s)


def attempt_number(
    attempts: list[Attempt],
    *,
    job_id: str | None,
    restart: int,
    since: float | None = None,
    launch: int = 0,
) -> int:
    """The number a process of job ``job_id`` at ``restart`` (and ``launch``) writes its
    attempt's end with: that of the newest entry of the same job, restart and launch (one
    started since ``since``, for a run with no job ids: the local backend's), else the next
    number (a new attempt's start, or the end of one whose start was never written).
    ``attempts`` as :func:`read_ledger` returns them; pure.
    """
    for a in reversed(attempts):
        if (a.job_id, a.restart, a.launch) != (job_id, restart, launch):
            continue
        if job_id is None and since is not None and a.started < since:
            break  # an earlier local job's: this job's attempt has no entry yet
        return a.attempt
    return len(attempts)


_Key = tuple[str | None, int | None, int]
_Launched = dict[_Key, list[Any]]
"""``launch`` events by their key, in the order written."""
_SKEW_S = 5.0
"""Slack between the clocks of the batch host and rank 0's node when a launch's events are
matched to a run's attempts by time (only runs without a job id need it: the local backend's,
on one machine)."""


def _fold(attempts: list[Attempt], event: Any, since: float | None, launched: _Launched) -> None:
    kind = event["event"]
    if kind in _SUPERVISED:
        _SUPERVISED[kind](attempts, event, launched)
        return
    if kind == "attempt_start":
        checkpoint = _opt_str(event.get("checkpoint"))
        attempts.append(
            Attempt(
                attempt=_count(event["attempt"], "attempt"),
                started=_time(event["time"]),
                ended=None,
                cause=None,
                steps_done=None,
                checkpoint=checkpoint,
                nodelist=str(event.get("nodelist") or ""),
                job_ref=_opt_str(event.get("job_ref")),
                resumed_from_step=_opt_count(event.get("resumed_from_step"), "resumed_from_step"),
                job_id=_opt_str(event.get("job_id")),
                world_size=_opt_count(event.get("world_size"), "world_size", low=1),
                resumed_from=checkpoint,
                restart=_restart(event),
                launch=_launch(event),
                grad_accum=_opt_count(event.get("grad_accum"), "grad_accum", low=1),
                resize=_resize(event.get("resize")),
            )
        )
    elif kind == "attempt_end":
        _fold_end(attempts, event, since)
    # Events of a later hpc-ddp are skipped without a word: they add, never change, attempts.


def _resize(value: Any) -> Resize | None:
    """An ``attempt_start``'s ``resize``, or None (absent, or not one this code reads)."""
    if not isinstance(value, dict):
        return None
    try:
        return Resize(
            before_world=_count(value["from_world_size"], "from_world_size", low=1),
            before_accum=_opt_count(value.get("from_grad_accum"), "from_grad_accum", low=1),
            world=_count(value["world_size"], "world_size", low=1),
            accum=_count(value["grad_accum"], "grad_accum", low=1),
            exactness=str(value.get("exactness") or SAMPLE_EXACT),
            rng=str(value.get("rng") or RESEEDED),
        )
    except (KeyError, ValueError, OverflowError) as exc:
        log.warning(
            "ledger: an attempt's resize %r is unreadable (%s); read as unknown", value, exc
        )
        return None


def _launch(event: Any) -> int:
    return _opt_count(event.get("launch"), "launch") or 0


def _event_key(event: Any) -> _Key:
    job = _opt_str(event.get("job_ref")) or _opt_str(event.get("job_id"))
    return job, _opt_count(event.get("restart"), "restart"), _launch(event)


def _entry_key(a: Attempt) -> _Key:
    return a.job_ref or a.job_id, a.restart, a.launch


def _find(attempts: list[Attempt], key: _Key, launched_at: float | None) -> int | None:
    """The newest attempt of launch ``key``; without a job id to tell jobs apart (the local
    backend's), only one that started after ``launched_at``."""
    for index in range(len(attempts) - 1, -1, -1):
        a = attempts[index]
        if _entry_key(a) != key:
            continue
        if key[0] is None and launched_at is not None and a.started < launched_at - _SKEW_S:
            return None
        return index
    return None


def _fold_launch(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    _time(event["time"])
    launched.setdefault(_event_key(event), []).append(event)


def _launch_of(launched: _Launched, key: _Key, started: float) -> Any:
    """The ``launch`` event of the launch an attempt of ``key`` that started at ``started``
    belongs to: the newest one written before it started (clock skew allowed)."""
    found = None
    for event in launched.get(key, []):
        if _time(event["time"]) <= started + _SKEW_S:
            found = event
    return found


def _with_launch(a: Attempt, launched: _Launched) -> Attempt:
    """``a`` with what its ``launch`` event says (when the supervisor wrote one)."""
    event = _launch_of(launched, _entry_key(a), a.started)
    if event is None:
        return a
    launched_at = _time(event["time"])
    return replace(
        a,
        launched_at=a.launched_at if a.launched_at is not None else launched_at,
        alloc_nodes=_opt_count(event.get("alloc_nodes"), "alloc_nodes", low=1),
        from_step=_opt_count(event.get("from_step"), "from_step"),
        nodelist=a.nodelist or str(event.get("nodes") or ""),
        world_size=a.world_size or _opt_count(event.get("world_size"), "world_size", low=1),
    )


def _blame(event: Any) -> Blame | None:
    evidence = event.get("evidence")
    if evidence is None:
        return None
    return Blame(
        ranks=tuple(_count(r, "rank") for r in event.get("ranks") or ()),
        nodes=tuple(str(n) for n in event.get("nodes") or ()),
        evidence=str(evidence),
        node_level=bool(event.get("node_level")),
        detected_at=_opt_time(event.get("detected")),
        last_progress_at=_opt_time(event.get("last_progress")),
    )


def _opt_time(value: Any) -> float | None:
    return None if value is None else _time(value)


def _refined_by_node_fail(cause: EndCause | None) -> bool:
    """srun's late word of a lost node (``node_fail``) refines a restartable fault's cause, or
    an unknown one."""
    return cause is EndCause.UNKNOWN or is_restartable(cause)


def _fold_launch_end(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    """Close (or refine) the launch's attempt with the supervisor's word; a launch that left
    no attempt (its ranks died before rank 0 wrote a start) becomes one."""
    key = _event_key(event)
    ended = _time(event["time"])
    launched_at = _opt_time(event.get("launched_at"))
    cause = _cause(event.get("cause"))
    fault = is_fault(cause)
    said: dict[str, Any] = {
        "blame": _blame(event),
        "next": _opt_str(event.get("next")),
        "checkpoint_step": _opt_count(event.get("checkpoint_step"), "checkpoint_step"),
        "launched_at": launched_at,
        "launch_ended": ended,
    }
    requested = bool(event.get("requeue_requested"))
    message = _opt_str(event.get("message"))
    index = _find(attempts, key, launched_at)
    if index is None:
        attempts.append(
            Attempt(
                attempt=_number_or(event.get("attempt"), len(attempts)),
                started=launched_at if launched_at is not None else ended,
                ended=ended,
                cause=cause,
                steps_done=_opt_count(event.get("steps_reached"), "steps_reached"),
                checkpoint=_opt_str(event.get("checkpoint")),
                nodelist="",
                job_ref=_opt_str(event.get("job_ref")),
                resumed_from_step=None,
                job_id=_opt_str(event.get("job_id")),
                requeue_requested=requested,
                message=message,
                restart=key[1],
                launch=key[2],
                trained=False,
                **said,
            )
        )
        return
    entry = attempts[index]
    if entry.is_open:
        steps = entry.steps_done
        if steps is None:
            steps = _opt_count(event.get("steps_reached"), "steps_reached")
        attempts[index] = replace(
            entry,
            ended=ended,
            cause=cause,
            steps_done=steps,
            checkpoint=_opt_str(event.get("checkpoint")) or entry.checkpoint,
            requeue_requested=requested,
            message=message,
            **said,
        )
    elif fault:
        # The supervisor's fault verdict is the launch's one verdict, over any rank's own word:
        # a survivor's crash, or a "finished" from a rank that left its loop early while its
        # peers trained on. Its checkpoint is the newest one on disk when the launch ended.
        attempts[index] = replace(
            entry,
            cause=cause,
            requeue_requested=requested or bool(entry.requeue_requested),
            message=message,
            checkpoint=_opt_str(event.get("checkpoint")) or entry.checkpoint,
            **said,
        )
    else:
        attempts[index] = replace(entry, **said)


def _number_or(value: Any, default: int) -> int:
    number = _opt_count(value, "attempt")
    return default if number is None else number


def _fold_node_fail(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    """srun's late word that a node was lost: the launch's fault was the node's."""
    index = _find(attempts, _event_key(event), None)
    if index is None:
        return
    entry = attempts[index]
    if not _refined_by_node_fail(entry.cause):
        return
    node = str(event["node"])
    old = entry.blame
    blame = Blame(
        ranks=old.ranks if old else (),
        nodes=tuple(dict.fromkeys([*(old.nodes if old else ()), node])),
        evidence=str(event.get("evidence") or f"node {node} failed"),
        node_level=True,
        detected_at=old.detected_at if old else _time(event["time"]),
        last_progress_at=old.last_progress_at if old else None,
    )
    attempts[index] = replace(entry, cause=EndCause.NODE_FAIL, blame=blame)


def _fold_checkpoint(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    index = _find(attempts, _event_key(event), None)
    if index is None:
        return
    durable = event.get("durable_s")
    save = Save(
        _time(event["time"]),
        _count(event["step"], "step"),
        max(0.0, float(event.get("stall_s") or 0.0)),
        None if durable is None else max(0.0, float(durable)),
        _auto_interval(event.get("auto")),
    )
    entry = attempts[index]
    attempts[index] = replace(entry, saves=(*entry.saves, save))


def _auto_interval(raw: Any) -> AutoInterval | None:
    """The ``auto`` part of a checkpoint line; None when absent or not sane (a hand edit)."""
    if not isinstance(raw, dict):
        return None
    try:
        auto = AutoInterval(
            float(raw["interval_s"]),
            int(raw["interval_steps"]),
            float(raw["step_s"]),
            float(raw["mtbf_s"]),
            str(raw["mtbf_from"]),
            float(raw.get("restart_s") or 0.0),
        )
    except (KeyError, TypeError, ValueError):
        return None
    numbers = (auto.interval_s, auto.step_s, auto.mtbf_s, auto.restart_s)
    if not all(math.isfinite(n) and n >= 0 for n in numbers) or auto.interval_steps < 1:
        return None
    return auto


def _fold_rescue(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    index = _find(attempts, _event_key(event), None)
    if index is None:
        return
    rescue = Rescue(
        rank=_count(event["rank"], "rank"),
        step=_opt_count(event.get("step"), "step"),
        checkpoint=_opt_str(event.get("checkpoint")),
        why=_opt_str(event.get("why")),
        took_s=max(0.0, float(event.get("took_s") or 0.0)),
    )
    attempts[index] = replace(attempts[index], rescue=rescue)


def _fold_stop_save(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    index = _find(attempts, _event_key(event), None)
    if index is None:
        return
    stop = StopSave(
        _time(event["time"]),
        _count(event["step"], "step"),
        _opt_count(event.get("lead_time_s"), "lead_time_s"),
    )
    attempts[index] = replace(attempts[index], stop_save=stop)


def _fold_stop_save_lost(attempts: list[Attempt], event: Any, launched: _Launched) -> None:
    index = _find(attempts, _event_key(event), None)
    if index is None or attempts[index].lost is not None:
        return  # the next attempt and status may both have recorded it: the first stands
    lost = LostStop(
        step=_count(event["step"], "step"),
        saved_step=_opt_count(event.get("saved_step"), "saved_step"),
        stop_at=_time(event["stop_at"]),
        lead_s=_opt_count(event.get("lead_time_s"), "lead_time_s"),
        recorded=True,
    )
    attempts[index] = replace(attempts[index], lost=lost)


_SUPERVISED = {
    "launch": _fold_launch,
    "launch_end": _fold_launch_end,
    "node_fail": _fold_node_fail,
    "checkpoint": _fold_checkpoint,
    "rescue": _fold_rescue,
    "stop_save": _fold_stop_save,
    "stop_save_lost": _fold_stop_save_lost,
}
"""The events of launches (the supervisor's, and rank 0's checkpoints), folded by their key."""


def _fold_end(attempts: list[Attempt], event: Any, since: float | None) -> None:
    number = _count(event["attempt"], "attempt")
    ended = _time(event["time"])
    cause = _cause(event.get("cause"))
    steps = _opt_count(event.get("steps_done"), "steps_done")
    checkpoint = _opt_str(event.get("checkpoint"))
    requested = bool(event.get("requeue_requested"))
    message = _opt_str(event.get("message"))
    witness = event.get("witness") is True
    said = (message,) if witness and message else ()
    for index in range(len(attempts) - 1, -1, -1):
        entry = attempts[index]
        if entry.attempt != number:
            continue
        if entry.is_open or (_witnessed_only(entry) and not witness):
            # A witness's end closes the attempt until its verdict (the supervisor's, or the
            # failing rank's own end written after it) comes; it never is the verdict.
            attempts[index] = replace(
                entry,
                ended=entry.ended if not entry.is_open else ended,
                cause=cause,
                steps_done=steps if steps is not None or entry.is_open else entry.steps_done,
                checkpoint=checkpoint or entry.checkpoint,
                requeue_requested=requested,
                message=message,
                witnesses=(*entry.witnesses, *said),
            )
            return
        if witness:
            attempts[index] = replace(entry, witnesses=(*entry.witnesses, *said))
            return
    if not _starts_an_attempt(attempts, number, ended, since):
        return  # a peer's late word on an attempt already ended: the first end wins
    attempts.append(
        Attempt(
            attempt=number,
            started=ended,  # never recorded: it failed before its start was written
            ended=ended,
            cause=cause,
            steps_done=steps,
            checkpoint=checkpoint,
            nodelist="",
            job_ref=_opt_str(event.get("job_ref")),
            resumed_from_step=None,
            job_id=_opt_str(event.get("job_id")),
            requeue_requested=requested,
            message=message,
            restart=_restart(event),
            launch=_launch(event),
            witnesses=said,
        )
    )


def _witnessed_only(entry: Attempt) -> bool:
    """The attempt was closed by a witness's end alone: no verdict on it yet."""
    return (
        not entry.is_open
        and entry.blame is None
        and bool(entry.witnesses)
        and entry.message == entry.witnesses[-1]
    )


def _restart(event: Any) -> int | None:
    """An event's ``restart``; an event from before it existed has its ``attempt`` there."""
    if event.get("restart") is None:
        return _count(event["attempt"], "attempt")
    return _opt_count(event.get("restart"), "restart")


def _starts_an_attempt(
    attempts: list[Attempt], number: int, ended: float, since: float | None
) -> bool:
    """Whether an end with no open entry is an attempt of its own (one that failed before its
    start was written), not a repeat of an end already recorded for the attempt.

    Every rank of a crashed attempt writes its end, so an end after an ended entry of the same
    number is normally such a repeat. In ledgers from before run-wide numbering, attempt
    numbers start again at 0 in a resumed run's new job, though: with ``since`` (when the
    run's current job was submitted), an end from that job after an entry that ended before
    it is the new job's own.
    """
    earlier = [a for a in attempts if a.attempt == number]
    if not earlier:
        return True
    last_end = earlier[-1].ended
    return since is not None and ended >= since and last_end is not None and last_end < since


_LATEST_TIME = 253402300799.0
"""9999-12-31T23:59:59Z: the latest time every platform's clock functions can show."""
_LARGEST_COUNT = (1 << 63) - 1


def _time(value: Any) -> float:
    """A ledger time (seconds since the epoch); ValueError unless finite and in 0..9999 AD."""
    if isinstance(value, bool):
        raise ValueError(f"time {value!r} is not a number")
    t = float(value)
    if not (math.isfinite(t) and 0.0 <= t <= _LATEST_TIME):
        raise ValueError(f"time {value!r} is out of range")
    return t


def _count(value: Any, name: str, low: int = 0) -> int:
    """A whole number of at least ``low`` (an attempt, a step); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} {value!r} is not a whole number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} {value!r} is not a whole number")
    number = int(value)
    if not low <= number <= _LARGEST_COUNT:
        raise ValueError(f"{name} {number} is out of range")
    return number


def _opt_count(value: Any, name: str, low: int = 0) -> int | None:
    """:func:`_count` for an optional field: None when absent, or (with a warning) when not a
    sane number, so one bad field never hides the rest of its event."""
    if value is None:
        return None
    try:
        return _count(value, name, low)
    except (ValueError, OverflowError) as exc:
        log.warning("ledger: %s; read as unknown", exc)
        return None


def _cause(value: Any) -> EndCause:
    try:
        return EndCause(value)
    except ValueError:
        return EndCause.UNKNOWN  # written by a newer hpc-ddp


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
