"""The dev cluster as the benchmarks use it: find it, check it answers, watch and signal jobs.

Where the cluster lives comes from :mod:`hpc_ddp.devcluster.cluster`
(``$HPC_DDP_DEV_CLUSTER_DIR`` or
its default); Slurm's commands go through :class:`hpc_ddp.backends.slurm.client.SlurmClient`, which
reads ``SLURM_CONF`` from the environment :func:`use_dev_cluster` sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from benchmarks.common import BIN
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.local.process import parse_stat
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.jobstate import parse_job_state
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import releasable_early

T = TypeVar("T")
SLURM = SlurmClient()


def dev_conf() -> str:
    """The dev cluster's ``slurm.conf``."""
    return str(devcluster.layout_for(devcluster.state_dir_from(os.environ)).conf)


def ping() -> str | None:
    """None when the controller answers, else why not (Slurm's last line on it)."""
    done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    if "UP" in done.stdout:
        return None
    said = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()
    return said[-1]


def use_dev_cluster() -> str | None:
    """Point this process (and its children) at the dev cluster unless ``SLURM_CONF`` names
    another; put this interpreter's ``bin`` first on PATH. None when it answers, else why not.

    The lemon record (:mod:`hpc_ddp.lemons`) is a fresh one of this process's: the nodes a
    benchmark kills on purpose must not become the user's lemons, nor the user's lemons move a
    benchmark's jobs off the nodes it expects.
    """
    import tempfile

    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hpc-ddp-bench-state-")
    os.environ.setdefault("SLURM_CONF", dev_conf())
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    reason = ping()
    if reason is None:
        return None
    return (
        f"the Slurm cluster of SLURM_CONF={os.environ['SLURM_CONF']} does not answer ({reason}). "
        "HINT: start the dev cluster with `hpc-ddp dev-cluster up` (root)"
    )


def require_dev_cluster() -> bool:
    """:func:`use_dev_cluster`, printing the reason on stderr when it is not up."""
    reason = use_dev_cluster()
    if reason is not None:
        print(reason, file=sys.stderr)
    return reason is None


def poll(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.05) -> T:
    """Call ``probe`` until it returns something other than None or False; that value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value is not None and value is not False:
            return value
        time.sleep(every_s)
    raise RuntimeError(f"not seen within {timeout_s:.0f} s: {what}")


def rank_pids(job_id: str, rank: int, *, launch: int | None = None) -> list[int]:
    """The ``hpc_ddp run`` processes of ``rank`` in job ``job_id`` (of launch ``launch`` only,
    when given), oldest first, read from ``/proc``.

    The verb is the word after ``hpc_ddp`` (or ``hpc-ddp``): the batch step's supervisor has the
    same ``SLURM_PROCID=0`` and names ``run`` later in its srun command line (and that srun
    itself is left out). Oldest by start
    time, not by pid: pids wrap around on a machine that has run for a while.
    """
    want = {f"SLURM_JOB_ID={job_id}", f"SLURM_PROCID={rank}"}
    if launch is not None:
        want.add(f"HPC_DDP_LAUNCH={launch}")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if _verb(argv) != b"run" or argv[0].endswith(b"srun"):  # srun: the supervisor's
                continue
            raw = (entry / "environ").read_bytes().split(b"\0")
            _, _, started = parse_stat((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        if want <= {e.decode(errors="replace") for e in raw}:
            found.append((started, int(entry.name)))
    return [pid for _, pid in sorted(found)]


def _verb(argv: list[bytes]) -> bytes | None:
    """``run`` of ``python -m hpc_ddp run DIR`` or ``.../hpc-ddp run DIR``; None for others."""
    for i, word in enumerate(argv[:-1]):
        if word == b"hpc_ddp" or word.rsplit(b"/", 1)[-1] == b"hpc-ddp":
            return argv[i + 1]
    return None


def state_of(fields: dict[str, str]) -> JobState:
    return parse_job_state(fields.get("JobState"))


def release_if_held(job_ref: str, fields: dict[str, str]) -> None:
    """Let a requeued job start now instead of after Slurm's hold (``cred_expire`` + 1 s), once
    it may (:func:`hpc_ddp.devcluster.conf.releasable_early`)."""
    if releasable_early(fields, time.time()):
        subprocess.run(
            ["scontrol", "update", f"JobId={job_ref}", "StartTime=now"],
            capture_output=True,
            check=False,
        )


def wait_finished(job_ref: str, timeout_s: float = 300.0) -> dict[str, str]:
    """The job's fields once it has finished for good; requeue holds are released meanwhile."""

    def finished() -> dict[str, str] | None:
        fields = SLURM.show_job(job_ref)
        if state_of(fields).finished:
            return fields
        release_if_held(job_ref, fields)
        return None

    return poll(f"job {job_ref} finished", finished, timeout_s, every_s=0.2)


def send_signal(job_ref: str, signal: str = "USR2") -> float:
    """``scancel --signal=SIGNAL`` (the step's tasks only, as before a time limit); when sent."""
    sent = time.time()
    SLURM.cancel(job_ref, signal=signal)
    return sent


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (fields 14 and 15 of ``/proc/PID/stat``); None once gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # rest[N - 3] is field N
    return int(rest[14 - 3]) + int(rest[15 - 3])


def idle(pids: list[int], over_s: float = 0.5) -> bool:
    """Every process of ``pids`` alive and spending no CPU over ``over_s`` (a standby's imports
    done, say)."""
    before = [cpu_ticks(p) for p in pids]
    time.sleep(over_s)
    return None not in before and before == [cpu_ticks(p) for p in pids]
