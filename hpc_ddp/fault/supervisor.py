"""The supervisor: runs each attempt as launches, ends a failed one, and decides what follows.

Under ``fault.enabled`` the batch script ``exec``s ``hpc-ddp supervise`` (the local backend
runs it as its controller's one task). It runs the job's ranks as a *launch* (an srun step of
the allocation it already holds, or a set of local processes), watches it, and when a launch
fails (a rank crashed, hung or died, a node was lost) it

1. makes every rank leave: it declares the fault in its own beat (every rank's watchdog reads
   it within one beat and exits, NCCL or not), wakes frozen ranks and asks each for its stacks
   (SIGCONT, then :data:`~hpc_ddp.fault.watchdog.DUMP_SIGNAL`), then ends the step;
2. names the rank(s) and node(s) to blame from every beat, the fault record, srun's (or
   ``waitpid``'s) account of each task and the nodes' state
   (:func:`~hpc_ddp.fault.blame.assign_blame`) and records it in the ledger (``launch_end``);
3. asks the plan what follows (:func:`~hpc_ddp.fault.plan.decide_next`): restart in the same
   allocation from the newest checkpoint, on healthy nodes, within ``fault.max_restarts``;
   requeue through Slurm, asking it to avoid the bad nodes; or stop (a crash loop:
   ``no_progress``), and does it.

A launch that ends on purpose (finished, or a stop the ranks agreed on and requeued) ends the
supervisor with the ranks' own exit status: preemption, time limits and cancels stay the
ranks' and Slurm's business, as without a supervisor.

The policy is :mod:`hpc_ddp.fault.plan` (pure); this module is the loop that watches the
launches, reads the run directory and acts. The launches themselves come from a
:class:`~hpc_ddp.backends.base.Launcher` (srun steps: :mod:`hpc_ddp.backends.slurm.step`;
local processes: :mod:`hpc_ddp.backends.local.launcher`), chosen by the caller. Never imports
torch: with a container, the supervisor runs on the batch host with the interpreter that
submitted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType

from hpc_ddp.backends.base import Launcher, TaskEnd
from hpc_ddp.config.elastic import nodes_for_launch
from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import BackendError
from hpc_ddp.fault.blame import (
    BEAT_BYTES,
    Beat,
    ExitNote,
    FaultRecord,
    Finding,
    StaleWatch,
    assign_blame,
)
from hpc_ddp.fault.detection import Detection
from hpc_ddp.fault.launch_ledger import Identity, LaunchLedger
from hpc_ddp.fault.launch_watch import LaunchWatch, Step
from hpc_ddp.fault.plan import (
    Budget,
    Next,
    Requeue,
    Restart,
    decide_next,
    decide_refused,
    ended_on_purpose,
    exclusion,
    likely_exclusion,
    recorded_cause,
    spare_free,
    with_detected_at,
    with_own_words,
    with_scheduler_words,
)
from hpc_ddp.fault.standby import Standby, standby_fits
from hpc_ddp.fault.watchdog import (
    read_beats,
    read_exit_notes,
    read_fault,
    write_beat,
)
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.checkpoints import newest_checkpoint, newest_step
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import (
    LAUNCH_DIR_ENV,
    LAUNCH_ENV,
    SUPERVISED_ENV,
    Checkpoint,
    LaunchPaths,
    RunPaths,
    launch_key,
)
from hpc_ddp.rundir.run_id import recorded_run_id

log = logging.getLogger("hpc_ddp.supervisor")

POLL_S = 0.25
"""How often the supervisor looks at srun's words, the fault record and the step."""


# --- what a launch runs on -------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One launch: where it runs."""

    launch: int
    nodes: int
    """Nodes the step uses (``slurm.nodes``; with ``slurm.min_nodes`` as many healthy ones as
    the allocation has, up to ``slurm.nodes``)."""
    tasks_per_node: int
    exclude: tuple[str, ...] = ()
    """Nodes of the allocation it must not use (found bad)."""
    overlap: bool = False
    """Share resources with a step that has not ended yet (its lost node still holds them)."""


def launch_words(plan: Plan, newest: int | None) -> str:
    """The supervisor's line for a launch it starts: its nodes, and ``newest``, the newest
    committed checkpoint on disk when relaunching (not a promise of the step the ranks resume
    from: rank 0 logs that, ``resumed from step-N...``)."""
    without = f", without {','.join(plan.exclude)}" if plan.exclude else ""
    found = f"step {newest}" if newest is not None else "none"
    return (
        f"launch {plan.launch} ({plan.nodes} node(s){without}); newest committed checkpoint "
        f"when relaunching: {found} (rank 0's log says where the ranks resume)"
    )


# --- files -----------------------------------------------------------------------------------


def read_bad_nodes(paths: RunPaths, job: str | None) -> dict[str, str]:
    """The nodes found bad in this job so far (node -> evidence); {} for another job's file."""
    try:
        data = json.loads(paths.bad_nodes.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("job") != job:
        return {}
    nodes = data.get("nodes")
    return {str(k): str(v) for k, v in nodes.items()} if isinstance(nodes, dict) else {}


def write_bad_nodes(paths: RunPaths, job: str | None, nodes: Mapping[str, str]) -> None:
    """Remember the bad nodes of this job (a requeued attempt avoids them too)."""
    paths.launches.mkdir(parents=True, exist_ok=True)
    write_text_atomic(paths.bad_nodes, json.dumps({"job": job, "nodes": dict(nodes)}) + "\n")


def prepare_launch(launch: LaunchPaths, world: int) -> None:
    """Make the launch directory and every beat file before any rank starts: every later
    read is of a file that exists (an NFS client caches "no such file" for a while)."""
    launch.root.mkdir(parents=True, exist_ok=True)
    launch.fault.unlink(missing_ok=True)  # a key reused (a run directory copied back): no claim
    blank = b" " * (BEAT_BYTES - 1) + b"\n"
    notes = [launch.exit_note(r) for r in range(world)]
    for path in [launch.supervisor, *(launch.beat(r) for r in range(world)), *notes]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, blank)
        finally:
            os.close(fd)


def _task_ends(step: Step) -> list[TaskEnd]:
    return list(step.task_ends())


# --- the supervisor --------------------------------------------------------------------------


class Supervisor:
    """Runs one job attempt as launches (see the module docstring)."""

    def __init__(
        self,
        paths: RunPaths,
        cfg: JobConfig,
        launcher: Launcher[Step],
        me: Identity,
        *,
        env: Mapping[str, str],
        cancelled: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.launcher = launcher
        self.me = me
        self.env = dict(env)
        self.cancelled = cancelled
        """True once a person cancelled the run (the local backend's note): start nothing."""
        self._clock = clock
        self.began = clock()
        self.ledger = LaunchLedger(paths, me, self.began)
        self._from_steps: dict[int, int | None] = {}
        self._abandoned: list[tuple[int, Step, set[str]]] = []
        """Steps left running (a lost node): srun may still say late which node failed."""
        self.world = cfg.slurm.ntasks
        self.stopping = False
        self._requeueing = False
        self._step: Step | None = None
        self._lock = threading.Lock()
        self._standby = Standby(
            launcher, enabled=standby_fits(cfg), after_s=cfg.fault.standby_after_s
        )

    # --- signals ---------------------------------------------------------------------------

    def install_signals(self) -> None:
        """TERM and INT: stop launching (passed on to local ranks); USR1/USR2: passed on to
        local ranks, ignored on Slurm (Slurm signals the step itself). Caught, not ignored, so
        srun and the ranks start with Slurm's defaults."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            if signal.getsignal(sig) is signal.SIG_IGN and sig is signal.SIGINT:
                continue  # started with Ctrl-C ignored: whoever started it answers it
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self._requeueing:
            return  # our own requeue's SIGTERM
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
        step = self._step
        if step is not None:
            step.forward(signum)

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Launch until the job ends; the job's exit status."""
        try:
            return self._launches()
        finally:
            self._standby.dismiss()

    def _launches(self) -> int:
        bad = self._with_lemons(self._still_avoidable(read_bad_nodes(self.paths, self.me.job_ref)))
        launch = 0
        overlap = False
        while True:
            if self.stopping or self.cancelled():
                log.info("supervisor: stopping; no new launch")
                return 0
            plan = self._plan(launch, self.launcher.nodes(), list(bad), overlap)
            self.world = plan.nodes * plan.tasks_per_node
            watch, launched_at, lpaths = self._run_launch(plan, bad)
            nxt = self._conclude(plan, watch, launched_at, lpaths, bad)
            if nxt is None:
                self._late_words()
                return watch.code if watch.code is not None else 0
            if isinstance(nxt, Restart):
                launch += 1
                # Slurm keeps a failed step's record (and its hold on the CPUs) until the lost
                # node is declared down, though its tasks are gone: the next step shares them.
                overlap = True
                continue
            if isinstance(nxt, Requeue):
                return self._requeue(nxt)
            return nxt.exit_code

    def _plan(self, launch: int, alloc: Sequence[str], bad: Sequence[str], overlap: bool) -> Plan:
        """Launch ``launch`` on ``alloc`` without the ``bad`` nodes: a ``slurm.min_nodes``
        allocation may hold fewer nodes than ``slurm.nodes``, and trains on them."""
        usable = len([n for n in alloc if n not in bad])  # 0: none named (a local run)
        nodes = nodes_for_launch(self.cfg.slurm, usable)
        exclude = tuple(n for n in bad if n in alloc)
        return Plan(launch, nodes, self.cfg.slurm.tasks_per_node, exclude, overlap)

    def _still_avoidable(self, bad: dict[str, str]) -> dict[str, str]:
        """The nodes found bad before this attempt (a requeued job), while this allocation has
        enough others to leave them out. Slurm gave them to it again when it could not leave
        them out (``ExcNodeList`` is asked only while the partition keeps enough nodes): then
        every launch short of them would be refused, and they are tried again."""
        alloc = self.launcher.nodes()
        healthy = [n for n in alloc if n not in bad]
        needed = self.cfg.slurm.min_nodes or self.cfg.slurm.nodes
        if not bad or not alloc or len(healthy) >= needed:
            return bad
        log.warning(
            "supervisor: the nodes found bad before (%s) are in this allocation again and it "
            "has %d other(s) of the %d a launch needs: trying them again",
            ", ".join(sorted(bad)), len(healthy), needed,
        )  # fmt: skip
        return {}

    # --- the lemon record (across runs) ----------------------------------------------------

    def _with_lemons(self, bad: dict[str, str]) -> dict[str, str]:
        """``bad`` and the lemon record's nodes this allocation's launches leave out
        (:func:`~hpc_ddp.lemons.record.launch_exclusion`). A record that cannot be read only
        warns."""
        if not self.cfg.fault.lemon_nodes:
            return bad
        from hpc_ddp.lemons.record import launch_exclusion
        from hpc_ddp.lemons.store import read_record, where

        record = read_record(where(self.env))
        lemons, said = launch_exclusion(
            record.values, alloc=self.launcher.nodes(), bad=bad, now=self._clock(),
            needed=self.cfg.slurm.min_nodes or self.cfg.slurm.nodes,
            window_s=self.cfg.fault.lemon_window_days * 86400,
        )  # fmt: skip
        for line in (*record.warnings, *said):
            log.warning("supervisor: %s", line)
        return {**bad, **lemons} if lemons else bad

    def _remember(self, plan: Plan, finding: Finding, own_error: bool) -> None:
        """Add the nodes a fault points at to the lemon record (a Slurm job's only: a local
        run has one machine to avoid). A record that cannot be written only warns."""
        if not self.cfg.fault.lemon_nodes or self.me.job_id is None:
            return
        from hpc_ddp.lemons.record import fault_entries
        from hpc_ddp.lemons.store import add_entries, where

        b, root = finding.blame, str(self.paths.root)
        entries = fault_entries(
            finding.cause.value, b.nodes, node_level=b.node_level, own_error=own_error,
            launch_nodes=plan.nodes, evidence=b.evidence, run=recorded_run_id(self.paths) or root,
            run_dir=root, job=self.me.job_ref, time=b.detected_at or self._clock(),
        )  # fmt: skip
        for warning in add_entries(where(self.env), entries):
            log.warning("supervisor: %s", warning)

    def _launch_env(self, launch: int) -> tuple[LaunchPaths, dict[str, str]]:
        lpaths = self.paths.launch(launch_key(self.me.tag or self.me.job_ref, self.me.restart,
                                              launch))  # fmt: skip
        env = {**self.env, LAUNCH_ENV: str(launch), SUPERVISED_ENV: "1",
               LAUNCH_DIR_ENV: str(lpaths.root)}  # fmt: skip
        return lpaths, env

    def _run_launch(
        self, plan: Plan, bad: Mapping[str, str]
    ) -> tuple[LaunchWatch, float, LaunchPaths]:
        lpaths, env = self._launch_env(plan.launch)
        prepare_launch(lpaths, self.world)
        from_step = newest_step(self.paths.checkpoints, run_id=recorded_run_id(self.paths))
        self._from_steps[plan.launch] = from_step
        launched_at = self._clock()
        alloc = self.launcher.nodes()
        self.ledger.start(
            plan.launch,
            nodes=",".join(n for n in alloc if n not in plan.exclude),
            alloc_nodes=len(alloc) or None,
            excluded=plan.exclude,
            world_size=self.world,
            from_step=from_step,
            now=launched_at,
        )
        # Not "from step N": the ranks choose, after this look, with their full check. A
        # checkpoint committed after it (a straggler of the launch before) or one their check
        # passes over makes them resume elsewhere, and their own start line says where.
        log.info("supervisor: %s", launch_words(plan, from_step))
        called = self._standby.call(plan, alloc)
        with self._lock:
            self._step = called or self.launcher.start(plan, env)
        nxt_paths, nxt_env = self._launch_env(plan.launch + 1)
        nxt = Plan(plan.launch + 1, plan.nodes, plan.tasks_per_node, plan.exclude, overlap=True)
        self._standby.arm(nxt, nxt_env, nxt_paths.standby_call)
        watch = self._watch(self._step, lpaths, plan, bad)
        return watch, launched_at, lpaths

    def _warm_next(
        self,
        plan: Plan,
        fault: FaultRecord,
        bad: Mapping[str, str],
        beats: Mapping[int, Beat | None],
    ) -> None:
        """A fault was found: start the next launch's processes now, where it will most likely
        run (:func:`~hpc_ddp.fault.plan.likely_exclusion`), so they load while this launch is
        ended and its survivors save. Too few nodes left: nothing (a requeue follows). Only
        once every rank has beaten: the step's id is then known from the beats, so ending it
        never takes the new standby's step for it."""
        if len(beats) < self.world or any(b is None for b in beats.values()):
            return
        alloc = self.launcher.nodes()
        newly = likely_exclusion(
            fault,
            spare=spare_free(alloc, bad, fault.nodes, plan.nodes),
            previous=self.ledger.previous_blame(self.ledger.attempts(), plan.launch),
            enabled=self.cfg.fault.exclude_bad_nodes,
            launch_nodes=plan.nodes,
        )
        out = [*bad, *(n for n in newly if n not in bad)]
        if alloc and len([n for n in alloc if n not in out]) < (
            self.cfg.slurm.min_nodes or plan.nodes
        ):
            return  # too few nodes left: a requeue follows
        self._standby.prepare(self._plan(plan.launch + 1, alloc, out, overlap=True), alloc)

    def _watch(
        self, step: Step, lpaths: LaunchPaths, plan: Plan, bad: Mapping[str, str]
    ) -> LaunchWatch:
        """Follow the launch until it is over; end it once a fault is known."""
        watch = LaunchWatch()
        detection = Detection(
            lpaths, self.world, self.cfg.fault, self._clock, answers=step.node_answers
        )
        seen_ends = 0
        quiet = StaleWatch()
        beats: dict[int, Beat | None] = {}
        notes: dict[int, ExitNote | None] = {}
        next_read = 0.0
        began = time.monotonic()
        while True:
            code = step.poll()
            if code is not None:
                watch.code = code
                self._gone(watch, detection)
                return watch
            if step.refused() is not None:
                time.sleep(POLL_S)
                continue
            now, mono = self._clock(), time.monotonic()
            if mono >= next_read:  # every rank's beat, once a beat
                beats = read_beats(lpaths, self.world)
                notes = read_exit_notes(lpaths, self.world)
                for rank, beat in beats.items():
                    quiet.observe(rank, beat, mono)
                next_read = mono + self.cfg.fault.beat_s
                self._standby.tend(beats, mono, settled=watch.fault is None and not self.stopping)
            ends = _task_ends(step)
            if watch.fault is None and not self.stopping:
                watch.fault = detection.find(
                    lost=step.node_failures(),
                    new_ends=ends[seen_ends:],
                    ends=ends,
                    beats=beats,
                    notes=notes,
                    quiet=quiet,
                    mono=mono,
                    waited=mono - began,
                )
                seen_ends = len(ends)
                if watch.fault is not None:
                    watch.fault_at = now
                    self._declare(lpaths, watch.fault)
                    self._warm_next(plan, watch.fault, bad, beats)
            if watch.fault is None:
                self._late_words()
                time.sleep(POLL_S)
                continue
            if watch.end_step(step, beats, ends, now, world=self.world, cfg=self.cfg.fault):
                reported = {n for n, _ in step.node_failures()}
                self._abandoned.append((self._launch_of(lpaths), step, reported))
                return watch
            time.sleep(POLL_S)

    def _gone(self, watch: LaunchWatch, detection: Detection) -> None:
        """Every process of the launch is gone: a fault none was found for yet
        (:meth:`~hpc_ddp.fault.detection.Detection.after_exit`), unless the job is stopping."""
        if watch.fault is not None or self.stopping:
            return
        watch.fault = detection.after_exit()
        if watch.fault is not None:
            watch.fault_at = self._clock()

    def _declare(self, lpaths: LaunchPaths, record: FaultRecord) -> None:
        """Put the fault in the supervisor's beat: every rank adopts it at its next beat."""
        log.error(
            "supervisor: %s in launch %s: %s (%s)",
            record.kind,
            lpaths.root.name,
            ", ".join(f"rank {r}" for r in record.ranks) or ",".join(record.nodes),
            record.why,
        )
        beat = Beat(rank=-1, node="supervisor", pid=os.getpid(), seq=1, time=self._clock())
        with contextlib.suppress(OSError):
            write_beat(lpaths.supervisor, replace(beat, fault=record))

    # --- after the launch --------------------------------------------------------------------

    def _conclude(
        self,
        plan: Plan,
        watch: LaunchWatch,
        launched_at: float,
        lpaths: LaunchPaths,
        bad: dict[str, str],
    ) -> Next | None:
        """Record how the launch ended; what follows (None: the job ends with its code)."""
        attempts = self.ledger.attempts()
        mine = [a for a in attempts if self.ledger.is_mine(a, plan.launch, launched_at)]
        entry = mine[-1] if mine else None
        code = watch.code
        refused = self._step.refused() if self._step is not None else None
        beats = read_beats(lpaths, self.world)
        # A command: child's steps are in its session's exit note, not its parent's beat.
        notes = read_exit_notes(lpaths, self.world).values()
        steps = [b.step for b in [*beats.values(), *notes] if b is not None]
        reached = max(steps) if steps else None
        ckpt = newest_checkpoint(self.paths.checkpoints, run_id=recorded_run_id(self.paths))
        clean = watch.fault is None and ended_on_purpose(code, entry)
        if clean or (self.stopping and watch.fault is None):
            cause = entry.cause if entry is not None and entry.cause is not None else None
            said = entry.message if entry is not None else None
            message = said or f"the launch ended with exit status {code}"
            self.ledger.end(
                plan.launch, launched_at, cause or EndCause.UNKNOWN, None, reached, ckpt, "stop",
                message,
            )  # fmt: skip
            return None
        if refused is not None:
            return self._refused(plan, launched_at, refused, reached, ckpt, bad)
        finding = self._blame(watch, beats, lpaths, entry)
        own_error = self._own_error(watch, finding)
        self._remember(plan, finding, own_error)
        previous = self.ledger.previous_blame(attempts, plan.launch)
        alloc = self.launcher.nodes()
        newly = exclusion(
            finding,
            own_error=own_error,
            spare=spare_free(alloc, bad, finding.blame.nodes, plan.nodes),
            previous=previous,
            enabled=self.cfg.fault.exclude_bad_nodes,
            launch_nodes=plan.nodes,
        )
        for node in newly:
            bad.setdefault(node, finding.blame.evidence)
        if newly:
            write_bad_nodes(self.paths, self.me.job_ref, bad)
        history = self.ledger.history(
            attempts, entry, plan.launch, launched_at, finding, reached, ckpt,
            self._from_steps.get(plan.launch),
        )  # fmt: skip
        healthy = len([n for n in alloc if n not in bad]) if alloc else plan.nodes
        budget = Budget(
            self.cfg.fault, self.cfg.requeue, self.me.restart, self.me.job_id is not None
        )
        nxt = decide_next(
            finding,
            history,
            healthy=healthy,
            needed=self.cfg.slurm.min_nodes or plan.nodes,
            bad=[n for n in bad if not alloc or n in alloc],
            budget=budget,
            run_dir=str(self.paths.root),
        )
        cause = recorded_cause(nxt, finding)
        self.ledger.end(
            plan.launch, launched_at, cause, finding.blame, reached, ckpt, nxt.word, nxt.message
        )
        log.error("supervisor: %s", nxt.message)
        return nxt

    def _own_error(self, watch: LaunchWatch, finding: Finding) -> bool:
        """The program failed on its own (an exception, a non-zero exit): not its node's
        fault, unlike a death by signal or a hang."""
        if finding.cause is not EndCause.CRASH:
            return False
        if watch.fault is not None and watch.fault.kind in ("crash", "early_exit"):
            return True
        step = self._step
        ends = _task_ends(step) if step is not None else []
        blamed = set(finding.blame.ranks)
        return any(e.rank in blamed and e.exit_code is not None for e in ends)

    def _blame(
        self,
        watch: LaunchWatch,
        beats: Mapping[int, Beat | None],
        lpaths: LaunchPaths,
        entry: Attempt | None,
    ) -> Finding:
        step = self._step
        ends = _task_ends(step) if step is not None else []
        lost = list(step.node_failures()) if step is not None else []
        fault = watch.fault or read_fault(lpaths.fault)
        silent = [r for r in watch.silent if (b := beats.get(r)) is None or not b.exited]
        finding = assign_blame(
            self.world,
            beats,
            silent=silent,
            task_ends=ends,
            node_failures=lost,
            fault=fault,
            settled=True,
            now=self._clock(),
        )
        if finding.cause is not EndCause.NODE_FAIL and finding.blame.nodes:
            try:
                down = self.launcher.down(finding.blame.nodes)
            except BackendError as exc:
                log.warning("supervisor: could not ask the scheduler about the nodes: %s", exc)
                down = {}
            finding = with_scheduler_words(finding, down)
        finding = with_own_words(finding, entry)
        if finding.blame.detected_at is None or watch.fault_at is not None:
            detected = watch.fault.time if watch.fault is not None else watch.fault_at
            finding = with_detected_at(finding, detected)
        return finding

    def _refused(
        self,
        plan: Plan,
        launched_at: float,
        why: str,
        reached: int | None,
        ckpt: Checkpoint | None,
        bad: Mapping[str, str],
    ) -> Next:
        """srun could not create the step (:func:`~hpc_ddp.fault.plan.decide_refused`)."""
        nxt, blame = decide_refused(
            why,
            tuple(bad),
            scheduled=self.me.job_id is not None,
            requeues_left=self.me.restart < self.cfg.requeue.max_requeues,
            now=self._clock(),
        )
        self.ledger.end(
            plan.launch, launched_at, nxt.cause, blame, reached, ckpt, nxt.word, nxt.message
        )
        return nxt

    def _requeue(self, nxt: Requeue) -> int:
        """Requeue the job (its own SIGTERM ignored) and ask Slurm to avoid the bad nodes."""
        self._requeueing = True
        error = self.launcher.requeue(nxt.exclude)
        if error is not None:
            log.error("supervisor: could not requeue: %s", error)
            return 1
        log.info(
            "supervisor: requeued%s", f", avoiding {','.join(nxt.exclude)}" if nxt.exclude else ""
        )
        # Slurm ends this batch script now (SIGTERM ignored, then SIGKILL after KillWait).
        return 0

    # --- ledger ----------------------------------------------------------------------------

    @staticmethod
    def _launch_of(lpaths: LaunchPaths) -> int:
        return int(lpaths.root.name.rsplit(".", 1)[-1])

    def _late_words(self) -> None:
        """srun's late word on the nodes lost under abandoned steps (SlurmdTimeout after the
        node went silent): each becomes a ``node_fail`` event on its launch."""
        for launch, step, reported in self._abandoned:
            for node, why in step.node_failures():
                if node not in reported:
                    reported.add(node)
                    self.ledger.node_failure(launch, node, why)


__all__ = [
    "Plan",
    "Supervisor",
    "launch_words",
    "prepare_launch",
    "read_bad_nodes",
]
