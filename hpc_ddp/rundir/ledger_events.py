"""The ledger's events: each one JSON line of ``RUN_DIR/ledger.jsonl``, built here. Pure.

Every attempt of a run (the first start and each requeue) appends an ``attempt_start`` line
when it begins and an ``attempt_end`` line when it stops on purpose::

    {"event": "attempt_start", "attempt": 0, "restart": 0, "time": 1718000000.0,
     "job_id": "4242", "job_ref": "4242", "nodelist": "n[1-2]", "world_size": 4,
     "resumed_from_step": null, "checkpoint": null, "grad_accum": 1}
    {"event": "attempt_end", "attempt": 0, "restart": 0, "job_id": "4242",
     "job_ref": "4242", "time": 1718003600.0, "cause": "time_limit", "steps_done": 1200,
     "checkpoint": "checkpoints/step-00001200.pt", "requeue_requested": true,
     "message": "time-limit warning signal"}

Under ``fault:`` a supervisor runs each attempt as one or more *launches* (srun steps, or
local process sets): the ranks' events then carry ``launch``, and the supervisor adds its own,
keyed by (job, restart, launch), a :class:`LaunchId`, rather than by number::

    {"event": "launch", "job_id": "4242", "job_ref": "4242", "restart": 0, "launch": 1,
     "time": ..., "nodes": "n[1,3]", "alloc_nodes": 3, "excluded": ["n2"], "world_size": 2,
     "from_step": 140}
    {"event": "launch_end", "job_id": "4242", "job_ref": "4242", "restart": 0, "launch": 0,
     "attempt": 0, "time": ..., "launched_at": ..., "cause": "hang", "ranks": [1],
     "nodes": ["n2"], "evidence": "heartbeat stopped ...", "node_level": false,
     "detected": ..., "last_progress": ..., "checkpoint_step": 140,
     "checkpoint": "step-00000140.pt", "next": "restart",
     "message": "hang: rank 1 on n2 ...; restart 1 of 3 (fault.max_restarts)"}
    {"event": "node_fail", ..., "launch": 0, "time": ..., "node": "n2", "evidence": "..."}
    {"event": "checkpoint", ..., "launch": 1, "time": ..., "step": 160, "stall_s": 0.012,
     "durable_s": 0.41}

An agreed stop's save is announced before it begins, and a stop whose save the kill beat is
recorded by whoever finds it (the next attempt, or ``status``), keyed by the attempt that lost
it::

    {"event": "stop_save", ..., "launch": 0, "time": ..., "step": 40, "lead_time_s": 120}
    {"event": "stop_save_lost", ..., "launch": 0, "time": ..., "step": 40, "saved_step": 20,
     "lost_steps": 20, "stop_at": ..., "lead_time_s": 120, "found_by": "attempt"}

``durable_s`` (W: from asking for the save until it was durable) is absent from ledgers written
before it was recorded. Under ``train.checkpoint_every: auto`` the line also carries the
interval in force and its inputs: ``"auto": {"interval_s": 95.2, "interval_steps": 380,
"step_s": 0.25, "mtbf_s": 28800.0, "mtbf_from": "prior", "restart_s": 12.0}``.

A ``command:`` job's program may never open a session, and then nothing above is written
while it runs: rank 0's ``hpc-ddp run`` appends a ``command_start`` as it starts the program,
keyed like a launch's events::

    {"event": "command_start", "job_id": "4242", "job_ref": "4242", "restart": 0, "time": ...,
     "nodelist": "n[1-2]", "world_size": 8}

And each attempt's task notes which code it runs, a ``code`` line
(:class:`~hpc_ddp.rundir.provenance.CodeRun`).

``requeue_requested`` is true only when hpc-ddp asked ``scontrol requeue`` and Slurm accepted;
a request that failed is recorded as the cause ``requeue_failed`` with ``requeue_requested``
false, and the ``message`` says what failed, which checkpoint is kept and how to go on.

Each function returns one line and writes nothing: its caller (the requeue coordinator, the
supervisor, the task) appends it with :func:`hpc_ddp.durable.append_line` (one ``write`` of
one whole line to a file opened ``O_APPEND``, then fsynced). What the lines fold into, and
reading them back, is :mod:`hpc_ddp.rundir.ledger`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_ddp.config.elastic import Resize
from hpc_ddp.rundir.attempt import Attempt, AutoInterval, Blame, LostStop
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import Checkpoint
from hpc_ddp.rundir.ledger import lost_stop

__all__ = [
    "LaunchId",
    "checkpoint_event",
    "code_event",
    "command_start_event",
    "end_event",
    "launch_end_event",
    "launch_event",
    "lost_stop_lines",
    "node_fail_event",
    "start_event",
    "stop_save_event",
    "stop_save_lost_event",
]


@dataclass(frozen=True)
class LaunchId:
    """Whose a ledger line is: the job (``job_id``; ``job_ref``, the name its requeue and
    ``status`` use, an array task's ``ARRAYJOB_TASK``; both None for no scheduler's job), its
    restart count (``SLURM_RESTART_COUNT``: 0, then +1 per requeue) and the launch within that
    attempt (0, then +1 per restart of a supervised run). Every event of a launch is keyed by it,
    rather than by the run's attempt number."""

    job_id: str | None
    job_ref: str | None
    restart: int
    launch: int = 0


def start_event(
    *,
    attempt: int,
    launch_id: LaunchId | None,
    nodelist: str,
    world_size: int,
    resumed_from_step: int | None,
    checkpoint: str | None,
    now: float | None = None,
    grad_accum: int | None = None,
    resize: Resize | None = None,
) -> str:
    """The ``attempt_start`` line of an attempt (rank 0 appends it): ``attempt`` its number in
    the run (:func:`~hpc_ddp.rundir.ledger.attempt_number`), ``launch_id`` its job, restart and
    launch (None: no scheduler's job, its restart count taken to be ``attempt``);
    ``grad_accum`` and ``resize`` (an elastic resume) when a session knows them."""
    key = _unkeyed(attempt) if launch_id is None else launch_id
    return _line(
        {
            "event": "attempt_start",
            "attempt": attempt,
            "restart": key.restart,
            **({"launch": key.launch} if key.launch else {}),
            "time": time.time() if now is None else now,
            "job_id": key.job_id,
            "job_ref": key.job_ref,
            "nodelist": nodelist,
            "world_size": world_size,
            "resumed_from_step": resumed_from_step,
            "checkpoint": checkpoint,
            **({} if grad_accum is None else {"grad_accum": grad_accum}),
            **({} if resize is None else {"resize": resize.to_dict()}),
        }
    )


def end_event(
    *,
    attempt: int,
    launch_id: LaunchId | None = None,
    cause: EndCause,
    steps_done: int | None,
    checkpoint: str | None,
    requeue_requested: bool,
    message: str = "",
    now: float | None = None,
    witness: bool = False,
) -> str:
    """The ``attempt_end`` line of an attempt. ``launch_id`` says whose end it is when no start
    was written (a rank that failed before rank 0 wrote it); None as :func:`start_event` takes
    it. ``witness``: the rank only lost a peer (a survivor of another rank's fault, under a
    supervisor whose ``launch_end`` gives the launch's one verdict): its word is kept as a
    witness's, never as the attempt's cause or blame."""
    key = _unkeyed(attempt) if launch_id is None else launch_id
    return _line(
        {
            "event": "attempt_end",
            "attempt": attempt,
            "restart": key.restart,
            **({"launch": key.launch} if key.launch else {}),
            "job_id": key.job_id,
            "job_ref": key.job_ref,
            "time": time.time() if now is None else now,
            "cause": EndCause(cause).value,
            "steps_done": steps_done,
            "checkpoint": checkpoint,
            "requeue_requested": requeue_requested,
            "message": message,
            **({"witness": True} if witness else {}),
        }
    )


def _unkeyed(attempt: int) -> LaunchId:
    """An attempt's key where none was given: no scheduler's job, its restart count its number."""
    return LaunchId(None, None, attempt)


def _line(event: dict[str, Any]) -> str:
    return json.dumps(event, sort_keys=True) + "\n"


def command_start_event(
    *,
    launch_id: LaunchId,
    nodelist: str,
    world_size: int,
    now: float | None = None,
) -> str:
    """Rank 0's ``command_start`` line: a ``command:`` program starts (see the module
    docstring); ``world_size`` the ranks it runs (torchrun's workers, where it starts them)."""
    return _launch_line("command_start", launch_id, now, nodelist=nodelist, world_size=world_size)


def launch_event(
    *,
    launch_id: LaunchId,
    nodes: str,
    alloc_nodes: int | None,
    excluded: list[str],
    world_size: int,
    from_step: int | None,
    now: float | None = None,
) -> str:
    """The supervisor's ``launch`` line: a launch (srun step, local process set) starts."""
    return _launch_line(
        "launch",
        launch_id,
        now,
        nodes=nodes,
        alloc_nodes=alloc_nodes,
        excluded=excluded,
        world_size=world_size,
        from_step=from_step,
    )


def _launch_line(kind: str, launch_id: LaunchId, now: float | None, **fields: Any) -> str:
    """One line of the events that belong to a launch: ``kind``, the launch's key, ``now`` (the
    time, default the clock's) and ``fields``."""
    head = {"event": kind, "job_id": launch_id.job_id, "job_ref": launch_id.job_ref}
    time_now = time.time() if now is None else now
    key = {"restart": launch_id.restart, "launch": launch_id.launch, "time": time_now}
    return _line({**head, **key, **fields})


def launch_end_event(
    *,
    attempt: int,
    launch_id: LaunchId,
    launched_at: float,
    cause: EndCause,
    blame: Blame | None,
    steps_reached: int | None,
    checkpoint: Checkpoint | None,
    next_step: str,
    requeue_requested: bool = False,
    message: str = "",
    now: float | None = None,
) -> str:
    """The supervisor's ``launch_end`` line: how a launch ended, whom a fault points to, and
    what follows (``next_step``: ``restart``, ``requeue`` or ``stop``). ``checkpoint``: the
    newest on disk as the launch ended, as listed (a shard set's ``step-N`` or a file's
    ``step-N.pt``)."""
    event: dict[str, Any] = {
        "attempt": attempt,
        "launched_at": launched_at,
        "cause": EndCause(cause).value,
        "steps_reached": steps_reached,
        "checkpoint_step": None if checkpoint is None else checkpoint.step,
        "checkpoint": None if checkpoint is None else checkpoint.name,
        "next": next_step,
        "requeue_requested": requeue_requested,
        "message": message,
    }
    if blame is not None:
        event.update(
            ranks=list(blame.ranks),
            nodes=list(blame.nodes),
            evidence=blame.evidence,
            node_level=blame.node_level,
            detected=blame.detected_at,
            last_progress=blame.last_progress_at,
        )
    return _launch_line("launch_end", launch_id, now, **event)


def node_fail_event(
    *,
    launch_id: LaunchId,
    node: str,
    evidence: str,
    now: float | None = None,
) -> str:
    """The supervisor's ``node_fail`` line: srun (or Slurm) said late that a node was lost."""
    return _launch_line("node_fail", launch_id, now, node=node, evidence=evidence)


def checkpoint_event(
    *,
    launch_id: LaunchId,
    step: int,
    stall_s: float,
    durable_s: float | None = None,
    auto: AutoInterval | None = None,
    now: float | None = None,
) -> str:
    """Rank 0's ``checkpoint`` line: a save at ``step`` held training up ``stall_s`` and was
    durable ``durable_s`` after it was asked for; under ``checkpoint_every: auto``, the
    interval in force and what it was chosen from."""
    extra: dict[str, Any] = {}
    if durable_s is not None:
        extra["durable_s"] = round(durable_s, 6)
    if auto is not None:
        extra["auto"] = {
            "interval_s": round(auto.interval_s, 3),
            "interval_steps": auto.interval_steps,
            "step_s": round(auto.step_s, 6),
            "mtbf_s": round(auto.mtbf_s, 3),
            "mtbf_from": auto.mtbf_from,
            "restart_s": round(auto.restart_s, 3),
        }
    return _launch_line("checkpoint", launch_id, now, step=step, stall_s=round(stall_s, 6), **extra)


def rescue_event(
    *,
    launch_id: LaunchId,
    rank: int,
    step: int | None,
    checkpoint: str | None,
    why: str | None,
    took_s: float,
    now: float | None = None,
) -> str:
    """A survivor's ``rescue`` line (:mod:`hpc_ddp.fault.rescue`): after the launch's fault,
    rank ``rank`` wrote ``checkpoint``, the last step every rank completed (``step``), in
    ``took_s``; or wrote none, and ``why`` (the restart goes on from an earlier checkpoint)."""
    return _launch_line(
        "rescue", launch_id, now, rank=rank, step=step, checkpoint=checkpoint, why=why,
        took_s=round(took_s, 6),
    )  # fmt: skip


def stop_save_event(
    *,
    launch_id: LaunchId,
    step: int,
    lead_time_s: int,
    now: float | None = None,
) -> str:
    """Rank 0's ``stop_save`` line: an agreed stop begins saving ``step`` (the job had a
    warning of ``lead_time_s``). The ``checkpoint`` line of that step follows once it is
    durable; a kill before it leaves this line alone, which the next attempt or ``status``
    finds (:func:`~hpc_ddp.rundir.ledger.lost_stop`) and records (:func:`stop_save_lost_event`)."""
    return _launch_line("stop_save", launch_id, now, step=step, lead_time_s=lead_time_s)


def stop_save_lost_event(
    *,
    launch_id: LaunchId,
    lost: LostStop,
    found_by: str,
    now: float | None = None,
) -> str:
    """The ``stop_save_lost`` line of a stop whose save the kill beat, keyed by the attempt
    that lost it, written by whoever found it (``found_by``: ``attempt`` or ``status``)."""
    return _launch_line(
        "stop_save_lost", launch_id, now, step=lost.step, saved_step=lost.saved_step,
        lost_steps=lost.lost_steps, stop_at=lost.stop_at, lead_time_s=lost.lead_s,
        found_by=found_by,
    )  # fmt: skip


def lost_stop_lines(attempts: Sequence[Attempt], *, found_by: str, now: float) -> list[str]:
    """The ``stop_save_lost`` lines of ``attempts`` (a ledger read back, every one of them
    over: a later attempt is starting, or the job has ended) whose stop's save the kill beat
    and that no line records yet."""
    lines = []
    for a in attempts:
        lost = lost_stop(a, over=True)
        if lost is None or lost.recorded:
            continue
        line = stop_save_lost_event(
            launch_id=LaunchId(a.job_id, a.job_ref, a.restart or 0, a.launch),
            lost=lost,
            found_by=found_by,
            now=now,
        )
        lines.append(line)
    return lines


def code_event(*, job_id: str | None, file: str, digest: str, now: float | None = None) -> str:
    """The ``code`` line of an attempt that is starting: which file of code it runs."""
    return _line(
        {
            "event": "code",
            "time": time.time() if now is None else now,
            "job_id": job_id,
            "file": file,
            "digest": digest,
        }
    )
