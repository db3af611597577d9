"""Slurm's words as data: its state names, squeue/sacct/scontrol/sbatch output parsed (pure).

Nothing here runs a command, reads the environment or imports torch:
:mod:`hpc_ddp.backends.slurm.client` runs Slurm's commands and hands their output to these
parsers, which answer in the types every backend shares (:mod:`hpc_ddp.backends.jobs`). Every
parser is tested on captured output.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence

from hpc_ddp.backends.jobs import AccountingRecord, JobInfo, JobState, is_job_ref
from hpc_ddp.errors import RunDirError, SlurmError, SubmissionError, TargetError
from hpc_ddp.frozen import dataclass

logger = logging.getLogger(__name__)


def check_job_ref(ref: object, source: str | None = None) -> str:
    """``ref`` if it is a job id (:data:`~hpc_ddp.backends.jobs.JOB_REF`), else an error naming
    where it came from.

    ``source`` is the file the id was read from (a damaged file: :class:`RunDirError`); None
    for an id typed by a person (:class:`TargetError`, a usage error).
    """
    if is_job_ref(ref):
        return str(ref)
    shown = repr(ref) if len(repr(ref)) <= 60 else repr(ref)[:57] + "..."
    what = (
        f"job id {shown} is not a Slurm job id (123, or 123_4 for an array task); nothing was "
        "sent to Slurm"
    )
    if source is None:
        raise TargetError(f"{what}. HINT: pass one job id as sbatch printed it (e.g. 1234)")
    raise RunDirError(
        f"{source}: {what}. HINT: the file is damaged or was edited; the run's job id is "
        "also in its logs (logs/batch-<job>.out): restore the file, or use Slurm's own commands "
        "with that id"
    )


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


NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A node name as hpc-ddp passes it to Slurm (``--exclude``, ``ExcNodeList``, ``sinfo -n``): no
commas, brackets or spaces, so one name never widens into a list."""


def is_node_name(text: object) -> bool:
    """True for a string in :data:`NODE_NAME`'s form."""
    return isinstance(text, str) and NODE_NAME.fullmatch(text) is not None


DOWN_STATES = frozenset({"down", "drained", "draining", "fail", "failing", "not_responding"})
"""Node states (``sinfo %T``, lower case, flags split off) in which a node runs no job step."""


def parse_node_states(text: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N|%T'`` as ``{node: state}`` (``down*``'s ``*``, "not responding", is
    kept as ``not_responding``; ``drained+...`` flags split: the first state word counts).

    A node listed in several partitions appears once per partition; the states agree.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        node, sep, state = line.strip().partition("|")
        if not sep or not node:
            continue
        word = state.strip().lower()
        if word.endswith("*"):
            word = "not_responding"
        states[node] = word.split("+")[0]
    return states


def parse_step_ids(text: str, job_id: str) -> list[int]:
    """The numbered steps of ``job_id`` in ``squeue -h -s -j JOB -o %i`` output (``J.3``; the
    batch and extern steps are left out), in ascending order."""
    steps = []
    for line in text.split():
        job, _, step = line.strip().partition(".")
        if job == job_id and step.isdigit():
            steps.append(int(step))
    return sorted(steps)


def parse_max_array_size(text: str) -> int:
    """Read ``MaxArraySize`` from ``scontrol show config`` (the largest index is one less)."""
    match = re.search(r"^MaxArraySize\s*=\s*([0-9]+)\s*$", text, re.MULTILINE)
    if match is None:
        raise SlurmError(
            "`scontrol show config` has no MaxArraySize line. "
            "HINT: check that `scontrol show config` works on this machine"
        )
    return int(match.group(1))


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines as a mapping (other lines skipped)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            fields[key.strip()] = value.strip()
    return fields


def parse_seconds(value: str) -> int:
    """A Slurm duration as ``scontrol`` and ``sacctmgr`` print one (``30 sec``, ``10``,
    ``00:05:00``, ``1-00:00:00``, empty: 0) in seconds; SlurmError for anything else."""
    text = value.strip().removesuffix("sec").strip()
    if not text:
        return 0
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3 or (days and not days.isdigit()):
        raise SlurmError(f"{value!r} is not a Slurm duration (seconds, or [D-]HH:MM:SS)")
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


SACCT_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "Submit", "SubmitLine")
"""What :meth:`SlurmClient.sacct_states` asks ``sacct -o`` for; ``SubmitLine`` (a command
line that may hold anything) comes last, so splitting at the first five ``|`` keeps it whole."""


def parse_sacct(text: str) -> dict[str, AccountingRecord]:
    """Parse ``sacct -n -P -o`` lines of :data:`SACCT_FIELDS` (or of their first four), keyed by
    JobID: the newest line of each id (by ``Submit``, then by place), the others in its
    :attr:`~AccountingRecord.earlier`."""
    found: dict[str, list[tuple[str, int, AccountingRecord]]] = {}
    for place, line in enumerate(text.splitlines()):
        fields = line.split("|", len(SACCT_FIELDS) - 1)
        if len(fields) < 4:
            continue
        job_id, raw_state, exit_code, elapsed, *rest = (f.strip() for f in fields)
        submitted, submit_line = (*rest, "", "")[:2]
        record = AccountingRecord(
            job_id, parse_job_state(raw_state), raw_state, exit_code, _parse_elapsed(elapsed),
            submitted if submitted[:1].isdigit() else "", submit_line,
        )  # fmt: skip
        found.setdefault(job_id, []).append((record.submitted, place, record))
    records = {}
    for job_id, lines in found.items():
        newest, *others = [record for *_, record in sorted(lines, reverse=True)]
        records[job_id] = dataclasses.replace(newest, earlier=tuple(others))
    return records


def _parse_elapsed(text: str) -> int | None:
    """Seconds from Slurm's ``[D-][H:]M:SS`` (squeue's TimeUsed, sacct's Elapsed), else None."""
    match = re.fullmatch(r"(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
