"""A scripted Slurm for tests: a :class:`~hpc_ddp.backends.slurm.client.Runner` that runs nothing.

:class:`FakeSlurm` records every argv it is given and answers ``sbatch``, ``squeue``,
``sacct``, ``scontrol`` (``show job``, ``show config``, ``requeue``) and ``scancel`` from a job
table it keeps, the way Slurm 22.05 prints them, so the code under test parses real-looking
output. Failures are injected per command::

    from hpc_ddp.backends.slurm.fake import FakeSlurm

    slurm = FakeSlurm()
    job = slurm.add_job("78", state=JobState.RUNNING)
    slurm.fail("scontrol requeue", "scontrol: error: Unable to contact slurm controller")
    client = slurm.client()                       # a SlurmClient over this fake
    ...                                           # code under test, e.g. Coordinator(..., client)
    assert slurm.commands() == ["scontrol show job -o 78", "scontrol requeue 78"]

A scripted answer (:meth:`FakeSlurm.script`, :meth:`FakeSlurm.fail`) is used once, by the next
command starting with its words, before the job table is consulted. Use it in unit tests of
your own logic; whether Slurm itself behaves so is for tests on a real cluster to show.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc_ddp.backends.arrays import parse_index_ranges
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.jobstate import CompletedCommand

Answer = str | tuple[int, str] | BaseException | None
"""A scripted answer: stdout (exit 0), ``(exit code, stderr)``, an exception to raise (e.g.
:class:`~hpc_ddp.errors.SlurmUnavailableError`, as for a command not on PATH), or None: answer
from the job table as if nothing were scripted (``script("sbatch", None, (1, "refused"))``
lets one submission through and refuses the next)."""

INVALID_JOB = "Invalid job id specified"
UNREACHABLE = "Unable to contact slurm controller (connect failure)"
"""What Slurm's commands print when slurmctld does not answer (the client's "unavailable")."""


@dataclass
class FakeJob:
    """One row of the fake job table (mutable: the fake moves it through its states)."""

    job_id: str
    state: JobState = JobState.PENDING
    restart_count: int = 0
    reason: str = "None"
    nodes: str = ""
    elapsed: str = "0:00"
    exit_code: str = "0:0"
    command: str = ""
    array_job_id: str | None = None
    array_task_id: str | None = None
    """Task index, or the pending range as squeue prints it (``2-7%2``)."""
    preempt_time: str = "None"
    fields: dict[str, str] = field(default_factory=dict)
    """Extra ``scontrol show job`` fields (they override the ones derived from the above)."""
    signals: list[str] = field(default_factory=list)
    """Signals sent by ``scancel --signal``, in order."""
    in_queue: bool = True
    """False: slurmctld has purged the finished job (``MinJobAge``): only sacct knows it."""

    @property
    def ref(self) -> str:
        """``123`` or ``120_3``."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def matches(self, ref: str) -> bool:
        """Slurm's reading of a job id: the job, one array task (also one still in the pending
        range: ``scancel 120_5`` reaches it), or every task of an array."""
        if ref in (self.job_id, self.ref, self.array_job_id):
            return True
        array, _, task = ref.partition("_")
        pending = self.array_task_id or ""
        if array != self.array_job_id or not task.isdigit() or pending.isdigit():
            return False
        try:
            return int(task) in parse_index_ranges(pending)
        except ValueError:
            return False


class FakeSlurm:
    """A :class:`~hpc_ddp.backends.slurm.client.Runner` answering from a scripted job table."""

    def __init__(
        self, *, max_array_size: int = 1001, accounting: bool = True, first_job_id: int = 1000
    ) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[tuple[str, ...]] = []
        self.scripts: list[str] = []
        """The script paths sbatch was given, in order."""
        self.max_array_size = max_array_size
        self.accounting = accounting
        self.node_states: dict[str, str] = {}
        """``sinfo``'s state of each node (``down*``, ``idle``...); a node not named here is
        ``allocated``."""
        self._next_id = first_job_id
        self._scripted: list[tuple[tuple[str, ...], Answer]] = []

    # --- scripting ------------------------------------------------------------------------

    def add_job(self, job_id: str, **attrs: object) -> FakeJob:
        """Put a job in the table (``FakeJob`` fields as keywords) and return it."""
        job = FakeJob(job_id, **attrs)  # type: ignore[arg-type]
        self.jobs[job.ref] = job
        return job

    def script(self, command: str, *answers: Answer) -> None:
        """Answer the next commands starting with ``command``'s words with ``answers``, in
        order, one each (``script("scontrol show job", "JobId=1 JobState=RUNNING")``)."""
        words = tuple(command.split())
        self._scripted.extend((words, answer) for answer in answers)

    def fail(
        self, command: str, stderr: str = UNREACHABLE, *, code: int = 1, times: int = 1
    ) -> None:
        """Make the next ``times`` commands starting with ``command`` exit ``code``."""
        self.script(command, *[(code, stderr)] * times)

    def client(self, *, timeout: float = 5.0) -> SlurmClient:
        """A :class:`SlurmClient` that runs its commands here."""
        return SlurmClient(self, timeout=timeout)

    def commands(self, prefix: str = "") -> list[str]:
        """The commands run so far, joined by spaces; only those starting with ``prefix``."""
        joined = (" ".join(argv) for argv in self.calls)
        return [c for c in joined if c.startswith(prefix)]

    # --- the runner -----------------------------------------------------------------------

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        """Record ``argv`` and answer it (see the module docstring)."""
        del timeout
        args = tuple(argv)
        self.calls.append(args)
        for index, (words, answer) in enumerate(self._scripted):
            if args[: len(words)] == words:
                del self._scripted[index]
                if answer is None:
                    break
                return _reply(args, answer)
        handler = {
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "sacct": self._sacct,
            "scancel": self._scancel,
            "scontrol": self._scontrol,
            "sinfo": self._sinfo,
        }.get(args[0])
        if handler is None:
            raise NotImplementedError(f"FakeSlurm does not answer {' '.join(args)!r}")
        return handler(args)

    def _sbatch(self, args: tuple[str, ...]) -> CompletedCommand:
        script = args[-1]
        job_id = str(self._next_id)
        self._next_id += 1
        if "--test-only" in args:
            said = f"sbatch: Job {job_id} to start at 2026-01-01T00:00:00 using 1 processors"
            return CompletedCommand(args, 0, "", said + "\n")
        self.scripts.append(script)
        array = _array_spec(Path(script))
        self.add_job(
            job_id,
            command=script,
            reason="None",
            array_job_id=job_id if array else None,
            array_task_id=array,
        )
        return CompletedCommand(args, 0, f"{job_id}\n", "")

    def _find(self, refs: str, *, purged: bool = False) -> list[FakeJob]:
        wanted = refs.split(",")
        return [
            j
            for j in self.jobs.values()
            if (j.in_queue or purged) and any(j.matches(r) for r in wanted)
        ]

    def _squeue(self, args: tuple[str, ...]) -> CompletedCommand:
        found = self._find(_option(args, "-j"))
        if not found:
            return CompletedCommand(args, 1, "", f"slurm_load_jobs error: {INVALID_JOB}\n")
        lines = [
            "|".join(
                (
                    j.job_id,
                    j.array_job_id or j.job_id,
                    j.array_task_id or "N/A",
                    j.state.value,
                    j.nodes or "(null)",
                    j.elapsed,
                    str(j.restart_count),
                    j.reason,
                    j.command or "(null)",
                )
            )
            for j in found
        ]
        return CompletedCommand(args, 0, "".join(f"{line}\n" for line in lines), "")

    def _sacct(self, args: tuple[str, ...]) -> CompletedCommand:
        if not self.accounting:
            said = "sacct: error: Slurm accounting storage is disabled\n"
            return CompletedCommand(args, 1, "", said)
        # sacct -X -D -o JobID,State,ExitCode,Elapsed,Submit,SubmitLine (no submit times kept)
        lines = [
            f"{j.ref}|{j.state.value}|{j.exit_code}|{j.elapsed}|Unknown|"
            + (f"sbatch --parsable {j.command}" if j.command else "")
            for j in self._find(_option(args, "-j"), purged=True)
        ]
        return CompletedCommand(args, 0, "".join(f"{line}\n" for line in lines), "")

    def _scancel(self, args: tuple[str, ...]) -> CompletedCommand:
        # As Slurm reads it: `scancel --me` cancels every job of the user, here every job.
        mine = "--me" in args
        found = [j for j in self.jobs.values() if j.in_queue] if mine else self._find(args[-1])
        if not found:
            said = f"scancel: error: Kill job error on job id {args[-1]}: {INVALID_JOB}\n"
            return CompletedCommand(args, 1, "", said)
        signal = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
        for job in found:
            if signal is not None:
                job.signals.append(signal)
            elif not job.state.finished:
                job.state = JobState.CANCELLED
        return CompletedCommand(args, 0, "", "")

    def _scontrol(self, args: tuple[str, ...]) -> CompletedCommand:
        if args[1:3] == ("show", "config"):
            return CompletedCommand(
                args, 0, f"MaxArraySize            = {self.max_array_size}\n", ""
            )
        # `scontrol update JobId=J Key=Value...` names its job by keyword; the rest last.
        ref = next((a[len("JobId=") :] for a in args if a.startswith("JobId=")), args[-1])
        found = self._find(ref)
        if not found:
            return CompletedCommand(args, 1, "", f"{args[1]}: error: {INVALID_JOB}\n")
        if args[1:3] == ("show", "job"):
            return CompletedCommand(args, 0, _show(found[0]) + "\n", "")
        if args[1] == "update":
            for job in found:  # ExcNodeList=... and the like: kept as the job's fields
                job.fields.update(
                    dict(a.split("=", 1) for a in args[2:] if "=" in a and a != f"JobId={ref}")
                )
            return CompletedCommand(args, 0, "", "")
        if args[1] == "requeue":
            for job in found:
                # Slurm stops the job and queues it again under the same id, one restart more.
                job.state = JobState.PENDING
                job.restart_count += 1
                job.reason = "BeginTime"
            return CompletedCommand(args, 0, "", "")
        raise NotImplementedError(f"FakeSlurm does not answer {' '.join(args)!r}")

    def _sinfo(self, args: tuple[str, ...]) -> CompletedCommand:
        # sinfo -h -N -n NODES -o '%N|%T', or -p PARTITION: every node the fake knows;
        # sinfo -h -o %P: its one partition, the default
        if _option(args, "-o") == "%P":
            return CompletedCommand(args, 0, "debug*\n", "")
        nodes = _option(args, "-n").split(",") if "-n" in args else list(self.node_states)
        lines = [f"{n}|{self.node_states.get(n, 'allocated')}\n" for n in nodes if n]
        return CompletedCommand(args, 0, "".join(lines), "")


def _reply(
    args: tuple[str, ...], answer: str | tuple[int, str] | BaseException
) -> CompletedCommand:
    if isinstance(answer, BaseException):
        raise answer
    if isinstance(answer, str):
        return CompletedCommand(args, 0, answer if answer.endswith("\n") else answer + "\n", "")
    code, stderr = answer
    return CompletedCommand(args, code, "", stderr if stderr.endswith("\n") else stderr + "\n")


def _option(args: tuple[str, ...], name: str) -> str:
    return args[args.index(name) + 1] if name in args else ""


def _array_spec(script: Path) -> str | None:
    """The ``#SBATCH --array=`` range of a script (as squeue shows a pending range), if any."""
    try:
        text = script.read_text()
    except OSError:
        return None
    match = re.search(r"^#SBATCH\s+--array[= ](\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


def _show(job: FakeJob) -> str:
    """``scontrol show job -o``: one line of ``Key=Value`` pairs."""
    pairs = {"JobId": job.job_id}
    if job.array_job_id is not None:
        pairs |= {"ArrayJobId": job.array_job_id, "ArrayTaskId": job.array_task_id or ""}
    pairs |= {
        "JobState": job.state.value,
        "Reason": job.reason,
        "Requeue": "1",
        "Restarts": str(job.restart_count),
        "PreemptTime": job.preempt_time,
        "NodeList": job.nodes or "(null)",
        "Command": job.command or "(null)",
        **job.fields,
    }
    return " ".join(f"{key}={value}" for key, value in pairs.items())
