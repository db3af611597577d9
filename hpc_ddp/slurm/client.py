"""The one place that runs Slurm's commands: sbatch, squeue, scontrol, scancel, sacct.

Every command goes through an injected :class:`Runner` (argv in, :class:`CompletedCommand` out;
never a shell), so tests swap in a fake and a dry run can show the argv without running it.
Parsing lives in pure functions beside it (``parse_*``), tested on captured output.

Slurm 22.05 is the oldest version served: ``squeue --json`` there ignores ``-j``/``-t``, so the
queue is read as ``squeue -h -j IDS -O ...`` text, which honours both (asking for the whole queue
on every poll loads slurmctld on a real cluster); ``scontrol`` has no ``--json``, and ``sacct``
may be unavailable (no slurmdbd).
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from hpc_ddp.errors import SlurmError, SlurmUnavailableError, SubmissionError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused")
_UNREACHABLE_HINT = (
    "HINT: the Slurm controller did not answer; check `scontrol ping`, or bring the local one "
    "up with `hpc-ddp dev-cluster up`"
)


class JobState(str, Enum):
    """A job's state as Slurm names it (``squeue``, ``sacct``, ``scontrol``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    SUSPENDED = "SUSPENDED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    RESIZING = "RESIZING"
    CONFIGURING = "CONFIGURING"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        """The job will not run again unless someone requeues it by hand."""
        return self in _FINISHED


_FINISHED = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
     JobState.PREEMPTED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.BOOT_FAIL,
     JobState.DEADLINE, JobState.REVOKED}
)  # fmt: skip

# Slurm's long names map to themselves; these are its short codes (squeue %t, sacct -o State%2).
_STATE_CODES = {
    "PD": "PENDING", "R": "RUNNING", "RQ": "REQUEUED", "RH": "REQUEUE_HOLD",
    "RF": "REQUEUE_FED", "SE": "SPECIAL_EXIT", "CG": "COMPLETING", "CD": "COMPLETED",
    "F": "FAILED", "CA": "CANCELLED", "TO": "TIMEOUT", "PR": "PREEMPTED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "S": "SUSPENDED", "BF": "BOOT_FAIL", "DL": "DEADLINE",
    "RV": "REVOKED", "RS": "RESIZING", "CF": "CONFIGURING", "SO": "STAGE_OUT", "ST": "STOPPED",
    "SI": "SIGNALING",
}  # fmt: skip
_STATE_NAMES = {
    **{s.value: s for s in JobState},
    **{c: JobState(n) for c, n in _STATE_CODES.items()},
}
# When later Slurm gives a base state plus flags (["RUNNING", "COMPLETING"]), the flag wins,
# in the order 22.05's job_state_string() checks them, so both versions read the same.
_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
               "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "SIGNALING")  # fmt: skip


def parse_job_state(value: str | Sequence[str] | None) -> JobState:
    """Map Slurm's state text (``RUNNING``, ``CANCELLED by 0``, ``CD``, or a list) to a state."""
    words = [value] if isinstance(value, str) else list(value or ())
    names = [w.split()[0].upper() for w in words if w.strip()]
    for flag in _FLAG_ORDER:
        if flag in names:
            return JobState(flag)
    for name in names:
        if name in _STATE_NAMES:
            return _STATE_NAMES[name]
    logger.debug("unknown Slurm job state %r", value)
    return JobState.UNKNOWN


@dataclass(frozen=True)
class CompletedCommand:
    """What a finished command left behind."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command (argv, no shell) and returns its exit status and output."""

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        """Run ``argv`` to completion, or raise :class:`SlurmUnavailableError`."""
        ...


def subprocess_runner(argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
    """The real :class:`Runner`: :func:`subprocess.run` without a shell."""
    command = shlex.join(argv)
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmUnavailableError(
            f"{argv[0]!r} is not on PATH (running `{command}`). HINT: run hpc-ddp on a login "
            "node of a Slurm cluster (`module load slurm` on some sites), start the local "
            "cluster with `hpc-ddp dev-cluster up`, or use `--backend local`"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailableError(
            f"`{command}` did not finish within {timeout} s. {_UNREACHABLE_HINT}"
        ) from None
    return CompletedCommand(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class SubmitResult:
    """A submission: the job id (``None`` for ``--test-only``) and what sbatch said."""

    command: tuple[str, ...]
    job_id: str | None
    cluster: str | None = None
    message: str = ""
    """sbatch's stderr (for ``--test-only``: ``sbatch: Job 12 to start at ...``)."""


@dataclass(frozen=True)
class JobInfo:
    """One row of squeue: a job, or one task (or pending range) of an array job."""

    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    """Task index, or ``[2-19%2]`` for the array's still-pending range."""
    state: JobState
    reason: str
    nodes: str
    elapsed_s: int | None
    restart_count: int
    command: str = ""
    """The batch script's path as Slurm holds it (``""`` when unknown or ``--wrap``)."""

    @property
    def ref(self) -> str:
        """How Slurm names it: ``123``, ``120_3`` or ``120_[4-9%2]``."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


@dataclass(frozen=True)
class AccountingRecord:
    """One line of sacct: a job, an array task or a step (``123.batch``, ``123.0``)."""

    job_id: str
    state: JobState
    raw_state: str
    """sacct's text, e.g. ``CANCELLED by 1000``."""
    exit_code: str
    elapsed_s: int | None


def parse_sbatch_parsable(stdout: str) -> tuple[str, str | None]:
    """Parse ``sbatch --parsable`` output (``123`` or ``123;cluster``) into (job id, cluster)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    match = re.fullmatch(r"([0-9]+)(?:;(\S+))?", lines[-1]) if lines else None
    if match is None:
        raise SubmissionError(
            f"sbatch --parsable printed {stdout!r}, not a job id ('123' or '123;cluster'). "
            "HINT: a site wrapper around sbatch may print extra text; run the submit command by "
            "hand to see, and check `squeue --me` before submitting again"
        )
    return match.group(1), match.group(2)


SQUEUE_FIELDS = (
    "JobID", "ArrayJobID", "ArrayTaskID", "State", "NodeList", "TimeUsed", "RestartCnt",
    "Reason", "Command",
)  # fmt: skip
"""What :meth:`SlurmClient.job_states` asks ``squeue -O`` for; ``Command`` (a path that may hold
anything) comes last, so splitting at the first eight ``|`` keeps it whole."""
SQUEUE_FORMAT = ",".join(f"{name}:0|" for name in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:0"
"""``-O`` spec: size 0 prints each field unpadded, and ``|`` ends each but the last."""
_NO_SUCH_JOB = "Invalid job id specified"
_JOB_REF = re.compile(r"[0-9]+(?:_[0-9]+)?")
_SQUEUE_CHUNK = 500
"""Job ids per ``squeue -j`` call (keeps the command line short for a thousand runs)."""


def parse_squeue(text: str) -> list[JobInfo]:
    """Parse ``squeue -h -O`` output in :data:`SQUEUE_FORMAT`, one :class:`JobInfo` per line.

    ``ArrayTaskID`` is ``N/A`` for a plain job and a range (``2-7%2``) for an array's pending
    tasks, which becomes ``[2-7%2]`` as in ``squeue``'s own ``JOBID`` column. A line that does
    not have every field is a :class:`SlurmError` quoting it.
    """
    infos = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(fields) != len(SQUEUE_FIELDS) or not fields[0].strip().isdigit():
            raise SlurmError(
                f"squeue printed {line[:200]!r}, not {len(SQUEUE_FIELDS)} '|'-separated "
                f"fields ({', '.join(SQUEUE_FIELDS)}). HINT: a site wrapper or SQUEUE_* "
                "variable may change squeue's output; run `squeue -h -O JobID:0|,State:0` by "
                "hand to see"
            )
        job_id, array_job, task, state_text, nodes, used, restarts, reason, command = (
            f.strip() for f in fields
        )
        array_task = None if task in ("", "N/A") else task if task.isdigit() else f"[{task}]"
        state = parse_job_state(state_text)
        started = state in _STARTED or state.finished
        infos.append(
            JobInfo(
                job_id=job_id,
                array_job_id=array_job if array_task is not None else None,
                array_task_id=array_task,
                state=state,
                reason="" if reason == "None" else reason,
                nodes="" if nodes == "(null)" else nodes,
                elapsed_s=_parse_elapsed(used) if started else None,
                restart_count=int(restarts) if restarts.isdigit() else 0,
                command="" if command == "(null)" else command,
            )
        )
    return infos


_STARTED = {JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED, JobState.STOPPED,
            JobState.SIGNALING, JobState.STAGE_OUT, JobState.CONFIGURING}  # fmt: skip


def parse_scontrol_oneliner(text: str) -> dict[str, str]:
    """Parse one line of ``scontrol show job -o`` into its ``Key=Value`` pairs.

    Values may hold spaces (``Command=``, ``WorkDir=``, ``Comment=``), so pairs are split only
    where a space is followed by a key and ``=``. Keys may contain ``:`` and ``/``
    (``AllocNode:Sid``, ``CPUs/Task``); only the first ``=`` of a pair separates key and value
    (``TRES=cpu=2,node=2``).
    """
    pairs: dict[str, str] = {}
    for chunk in re.split(r" +(?=[A-Za-z][\w:/.]*=)", text.strip()):
        key, sep, value = chunk.partition("=")
        if sep:
            pairs[key] = value.rstrip()
    return pairs


def parse_max_array_size(text: str) -> int:
    """Read ``MaxArraySize`` from ``scontrol show config`` (the largest index is one less)."""
    match = re.search(r"^MaxArraySize\s*=\s*([0-9]+)\s*$", text, re.MULTILINE)
    if match is None:
        raise SlurmError(
            "`scontrol show config` has no MaxArraySize line. "
            "HINT: check that `scontrol show config` works on this machine"
        )
    return int(match.group(1))


def parse_sacct(text: str) -> dict[str, AccountingRecord]:
    """Parse ``sacct -n -P -o JobID,State,ExitCode,Elapsed`` lines, keyed by JobID."""
    records: dict[str, AccountingRecord] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 4:
            continue
        job_id, raw_state, exit_code, elapsed = fields[:4]
        records[job_id] = AccountingRecord(
            job_id, parse_job_state(raw_state), raw_state, exit_code, _parse_elapsed(elapsed)
        )
    return records


def _parse_elapsed(text: str) -> int | None:
    """Seconds from Slurm's ``[D-][H:]M:SS`` (squeue's TimeUsed, sacct's Elapsed), else None."""
    match = re.fullmatch(r"(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class SlurmClient:
    """Slurm's commands as methods; failures raise :class:`SlurmError` with the command."""

    def __init__(
        self,
        runner: Runner = subprocess_runner,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._runner = runner
        self._timeout = timeout

    def submit_command(
        self, script: Path, *, test_only: bool = False, extra_args: Sequence[str] = ()
    ) -> list[str]:
        """The sbatch argv :meth:`submit` runs (shown by a dry run)."""
        return ["sbatch", "--test-only" if test_only else "--parsable", *extra_args, str(script)]

    def submit(
        self, script: Path, *, test_only: bool = False, extra_args: Sequence[str] = ()
    ) -> SubmitResult:
        """Submit ``script``; ``test_only`` asks sbatch when it would start and submits nothing."""
        argv = self.submit_command(script, test_only=test_only, extra_args=extra_args)
        result = self._run(argv)
        if result.returncode != 0:
            if _unreachable(result):
                raise SlurmUnavailableError(_failure("sbatch could not submit", result))
            raise SubmissionError(
                _failure(
                    "sbatch refused the job",
                    result,
                    "HINT: fix what sbatch names above (check partitions with `sinfo` and "
                    "accounts with `sacctmgr show assoc user=$USER`), then submit again",
                )
            )
        if test_only:
            return SubmitResult(tuple(argv), None, message=result.stderr.strip())
        job_id, cluster = parse_sbatch_parsable(result.stdout)
        logger.info("submitted job %s%s", job_id, f" on {cluster}" if cluster else "")
        return SubmitResult(tuple(argv), job_id, cluster, result.stderr.strip())

    def cancel(self, job_ref: str, *, signal: str | None = None, full: bool = False) -> None:
        """``scancel`` a job (or send it ``signal``; ``full`` also signals the batch shell)."""
        argv = ["scancel"]
        if signal is not None:
            argv.append(f"--signal={signal}")
        if full:
            argv.append("--full")
        self._check(self._run([*argv, job_ref]), "scancel failed")

    def requeue(self, job_ref: str) -> None:
        """``scontrol requeue``: stop the job and queue it again under the same id."""
        self._check(self._run(["scontrol", "requeue", job_ref]), "scontrol requeue failed")

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """The jobs among ``job_ids`` that the controller still holds, keyed by :attr:`JobInfo.ref`.

        Asks ``squeue -j IDS -t all`` (text: 22.05's ``--json`` ignores ``-j``, and an
        unfiltered queue on every poll loads slurmctld). Finished jobs stay listed (with a
        :attr:`JobState.finished` state) for ``MinJobAge`` after they end; purged ones are
        absent (see :meth:`sacct_states`). An array job id matches each of its tasks and its
        pending range; ``120_3`` matches one task. Ids that are not job ids (``12x``, a local
        backend's pid is fine) are never sent: one bad id makes squeue refuse them all.
        """
        wanted = list(dict.fromkeys(j for j in job_ids if _JOB_REF.fullmatch(j)))
        found: dict[str, JobInfo] = {}
        for i in range(0, len(wanted), _SQUEUE_CHUNK):
            chunk = wanted[i : i + _SQUEUE_CHUNK]
            argv = ["squeue", "-h", "-t", "all", "-j", ",".join(chunk), "-O", SQUEUE_FORMAT]
            result = self._run(argv)
            if result.returncode != 0 and _NO_SUCH_JOB in result.stderr:
                continue  # none of them is known any more (22.05 says so for a vanished id)
            infos = parse_squeue(self._check(result, "squeue failed").stdout)
            keys = set(chunk)
            found.update(
                (info.ref, info)
                for info in infos
                if keys & {info.job_id, info.ref, info.array_job_id}
            )
        return found

    def show_job(self, job_ref: str) -> dict[str, str]:
        """``scontrol show job -o``: the job's fields (an array's first task for an array id)."""
        result = self._check(
            self._run(["scontrol", "show", "job", "-o", job_ref]),
            "scontrol show job failed",
            "HINT: the job may have finished longer ago than the controller keeps it "
            "(MinJobAge); use `hpc-ddp status` or sacct",
        )
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        if not lines:
            raise SlurmError(
                f"`scontrol show job -o {job_ref}` printed nothing. {_UNREACHABLE_HINT}"
            )
        return parse_scontrol_oneliner(lines[0])

    def max_array_size(self) -> int:
        """The cluster's ``MaxArraySize`` (array indices must stay below it)."""
        result = self._check(self._run(["scontrol", "show", "config"]), "scontrol show config")
        return parse_max_array_size(result.stdout)

    def sacct_states(self, job_ids: Iterable[str]) -> dict[str, AccountingRecord] | None:
        """Accounting records of finished jobs and their steps; ``None`` without slurmdbd."""
        job_ids = list(job_ids)
        if not job_ids:
            return {}
        argv = ["sacct", "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed", "-j", ",".join(job_ids)]
        result = self._run(argv)
        if result.returncode != 0 and "accounting storage is disabled" in result.stderr:
            return None
        return parse_sacct(self._check(result, "sacct failed").stdout)

    def _run(self, argv: Sequence[str]) -> CompletedCommand:
        logger.debug("running %s", shlex.join(argv))
        return self._runner(argv, timeout=self._timeout)

    @staticmethod
    def _check(result: CompletedCommand, what: str, hint: str = "") -> CompletedCommand:
        if result.returncode == 0:
            return result
        if _unreachable(result):
            raise SlurmUnavailableError(_failure(what, result))
        raise SlurmError(
            _failure(what, result, hint or "HINT: see Slurm's message above; `sinfo` and "
                     "`scontrol ping` show whether the cluster is healthy")
        )  # fmt: skip


def _unreachable(result: CompletedCommand) -> bool:
    return any(marker in result.stderr for marker in _UNREACHABLE)


def _failure(what: str, result: CompletedCommand, hint: str = _UNREACHABLE_HINT) -> str:
    said = result.stderr.rstrip("\n") or result.stdout.rstrip("\n") or "(no output)"
    return (
        f"{what} (exit {result.returncode}).\n"
        f"command: {shlex.join(result.argv)}\n"
        f"Slurm said: {said}\n"
        f"{hint}"
    )
