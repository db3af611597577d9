"""The one place that runs Slurm's commands: sbatch, squeue, scontrol, scancel, sacct.

Every command goes through an injected :class:`Runner` (argv in, :class:`CompletedCommand` out;
never a shell), so tests swap in a fake and a dry run can show the argv without running it.
Parsing lives in the pure :mod:`hpc_ddp.backends.slurm.jobstate` (``parse_*``);
:class:`hpc_ddp.backends.slurm.fake.FakeSlurm` is a scripted runner for tests.

Every job id sent is checked against :data:`~hpc_ddp.backends.jobs.JOB_REF` first: an id
read from a damaged file (``--me``, ``1,2,3``) would otherwise widen ``scancel`` to other jobs.
Commands that act on one job refuse such an id (naming the file it came from); queries over
many runs leave it out.

Slurm 22.05 is the oldest version served: ``squeue --json`` there ignores ``-j``/``-t``, so the
queue is read as ``squeue -h -j IDS -O ...`` text, which honours both (asking for the whole queue
on every poll loads slurmctld on a real cluster); ``scontrol`` has no ``--json``, and ``sacct``
may be unavailable (no slurmdbd).
"""

from __future__ import annotations

import logging
import shlex
import signal
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from hpc_ddp.backends.jobs import AccountingRecord, JobInfo, is_job_ref
from hpc_ddp.backends.slurm.jobstate import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    CompletedCommand,
    check_job_ref,
    is_node_name,
    parse_max_array_size,
    parse_node_states,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_oneliner,
    parse_seconds,
    parse_show_config,
    parse_squeue,
    parse_step_ids,
)
from hpc_ddp.backends.slurm.render import sbatch_command
from hpc_ddp.errors import SlurmError, SlurmUnavailableError, SubmissionError
from hpc_ddp.frozen import dataclass

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused")
_UNREACHABLE_HINT = (
    "HINT: the Slurm controller did not answer; check `scontrol ping`, or bring the local one "
    "up with `hpc-ddp dev-cluster up`"
)


class Runner(Protocol):
    """Runs one command (argv, no shell) and returns its exit status and output."""

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        """Run ``argv`` to completion, or raise :class:`SlurmUnavailableError`."""
        ...


def subprocess_runner(argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
    """The real :class:`Runner`: :func:`subprocess.run` without a shell."""
    import subprocess  # here: a dry run renders ``sbatch`` argv but never runs one

    command = shlex.join(argv)
    # The command starts with SIGTERM blocked (a blocked signal stays blocked across fork and
    # exec) and so finishes what it asked: a rank's own `scontrol requeue` runs inside the job's
    # step, and the SIGTERM that the accepted requeue sends the whole step would otherwise kill
    # it before it exits 0, so our own requeue would read as failed, and as someone else's.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
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
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return CompletedCommand(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class SubmitResult:
    """A submission: the job id (``None`` for ``--test-only``) and what sbatch said."""

    command: tuple[str, ...]
    job_id: str | None
    cluster: str | None = None
    message: str = ""
    """sbatch's stderr (for ``--test-only``: ``sbatch: Job 12 to start at ...``)."""


_NO_SUCH_JOB = "Invalid job id specified"
_SQUEUE_CHUNK = 500
"""Job ids per ``squeue -j`` call (keeps the command line short for a thousand runs)."""


SLURMD_PORT = 6818
"""slurmd's port when ``scontrol show node`` names none (``SlurmdPort``'s default)."""


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
        """The sbatch argv :meth:`submit` runs
        (:func:`~hpc_ddp.backends.slurm.render.sbatch_command`)."""
        return sbatch_command(script, test_only=test_only, extra_args=extra_args)

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

    def cancel(
        self,
        job_ref: str,
        *,
        signal: str | None = None,
        full: bool = False,
        source: str | None = None,
    ) -> None:
        """``scancel`` a job (or send it ``signal``; ``full`` also signals the batch shell).

        ``source`` names the file ``job_ref`` was read from, for the error when it is not a job
        id (then nothing is run).
        """
        argv = ["scancel"]
        if signal is not None:
            argv.append(f"--signal={signal}")
        if full:
            argv.append("--full")
        argv.append(check_job_ref(job_ref, source))
        self._check(self._run(argv), "scancel failed")

    def requeue(self, job_ref: str, *, source: str | None = None) -> None:
        """``scontrol requeue``: stop the job and queue it again under the same id."""
        argv = ["scontrol", "requeue", check_job_ref(job_ref, source)]
        self._check(self._run(argv), "scontrol requeue failed")

    def exclude_nodes(self, job_ref: str, nodes: Sequence[str]) -> None:
        """``scontrol update JobId=J ExcNodeList=a,b``: a requeued job avoids these nodes.

        Slurm accepts it only while the job is not running (right after ``scontrol requeue``,
        while it completes, or pending); the list stays with the job for later requeues.
        """
        names = _node_names(nodes)
        argv = ["scontrol", "update", f"JobId={check_job_ref(job_ref)}", f"ExcNodeList={names}"]
        self._check(self._run(argv), "scontrol update ExcNodeList failed")

    def signal_step(self, job_id: str, step: int, signal: str) -> None:
        """``scancel --signal=SIGNAL JOB.STEP``: every task of one job step (on every node)."""
        argv = ["scancel", f"--signal={signal}", f"{check_job_ref(job_id)}.{int(step)}"]
        self._check(self._run(argv), "scancel of a job step failed")

    def job_steps(self, job_id: str) -> list[int]:
        """The job's running numbered steps (``squeue -s``), oldest first."""
        result = self._run(["squeue", "-h", "-s", "-j", check_job_ref(job_id), "-o", "%i"])
        return parse_step_ids(self._check(result, "squeue -s failed").stdout, job_id)

    def partition_nodes(self, partition: str) -> list[str]:
        """The nodes of ``partition`` (``sinfo -N``), each once."""
        if not is_node_name(partition):
            raise SlurmError(f"partition {partition!r} is not a plain name; nothing was asked")
        result = self._run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T"])
        return list(parse_node_states(self._check(result, "sinfo failed").stdout))

    def default_partition(self) -> str | None:
        """The cluster's default partition (``sinfo``'s name marked ``*``), else None."""
        result = self._run(["sinfo", "-h", "-o", "%P"])
        for line in self._check(result, "sinfo failed").stdout.split():
            if line.endswith("*"):
                return line.rstrip("*")
        return None

    def node_states(self, nodes: Sequence[str]) -> dict[str, str]:
        """Each node's state as ``sinfo -N`` says it (``idle``, ``alloc``, ``mixed``, ``down``,
        ``not_responding``...); a node sinfo does not list is left out."""
        names = _node_names(nodes)
        result = self._run(["sinfo", "-h", "-N", "-n", names, "-o", "%N|%T"])
        return parse_node_states(self._check(result, "sinfo failed").stdout)

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """The jobs among ``job_ids`` that the controller still holds, keyed by :attr:`JobInfo.ref`.

        Asks ``squeue -j IDS -t all`` (text: 22.05's ``--json`` ignores ``-j``, and an
        unfiltered queue on every poll loads slurmctld). Finished jobs stay listed (with a
        :attr:`JobState.finished` state) for ``MinJobAge`` after they end; purged ones are
        absent (see :meth:`sacct_states`). An array job id matches each of its tasks and its
        pending range; ``120_3`` matches one task. Ids that are not job ids (``12x``, a local
        backend's pid is fine) are never sent: one bad id makes squeue refuse them all.
        """
        wanted = list(dict.fromkeys(j for j in job_ids if is_job_ref(j)))
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

    def show_job(self, job_ref: str, *, source: str | None = None) -> dict[str, str]:
        """``scontrol show job -o``: the job's fields (an array's first task for an array id)."""
        result = self._check(
            self._run(["scontrol", "show", "job", "-o", check_job_ref(job_ref, source)]),
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

    def slurmd_address(self, node: str) -> tuple[str, int]:
        """Where ``node``'s slurmd listens (``scontrol show node``: its NodeAddr and Port,
        Slurm's default port 6818 when none is shown)."""
        names = _node_names([node])
        result = self._check(
            self._run(["scontrol", "show", "node", "-o", names]), "scontrol show node failed"
        )
        fields = parse_scontrol_oneliner(result.stdout.strip().splitlines()[0])
        port = fields.get("Port", "")
        return fields.get("NodeAddr") or node, int(port) if port.isdigit() else SLURMD_PORT

    def max_array_size(self) -> int:
        """The cluster's ``MaxArraySize`` (array indices must stay below it)."""
        result = self._check(self._run(["scontrol", "show", "config"]), "scontrol show config")
        return parse_max_array_size(result.stdout)

    def partition_fields(self, partition: str) -> dict[str, str]:
        """``scontrol show partition -o``: the partition's fields (``GraceTime``, seconds;
        ``PreemptMode``...)."""
        if not is_node_name(partition):
            raise SlurmError(f"partition {partition!r} is not a plain name; nothing was asked")
        result = self._check(
            self._run(["scontrol", "show", "partition", "-o", partition]),
            "scontrol show partition failed",
        )
        lines = result.stdout.strip().splitlines()
        return parse_scontrol_oneliner(lines[0]) if lines else {}

    def config_fields(self) -> dict[str, str]:
        """``scontrol show config``: the cluster's settings (``KillWait``, ``PreemptType``...)."""
        result = self._check(self._run(["scontrol", "show", "config"]), "scontrol show config")
        return parse_show_config(result.stdout)

    def qos_grace_s(self, qos: str) -> int:
        """A QOS's ``GraceTime`` in seconds (``sacctmgr show qos``; 0: none set)."""
        if not is_node_name(qos):
            raise SlurmError(f"QOS {qos!r} is not a plain name; nothing was asked")
        argv = ["sacctmgr", "-n", "-P", "show", "qos", qos, "format=GraceTime"]
        result = self._check(self._run(argv), "sacctmgr show qos failed")
        lines = result.stdout.strip().splitlines()
        return parse_seconds(lines[0]) if lines else 0

    def sacct_states(self, job_ids: Iterable[str]) -> dict[str, AccountingRecord] | None:
        """Accounting records of jobs (an array job id: of each of its tasks), without their
        steps; ``None`` without slurmdbd.

        Every line of each id (``-D``): without it sacct shows only the newest job of an id,
        which after the cluster's ids started again is another job; each record's
        :meth:`~hpc_ddp.backends.jobs.AccountingRecord.submitted_with` finds a run's own.
        Ids that are not job ids are left out, as in :meth:`job_states`.
        """
        job_ids = list(dict.fromkeys(j for j in job_ids if is_job_ref(j)))
        if not job_ids:
            return {}
        fields = ",".join(SACCT_FIELDS)
        argv = ["sacct", "-n", "-P", "-X", "-D", "-o", fields, "-j", ",".join(job_ids)]
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


def _node_names(nodes: Sequence[str]) -> str:
    """``a,b`` for Slurm, every name checked
    (:data:`~hpc_ddp.backends.slurm.jobstate.NODE_NAME`)."""
    bad = [n for n in nodes if not is_node_name(n)]
    if bad or not nodes:
        raise SlurmError(
            f"node name {bad[0] if bad else ''!r} is not a plain node name; nothing was sent to "
            "Slurm. HINT: node names come from Slurm itself (SLURMD_NODENAME); check the run's "
            "launches/bad_nodes.json"
        )
    return ",".join(nodes)


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
