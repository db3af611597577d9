"""Goodput: one honest account of a run's wall time, from its ledger and metrics. Pure.

Where did the time go, from the first launch to the last event (or to now, for a running
run)? Each launch (an attempt of the ledger) is cut into

* **start-up**: the launch to its first step (imports, rendezvous, restoring a checkpoint); a
  launch that never trained is start-up from end to end;
* **checkpoint stalls**: how long training waited for its saves (rank 0's ``checkpoint``
  events);
* **steps redone**: training after the point the next launch resumed from (its checkpoint),
  which the next launch trained again;
* **hangs undetected**: from the blamed rank's last progress to the fault's detection;
* **recovery**: from then (or from the last progress) to the next launch of the same Slurm
  attempt: ending the step, stack dumps, the supervisor's decision;
* **requeue waits**: between an attempt's end and the launch of its Slurm requeue (the same
  job, its next restart), when the allocation was given back: the queue and Slurm's hold;
* **resume waits**: between an attempt's end and the launch of a job a person started for the
  run (``hpc-ddp resume``, a resubmission; locally, every next job): nothing was lost to the
  cluster, the run waited for someone. Counted apart from the requeues (``resumes``);
* **productive**: the rest of the training span.

**other** is what is left of the wall time (the shutdown after the last step, gaps no event
explains): printed, so the account always sums to the wall time. **ETTR** (effective training
time ratio) is productive / wall. **node-seconds** weigh each launch by the nodes it held
(spares included) where the ledger knows them; a requeue or resume wait holds none.

Times come from the ledger (launch, start, end, detection, saves) and ``metrics.jsonl`` (when
each logged step was reached), all written by one clock per event; the nodes' clocks may
disagree by a little, so every span is clipped at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from hpc_ddp.backends.nodelist import parse_nodelist
from hpc_ddp.rundir.attempt import Attempt, AutoInterval
from hpc_ddp.rundir.endcause import Bucket, meaning

PARTS = (
    ("productive", "productive"),
    ("startup", "start-up"),
    ("checkpoint_stall", "checkpoint stalls"),
    ("redone", "steps redone"),
    ("hang_undetected", "hangs undetected"),
    ("recovery", "recovery"),
    ("requeue_wait", "requeue waits"),
    ("resume_wait", "resume waits"),
    ("other", "other"),
)
"""The parts of the account (:class:`Goodput` fields ``<name>_s``) and their words."""


@dataclass(frozen=True)
class Goodput:
    """A run's wall time, accounted for (every ``*_s`` sums to ``wall_s``)."""

    wall_s: float
    productive_s: float
    startup_s: float
    checkpoint_stall_s: float
    redone_s: float
    redone_steps: int
    hang_undetected_s: float
    recovery_s: float
    requeue_wait_s: float
    resume_wait_s: float
    other_s: float
    ettr: float
    """Productive / wall (0 for a run with no wall time yet)."""
    launches: int
    requeues: int
    """Slurm requeues: the same job started again."""
    resumes: int
    """Jobs a person started for the run after it had stopped (``resume``, a resubmission)."""
    node_s: float | None
    """Node-seconds held (None when no launch's node count is known)."""
    productive_node_s: float | None
    checkpoints: CheckpointCosts | None = None
    """What the run's periodic saves cost, and the auto interval in force (None: no save
    recorded, or several runs added up)."""

    def to_dict(self) -> dict[str, Any]:
        """The account as JSON values."""
        return asdict(self)


@dataclass(frozen=True)
class CheckpointCosts:
    """The run's saves, as rank 0 recorded them: the inputs of ``checkpoint_every: auto``."""

    saves: int
    stall_s: float
    """C: the mean stall of a save."""
    durable_s: float | None
    """W: the mean time until a save was durable (None: a ledger from before it was kept)."""
    auto: AutoInterval | None
    """The newest auto interval in force (None: a fixed ``checkpoint_every``)."""


def checkpoint_costs(attempts: Sequence[Attempt]) -> CheckpointCosts | None:
    """The saves of ``attempts`` summed up (None: none recorded)."""
    saves = [s for a in attempts for s in a.saves]
    if not saves:
        return None
    durable = [s.durable_s for s in saves if s.durable_s is not None]
    autos = [s.auto for s in sorted(saves, key=lambda s: s.time) if s.auto is not None]
    return CheckpointCosts(
        saves=len(saves),
        stall_s=sum(s.stall_s for s in saves) / len(saves),
        durable_s=sum(durable) / len(durable) if durable else None,
        auto=autos[-1] if autos else None,
    )


def _nodes(a: Attempt) -> int | None:
    if a.alloc_nodes is not None:
        return a.alloc_nodes
    if not a.nodelist:
        return None
    try:
        return len(parse_nodelist(a.nodelist))
    except ValueError:
        return None


def _reached(steps: Sequence[tuple[float, int]], step: int, after: float, before: float) -> float:
    """When ``step`` (or the first later one logged) was reached within ``[after, before]``;
    ``before`` when none was by then (nothing after it was trained)."""
    times = [t for t, s in steps if after <= t <= before and s >= step]
    return min(times) if times else before


def _last_seen(a: Attempt, steps: Sequence[tuple[float, int]], end: float) -> float:
    """The last sign of training in ``a``: a logged step or a save, else its start."""
    times = [t for t, _ in steps if a.started <= t <= end] + [s.time for s in a.saves]
    return max([a.started, *times])


@dataclass
class _Sums:
    productive: float = 0.0
    startup: float = 0.0
    checkpoint_stall: float = 0.0
    redone: float = 0.0
    redone_steps: int = 0
    hang_undetected: float = 0.0
    recovery: float = 0.0
    requeue_wait: float = 0.0
    resume_wait: float = 0.0
    requeues: int = 0
    resumes: int = 0
    node_s: float = 0.0
    productive_node_s: float = 0.0
    nodes_known: bool = False


def _same_allocation(a: Attempt, b: Attempt) -> bool:
    """``b`` is an in-job restart of ``a``'s allocation (not a requeue, not a new job)."""
    return (a.job_ref or a.job_id, a.restart) == (b.job_ref or b.job_id, b.restart) and (
        b.launch > a.launch
    )


def _requeued(a: Attempt, b: Attempt) -> bool:
    """``b`` is a Slurm requeue of ``a``'s job: the same job id at a later restart. A new job
    (``hpc-ddp resume``; a local run has no job id) is a person's doing, never a requeue."""
    job = a.job_ref or a.job_id
    later = (b.restart or 0) > (a.restart or 0)
    return job is not None and job == (b.job_ref or b.job_id) and later


def account(
    attempts: Sequence[Attempt],
    steps: Sequence[tuple[float, int]],
    now: float,
    *,
    running: bool = False,
) -> Goodput:
    """The account of a run (see the module docstring). ``attempts`` as
    :func:`~hpc_ddp.rundir.ledger.read_ledger` gives them; ``steps``: (time, step) of every
    logged metrics row, replayed ones included; ``running``: the last attempt still runs (its
    end is ``now``)."""
    ordered = sorted(attempts, key=_launched)
    # Each save says exactly when its step was reached.
    steps = sorted([*steps, *((s.time, s.step) for a in attempts for s in a.saves)])
    sums = _Sums()
    if not ordered:
        return _finish(sums, 0.0, 0)
    begin = _launched(ordered[0])
    end_of_run = begin
    for i, a in enumerate(ordered):
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        end = _end_of(a, steps, now, running and nxt is None)
        end_of_run = max(end_of_run, end)
        _one(a, nxt, steps, end, sums)
        if nxt is not None:
            gap = max(0.0, _launched(nxt) - end)
            if _same_allocation(a, nxt):
                sums.recovery += gap
            elif _requeued(a, nxt):
                sums.requeue_wait += gap
                sums.requeues += 1
            else:
                sums.resume_wait += gap
                sums.resumes += 1
    if running:
        end_of_run = max(end_of_run, now)
    return replace(
        _finish(sums, end_of_run - begin, len(ordered)), checkpoints=checkpoint_costs(attempts)
    )


def _launched(a: Attempt) -> float:
    """When ``a``'s launch began (its start, for a ledger without launch events)."""
    return a.started if a.launched_at is None else a.launched_at


def _end_of(a: Attempt, steps: Sequence[tuple[float, int]], now: float, running: bool) -> float:
    if a.ended is not None:
        # The supervisor may be done with the launch later than the first rank that ended.
        return max(a.ended, a.launch_ended or a.ended)
    if running:
        return now
    return _last_seen(a, steps, now)  # died without a word: its last sign of life


def _one(
    a: Attempt,
    nxt: Attempt | None,
    steps: Sequence[tuple[float, int]],
    end: float,
    sums: _Sums,
) -> None:
    """Add one launch's parts to ``sums``."""
    launched = _launched(a)
    nodes = _nodes(a)
    if nodes is not None:
        sums.nodes_known = True
        sums.node_s += nodes * max(0.0, end - launched)
    if not a.trained:
        sums.startup += max(0.0, end - launched)
        return
    first = max(a.started, launched)
    sums.startup += first - launched
    bucket = Bucket.PRODUCTIVE if a.cause is None else meaning(a.cause).goodput
    fault = bucket is not Bucket.PRODUCTIVE
    blame = a.blame
    last = end
    if fault:
        seen = _last_seen(a, steps, end)
        known = blame.last_progress_at if blame is not None else None
        last = seen if known is None else known
        last = min(max(last, first), end)
    detected = blame.detected_at if blame is not None else None
    if bucket is Bucket.HANG_UNDETECTED and detected is not None:
        detected = min(max(detected, last), end)
        sums.hang_undetected += detected - last
        sums.recovery += end - detected
    elif fault:
        sums.recovery += end - last
    span = max(0.0, last - first)
    stall = sum(s.stall_s for s in a.saves if first <= s.time <= last + 1.0)
    stall = min(stall, span)
    redone = 0.0
    resumed = _resumed_step(nxt)
    done = _steps_done(a)
    if nxt is not None and resumed is not None and done is not None:  # noqa: SIM102
        if resumed < done:  # the next launch trains these steps again
            since = _reached(steps, resumed, first, last) if resumed > _start(a) else first
            redone = max(0.0, last - since)
            inside = sum(s.stall_s for s in a.saves if since <= s.time <= last + 1.0)
            redone = max(0.0, min(redone - inside, span - stall))
            sums.redone_steps += done - max(resumed, _start(a))
    sums.checkpoint_stall += stall
    sums.redone += redone
    productive = max(0.0, span - stall - redone)
    sums.productive += productive
    if nodes is not None:
        sums.productive_node_s += nodes * productive


def _steps_done(a: Attempt) -> int | None:
    """The steps launch ``a`` trained: its beats' word, bounded by its survivor's."""
    done = a.steps_done
    rescued = a.rescue.step if a.rescue is not None else None
    if a.rescue is None or rescued is None:
        return done
    if a.rescue.checkpoint is not None:
        # The step in flight at the fault was never completed by every rank: not redone.
        return rescued if done is None else min(done, rescued)
    # No survivor's save, but the survivor knew the last step every rank completed; the beats
    # the launch's steps came from may be half a second behind it.
    return rescued if done is None else max(done, rescued)


def _start(a: Attempt) -> int:
    return a.resumed_from_step or 0


def _resumed_step(nxt: Attempt | None) -> int | None:
    if nxt is None:
        return None
    if nxt.resumed_from_step is not None:
        return nxt.resumed_from_step
    if nxt.from_step is not None:
        return nxt.from_step
    return 0 if nxt.trained else None


def _finish(sums: _Sums, wall: float, launches: int) -> Goodput:
    wall = max(0.0, wall)
    parts = (
        sums.productive + sums.startup + sums.checkpoint_stall + sums.redone
        + sums.hang_undetected + sums.recovery + sums.requeue_wait + sums.resume_wait
    )  # fmt: skip
    return Goodput(
        wall_s=wall,
        productive_s=sums.productive,
        startup_s=sums.startup,
        checkpoint_stall_s=sums.checkpoint_stall,
        redone_s=sums.redone,
        redone_steps=sums.redone_steps,
        hang_undetected_s=sums.hang_undetected,
        recovery_s=sums.recovery,
        requeue_wait_s=sums.requeue_wait,
        resume_wait_s=sums.resume_wait,
        other_s=wall - parts,
        ettr=sums.productive / wall if wall > 0 else 0.0,
        launches=launches,
        requeues=sums.requeues,
        resumes=sums.resumes,
        node_s=sums.node_s if sums.nodes_known else None,
        productive_node_s=sums.productive_node_s if sums.nodes_known else None,
    )


def total(accounts: Sequence[Goodput]) -> Goodput:
    """Several runs' accounts added up (a sweep's tasks)."""
    known = [g for g in accounts if g.node_s is not None]
    wall = sum(g.wall_s for g in accounts)
    productive = sum(g.productive_s for g in accounts)
    return Goodput(
        wall_s=wall,
        productive_s=productive,
        startup_s=sum(g.startup_s for g in accounts),
        checkpoint_stall_s=sum(g.checkpoint_stall_s for g in accounts),
        redone_s=sum(g.redone_s for g in accounts),
        redone_steps=sum(g.redone_steps for g in accounts),
        hang_undetected_s=sum(g.hang_undetected_s for g in accounts),
        recovery_s=sum(g.recovery_s for g in accounts),
        requeue_wait_s=sum(g.requeue_wait_s for g in accounts),
        resume_wait_s=sum(g.resume_wait_s for g in accounts),
        other_s=sum(g.other_s for g in accounts),
        ettr=productive / wall if wall > 0 else 0.0,
        launches=sum(g.launches for g in accounts),
        requeues=sum(g.requeues for g in accounts),
        resumes=sum(g.resumes for g in accounts),
        node_s=sum(g.node_s or 0.0 for g in known) if known else None,
        productive_node_s=sum(g.productive_node_s or 0.0 for g in known) if known else None,
    )


def _clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(g: Goodput) -> list[str]:
    """The account as text lines (``status --goodput``)."""
    head = (
        f"goodput  wall {_clock(g.wall_s)}  ETTR {g.ettr:.2f}  ({g.launches} launch"
        f"{'es' if g.launches != 1 else ''}, {g.requeues} requeue{'s' if g.requeues != 1 else ''}"
        f", {g.resumes} resume{'s' if g.resumes != 1 else ''})"
    )
    lines = [head]
    for name, words in PARTS:
        seconds = getattr(g, f"{name}_s")
        share = 100 * seconds / g.wall_s if g.wall_s > 0 else 0.0
        plural = "s" if g.redone_steps != 1 else ""
        extra = f"  ({g.redone_steps} step{plural})" if name == "redone" and g.redone_steps else ""
        lines.append(f"  {words:<18} {_clock(seconds):>8}  {share:5.1f} %{extra}")
    if g.node_s is not None:
        useful = g.productive_node_s or 0.0
        lines.append(f"  {'node-seconds':<18} {g.node_s:,.0f} s (productive {useful:,.0f} s)")
    if g.checkpoints is not None:
        lines.extend(_describe_costs(g.checkpoints))
    return lines


def _describe_costs(c: CheckpointCosts) -> list[str]:
    """``  saves  12, C 0.012 s, W 0.41 s`` and the auto interval's line."""
    w = "W not recorded" if c.durable_s is None else f"W {c.durable_s:.3g} s"
    lines = [f"  {'saves':<18} {c.saves}, C {c.stall_s:.3g} s, {w} (mean)"]
    a = c.auto
    if a is not None:
        lines.append(
            f"  {'auto interval':<18} {a.interval_s:.1f} s = {a.interval_steps} steps at "
            f"{a.step_s:.3g} s/step; M {a.mtbf_s:,.0f} s from {a.mtbf_from}, "
            f"restart {a.restart_s:.1f} s"
        )
    return lines


__all__ = [
    "PARTS",
    "CheckpointCosts",
    "Goodput",
    "account",
    "checkpoint_costs",
    "describe",
    "total",
]
