"""One srun step of a running job, started, read and ended by the supervisor (``fault:``).

:class:`SrunLauncher` starts each launch as ``srun --nodes=N --ntasks=... [--exclude=BAD]
[--overlap] <the script's srun options> <task argv>`` inside the allocation the batch script
holds, and :class:`SrunStep` follows it: srun's stderr is copied line by line to the batch
script's own (so ``logs/batch-<job>.err`` keeps srun's words, as without a supervisor) and read
as it comes (:func:`~hpc_ddp.backends.slurm.postmortem.parse_srun_line`): which task ended how,
which node failed, whether the step could start at all. Signals reach every task of the step through
``scancel --signal=SIG JOB.STEP`` (on every node, in the background: with a lost node in the
step Slurm may take seconds to answer).

Measured on Slurm 22.05: ``scancel --signal`` of a step takes about 0.07 s and reaches every
process of each task; a step that lost a node stays in the controller until the node is
declared down, so the next step starts with ``--overlap`` (at once) rather than waiting.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from hpc_ddp.backends.base import LaunchShape, TaskEnd
from hpc_ddp.backends.nodelist import parse_nodelist
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.jobstate import DOWN_STATES
from hpc_ddp.backends.slurm.postmortem import (
    NodeFailure,
    StepRefused,
    TaskFailure,
    exit_code_of,
    parse_srun_line,
)
from hpc_ddp.errors import SlurmError

log = logging.getLogger("hpc_ddp.supervisor")

KILL_GRACE_S = 30.0
"""A step whose id is unknown is ended through srun (SIGINT twice); how long srun then gets to
return before it is killed itself, the last resort."""
INTERRUPT_GAP_S = 0.2
"""The gap between srun's two SIGINTs (a second one within a second ends its step)."""


def task_end_of(failure: TaskFailure) -> TaskEnd:
    """srun's ``task N: REASON`` as a task end (its exit code when it exited, None for a
    signal)."""
    return TaskEnd(failure.rank, failure.node, failure.reason, exit_code_of(failure.reason))


SLURMD_PROBE_S = 1.0
"""How long a node's slurmd may take to accept a connection before the node counts as lost."""


@dataclass
class _Seen:
    ends: list[TaskEnd] = field(default_factory=list)
    nodes: list[tuple[str, str]] = field(default_factory=list)
    refused: str | None = None


class SrunStep:
    """A running srun step (see the module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        client: SlurmClient,
        job_id: str,
        *,
        known_steps: Sequence[int] = (),
        out: IO[str] | None = None,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self._known = set(known_steps)
        self._out = out if out is not None else sys.stderr
        self._seen = _Seen()
        self._lock = threading.Lock()
        self._step: int | None = None
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, name="srun-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with contextlib.suppress(OSError, ValueError):
                self._out.write(line)
                self._out.flush()
            said = parse_srun_line(line)
            with self._lock:
                if isinstance(said, list):
                    for failure in said:
                        if all(e.rank != failure.rank for e in self._seen.ends):
                            self._seen.ends.append(task_end_of(failure))
                elif isinstance(said, NodeFailure):
                    if all(n != said.node for n, _ in self._seen.nodes):
                        self._seen.nodes.append((said.node, said.reason))
                elif isinstance(said, StepRefused):
                    self._seen.refused = said.reason

    def poll(self) -> int | None:
        """srun's exit status (128 + N for a death by signal N) once it has ended."""
        code = self.proc.poll()
        if code is None:
            return None
        self._reader.join(timeout=2.0)  # every line srun wrote is read
        return 128 - code if code < 0 else code

    def task_ends(self) -> list[TaskEnd]:
        """Tasks srun said ended badly, in order."""
        with self._lock:
            return list(self._seen.ends)

    def node_failures(self) -> list[tuple[str, str]]:
        """Nodes srun said failed under the step."""
        with self._lock:
            return list(self._seen.nodes)

    def node_answers(self, node: str) -> bool | None:
        """Whether ``node``'s slurmd takes a connection now, asked of it directly and not of
        the controller, which notices a lost node only after ``SlurmdTimeout``: a rank that
        died with its node is then a lost node at once, not a crash. None: not known (its
        address could not be read)."""
        try:
            address = self.client.slurmd_address(node)
        except (SlurmError, ValueError, IndexError):
            return None
        try:
            with socket.create_connection(address, timeout=SLURMD_PROBE_S):
                return True
        except OSError:
            return False

    def refused(self) -> str | None:
        """Why srun could not create the step, if it could not."""
        with self._lock:
            return self._seen.refused

    def step_id(self, beats: Mapping[int, Any]) -> int | None:
        """The step's id: the one its tasks report in their beats, else the newest step of the
        job that was not running before this one started."""
        if self._step is not None:
            return self._step
        for beat in beats.values():
            step = getattr(beat, "slurm_step", None) if beat is not None else None
            if step is not None and str(step).isdigit():
                self._step = int(step)
                return self._step
        with contextlib.suppress(SlurmError):
            new = [s for s in self.client.job_steps(self.job_id) if s not in self._known]
            if new:
                self._step = max(new)
        return self._step

    def signal(self, name: str, beats: Mapping[int, Any]) -> None:
        """``scancel --signal=NAME JOB.STEP`` in the background (nothing without a step id)."""
        step = self.step_id(beats)
        if step is None:
            return
        _background(self._signal_step, step, name)

    def _signal_step(self, step: int, name: str) -> None:
        try:
            self.client.signal_step(self.job_id, step, name)
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return  # the step has ended meanwhile: nothing left to signal
            said = str(exc).split("HINT:", 1)[0].strip().replace("\n", "; ")
            log.warning("supervisor: scancel --signal=%s %s.%s: %s", name, self.job_id, step, said)

    def kill(self, beats: Mapping[int, Any]) -> None:
        """End the step: SIGKILL to its tasks (``scancel``), or, with no step id known, srun's
        own way to end its step. srun itself is left to return."""
        step = self.step_id(beats)
        _background(self._kill, step)

    def _kill(self, step: int | None) -> None:
        # srun is not killed while its step's tasks end: it waits for each task's exit
        # message from slurmstepd, and a step whose srun is gone cannot deliver them
        # ("Failed to send MESSAGE_TASK_EXIT"), so at the job's end slurmd drains the node
        # ("Kill task failed"): an admin's page on a real cluster. Seen under load with srun
        # killed 5 s after the scancel. The supervisor does not wait for srun (it abandons
        # the step), and the next launch starts with --overlap.
        if step is not None:
            self._signal_step(step, "KILL")
            return
        for _ in range(2):  # a second SIGINT within a second: srun SIGKILLs every task
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
            time.sleep(INTERRUPT_GAP_S)
        deadline = time.monotonic() + KILL_GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()

    def forward(self, signum: int) -> None:
        """Nothing: Slurm signals its steps itself (cancel, requeue, time limit)."""
        del signum

    def abandon(self) -> None:
        """Leave srun running (it waits for Slurm to settle a lost node); the job's end
        reaps it."""


def _background(target: Any, *args: Any) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()


class SrunLauncher:
    """Starts launches as srun steps of the batch script's allocation: the Slurm backend's
    node face (:class:`~hpc_ddp.backends.base.Launcher`)."""

    def __init__(
        self,
        argv: Sequence[str],
        client: SlurmClient,
        *,
        job_id: str,
        job_ref: str,
        nodes: Sequence[str],
    ) -> None:
        if not argv or not argv[0].endswith("srun"):
            raise SlurmError(
                f"hpc-ddp supervise needs an srun command after `--`, got {list(argv)[:3]}. "
                "HINT: run it as the rendered job.sbatch does: `... supervise RUN_DIR -- srun ...`"
            )
        self.argv = list(argv)
        self.client = client
        self.job_id = job_id
        self.job_ref = job_ref
        self._nodes = tuple(nodes)
        self._steps: list[SrunStep] = []

    def start(self, plan: LaunchShape, env: Mapping[str, str]) -> SrunStep:
        """``srun`` with the launch's shape inserted right after the command name."""
        shape = [
            f"--nodes={plan.nodes}",
            f"--ntasks={plan.nodes * plan.tasks_per_node}",
            f"--ntasks-per-node={plan.tasks_per_node}",
        ]
        if plan.exclude:
            shape.append(f"--exclude={','.join(plan.exclude)}")
        if plan.overlap:
            shape.append("--overlap")
        known: list[int] = []
        with contextlib.suppress(SlurmError):
            known = self.client.job_steps(self.job_id)
        argv = [self.argv[0], *shape, *self.argv[1:]]
        step = SrunStep(argv, env, self.client, self.job_id, known_steps=known)
        self._steps.append(step)
        return step

    def nodes(self) -> tuple[str, ...]:
        """The job's nodes as Slurm holds them now (``--no-kill`` drops a failed one)."""
        try:
            listed = self.client.show_job(self.job_ref).get("NodeList", "")
            if listed and listed != "(null)":
                return tuple(parse_nodelist(listed))
        except (SlurmError, ValueError) as exc:
            log.warning("supervisor: could not read the job's nodes: %s", exc)
        return self._nodes

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """Of ``nodes``, those Slurm holds down or not responding."""
        states = self.client.node_states(nodes)
        return {n: s for n, s in states.items() if s in DOWN_STATES}

    def requeue(self, exclude: Sequence[str]) -> str | None:
        """``scontrol requeue``, then ``ExcNodeList`` (Slurm takes it once the job is no
        longer running); None, or what failed. Nodes are left out only while the partition
        keeps enough others for the job: a list that left too few would hold it pending
        forever (``BadConstraints``)."""
        avoid = self._avoidable(exclude)
        # The moment the requeue is accepted Slurm SIGTERMs every process of the batch step.
        # Each Slurm command starts with SIGTERM blocked already (client.subprocess_runner), so
        # neither it nor the `scontrol update` after it is cut short; blocked here too, this
        # process's own SIGTERM waits until both have run, then it ignores it as its own
        # requeue's.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            try:
                self.client.requeue(self.job_ref)
            except SlurmError as exc:
                return str(exc).splitlines()[0]
            if avoid:
                try:
                    self.client.exclude_nodes(self.job_ref, avoid)
                except SlurmError as exc:
                    log.warning("supervisor: requeued, but Slurm kept no ExcNodeList: %s", exc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return None

    def _avoidable(self, exclude: Sequence[str]) -> list[str]:
        """``exclude``, if the job's partition has enough nodes besides; else none."""
        if not exclude:
            return []
        try:
            job = self.client.show_job(self.job_ref)
            partition = job.get("Partition", "").split(",")[0]
            needed = int(job.get("NumNodes", "0").split("-")[0] or 0)
            others = [n for n in self.client.partition_nodes(partition) if n not in exclude]
        except (SlurmError, ValueError) as exc:
            log.warning("supervisor: cannot tell whether Slurm can avoid %s: %s", exclude, exc)
            return []
        if len(others) < needed:
            log.warning(
                "supervisor: not asking Slurm to avoid %s: partition %s would keep %d node(s) "
                "for a job of %d",
                ",".join(exclude), partition, len(others), needed,
            )  # fmt: skip
            return []
        return list(exclude)
