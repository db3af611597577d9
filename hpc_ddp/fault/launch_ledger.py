"""The supervisor's ledger: one job attempt's launches in the run's ``ledger.jsonl``.

The supervisor (:mod:`hpc_ddp.fault.supervisor`) writes a ``launch`` event as each launch
starts, a ``launch_end`` (its cause, blame and what follows) as it ends, and a ``node_fail``
for srun's late word on a node lost under an earlier launch; it reads back which entries are
this job's launches (the history :func:`~hpc_ddp.fault.plan.decide_next` weighs, the blame of
the launch before). The ranks' own entries are :mod:`hpc_ddp.fault.coordinator`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpc_ddp.durable import append_line
from hpc_ddp.errors import RunDirError
from hpc_ddp.fault.blame import Finding
from hpc_ddp.rundir.attempt import Attempt, Blame
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import Checkpoint, RunPaths
from hpc_ddp.rundir.ledger import attempt_number, read_ledger
from hpc_ddp.rundir.ledger_events import (
    LaunchId,
    launch_end_event,
    launch_event,
    node_fail_event,
)

log = logging.getLogger("hpc_ddp.supervisor")

SAME_JOB_SLACK_S = 5.0
"""Without a job id (a local run), an entry is this job's when it started at most this long
before the launch (or the supervisor) did: clocks of one machine, written a moment apart."""


@dataclass(frozen=True)
class Identity:
    """The job the supervisor runs."""

    job_id: str | None
    job_ref: str | None
    restart: int
    tag: str | None = None
    """What names the launch directories when the job has no Slurm id (the local backend's
    ``local-<controller pid>``), so that a resumed run never meets an earlier job's files."""

    def launch_id(self, launch: int) -> LaunchId:
        """The key of this job's launch ``launch`` in the ledger."""
        return LaunchId(self.job_id, self.job_ref, self.restart, launch)


class LaunchLedger:
    """The launches of job ``me`` in the run ``paths`` (see the module docstring); ``began``:
    when the supervisor started."""

    def __init__(self, paths: RunPaths, me: Identity, began: float) -> None:
        self.paths = paths
        self.me = me
        self.began = began

    def attempts(self) -> list[Attempt]:
        """Every attempt of the run the ledger holds ([] for one it cannot read, said)."""
        try:
            return read_ledger(self.paths.ledger)
        except RunDirError as exc:
            log.warning("%s", exc)
            return []

    def is_mine(self, a: Attempt, launch: int, launched_at: float) -> bool:
        """``a`` is this job's launch ``launch``, started at ``launched_at``."""
        job = a.job_ref or a.job_id
        if (job, a.restart, a.launch) != (self.me.job_ref, self.me.restart, launch):
            return False
        return self.me.job_ref is not None or a.started >= launched_at - SAME_JOB_SLACK_S

    def previous_blame(self, attempts: Sequence[Attempt], launch: int) -> Blame | None:
        """The blame of the launch before ``launch``, if it had one."""
        if launch == 0:
            return None
        before = [a for a in attempts if self.is_mine(a, launch - 1, 0.0)]
        return before[-1].blame if before else None

    def history(
        self,
        attempts: Sequence[Attempt],
        entry: Attempt | None,
        launch: int,
        launched_at: float,
        finding: Finding,
        reached: int | None,
        ckpt: Checkpoint | None,
        from_step: int | None,
    ) -> list[Attempt]:
        """The submission's launches, this one (as it ends now) last."""
        job = self.me.job_ref
        earlier = [
            a
            for a in attempts
            if (a.job_ref or a.job_id) == job
            and (job is not None or a.started >= self.began - SAME_JOB_SLACK_S)
            and not self.is_mine(a, launch, launched_at)
        ]
        base = entry or Attempt(
            attempt=len(attempts), started=launched_at, ended=None, cause=None, steps_done=None,
            checkpoint=None, nodelist="", job_ref=job, resumed_from_step=None,
            job_id=self.me.job_id, restart=self.me.restart, launch=launch,
        )  # fmt: skip
        now = replace(
            base,
            cause=finding.cause,
            blame=finding.blame,
            steps_done=base.steps_done if base.steps_done is not None else reached,
            from_step=from_step,
            checkpoint_step=None if ckpt is None else ckpt.step,
        )
        return [*earlier, now]

    def start(
        self,
        launch: int,
        *,
        nodes: str,
        alloc_nodes: int | None,
        excluded: Sequence[str],
        world_size: int,
        from_step: int | None,
        now: float,
    ) -> None:
        """Launch ``launch`` starts on ``nodes``."""
        self._append(
            launch_event(
                launch_id=self.me.launch_id(launch),
                nodes=nodes,
                alloc_nodes=alloc_nodes,
                excluded=list(excluded),
                world_size=world_size,
                from_step=from_step,
                now=now,
            )
        )

    def end(
        self,
        launch: int,
        launched_at: float,
        cause: EndCause,
        blame: Blame | None,
        reached: int | None,
        ckpt: Checkpoint | None,
        next_step: str,
        message: str | None,
    ) -> None:
        """Launch ``launch`` ended: why, whom it blames, and what follows (``next_step``)."""
        attempts = self.attempts()
        number = attempt_number(
            attempts, job_id=self.me.job_id, restart=self.me.restart, launch=launch,
            since=launched_at - SAME_JOB_SLACK_S,
        )  # fmt: skip
        self._append(
            launch_end_event(
                attempt=number,
                launch_id=self.me.launch_id(launch),
                launched_at=launched_at,
                cause=cause,
                blame=blame,
                steps_reached=reached,
                checkpoint=ckpt,
                next_step=next_step,
                requeue_requested=next_step == "requeue",
                message=message or "",
            )
        )

    def node_failure(self, launch: int, node: str, evidence: str) -> None:
        """srun's late word on a node lost under an earlier launch: the cause becomes it."""
        self._append(
            node_fail_event(
                launch_id=self.me.launch_id(launch),
                node=node,
                evidence=evidence,
            )
        )

    def _append(self, line: str) -> None:
        self.paths.ledger.parent.mkdir(parents=True, exist_ok=True)
        append_line(self.paths.ledger, line)
