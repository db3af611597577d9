"""Helpers for the tests that run hpc-ddp on the real dev cluster (tests marked ``slurm``).

Every job goes through the real CLI in a subprocess, as a user would type it
(:func:`submit`, :func:`sweep`, :func:`hpc`), and is watched the way a user could watch it:
through the run directory (``metrics.jsonl``, ``ledger.jsonl``, ``checkpoints/``) and
``scontrol show job``. Waits poll a file or a job state with a deadline; none of them sleeps
for a guessed time.

A job requeued by Slurm is held for ``cred_expire`` + 1 s before it may start again;
:func:`wait_done` and :func:`wait_state` release such holds (``scontrol update
StartTime=now``) 2 s after the requeue (see :data:`hpc_ddp.devcluster.conf.REQUEUE_SETTLE_S`),
so a requeue costs the tests about 2 s more than the restart itself.

:func:`io_bound_synthetic` is a ``train.dataset`` for jobs whose length in wall-clock time must
not depend on how busy the machine's cores are (the real time-limit test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hpc_ddp.backends.slurm.jobstate import parse_scontrol_oneliner
from hpc_ddp.devcluster.conf import releasable_early
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.ledger import read_ledger
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from hpc_ddp.config.model import TrainConfig
    from tests.conftest import Cluster

REPO = Path(__file__).resolve().parent.parent
HPC_DDP = (sys.executable, "-m", "hpc_ddp")

FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE"}
)  # fmt: skip
"""States after which a job runs no more (unless someone requeues it by hand)."""

SLURM_POLL_S = 0.5
"""How often a wait asks Slurm (``scontrol show job``): each ask is a process and an RPC, and at
0.2 s the suite's waits made 12,000 of them (a few % of its CPU on a 2-core machine)."""

STEADY_THREADS = 'env.vars={OMP_NUM_THREADS: "1"}'
"""Override for CPU jobs: one intra-op thread per rank, so two ranks per core-pair do not spin
against each other and steps keep a steady pace on a busy 2-core machine."""


@dataclass(frozen=True)
class Submitted:
    """A job submitted through ``hpc-ddp submit --json``."""

    job_id: str
    run_dir: Path


# --- the CLI -------------------------------------------------------------------------------


def hpc(
    cluster: Cluster, *args: str, check: bool = True, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run ``hpc-ddp ARGS`` from the repository root against ``cluster``."""
    done = subprocess.run(
        [*HPC_DDP, *args],
        cwd=REPO,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"hpc-ddp {' '.join(args)} -> exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def submit(cluster: Cluster, runs_dir: Path, config: str, *overrides: str) -> Submitted:
    """``hpc-ddp submit CONFIG OVERRIDES --runs-dir RUNS_DIR --json``."""
    out = hpc(cluster, "submit", config, *overrides, "--runs-dir", str(runs_dir), "--json")
    result = json.loads(out.stdout)
    return Submitted(str(result["job_id"]), Path(result["run_dir"]))


def sweep(
    cluster: Cluster, runs_dir: Path, sweep_file: Path | str, *overrides: str
) -> dict[str, Any]:
    """``hpc-ddp sweep FILE OVERRIDES --runs-dir RUNS_DIR --json``: sweep_dir, array_jobs, ..."""
    out = hpc(cluster, "sweep", str(sweep_file), *overrides, "--runs-dir", str(runs_dir), "--json")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def status(cluster: Cluster, run_dir: Path) -> dict[str, Any]:
    """The one row of ``hpc-ddp status RUN_DIR --json``."""
    [row] = json.loads(hpc(cluster, "status", str(run_dir), "--json").stdout)["runs"]
    result: dict[str, Any] = row
    return result


def hpc_here(*args: str) -> str:
    """``hpc-ddp ARGS`` run by the CLI's own ``main`` in this process: its stdout (a non-zero
    exit fails the test). For the commands that only read a run's files and import torch to
    do it (``checkpoints``): this process has torch loaded already, where a subprocess would
    import it again for every reading (2 s of CPU, ~80 times a suite). The commands as
    processes are their own modules' subject (:mod:`tests.cli.test_checkpoints`)."""
    code, out = run_cli(*args)
    assert code == 0, f"hpc-ddp {' '.join(args)} -> exit {code}\n{out}"
    return out


def checkpoints(cluster: Cluster, run_dir: Path) -> list[dict[str, Any]]:
    """``hpc-ddp checkpoints RUN_DIR --json`` (:func:`hpc_here`): one dict per checkpoint,
    oldest first."""
    del cluster  # reading files needs no Slurm
    rows: list[dict[str, Any]] = json.loads(hpc_here("checkpoints", str(run_dir), "--json"))[
        "checkpoints"
    ]
    return rows


def final_digest(cluster: Cluster, run_dir: Path) -> tuple[int, str]:
    """(step, weights digest) of the newest checkpoint, as ``hpc-ddp checkpoints`` reports it."""
    rows = checkpoints(cluster, run_dir)
    assert rows, f"{run_dir}: no checkpoint"
    assert rows[-1]["error"] is None, rows[-1]
    return int(rows[-1]["step"]), str(rows[-1]["weights_digest"])


# --- Slurm's view ----------------------------------------------------------------------------


def job_fields(cluster: Cluster, job_ref: str) -> dict[str, str]:
    """``scontrol show job -o JOB_REF`` as fields (the first line: an array's first task)."""
    out = cluster.run("scontrol", "show", "job", "-o", job_ref).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"scontrol knows no job {job_ref}"
    return parse_scontrol_oneliner(lines[0])


def restarts(cluster: Cluster, job_ref: str) -> int:
    """How many times Slurm has requeued the job (``Restarts=``)."""
    return int(job_fields(cluster, job_ref)["Restarts"])


def release_if_held(cluster: Cluster, job_ref: str, fields: dict[str, str]) -> bool:
    """Let a requeued job start now instead of after Slurm's hold (``cred_expire`` + 1 s), once
    it may (:func:`~hpc_ddp.devcluster.conf.releasable_early`); True when it was let go."""
    if not releasable_early(fields, time.time()):
        return False
    cluster.run("scontrol", "update", f"JobId={job_ref}", "StartTime=now", check=False)
    return True


def wait_state(
    cluster: Cluster,
    job_ref: str,
    states: Iterable[str],
    *,
    timeout_s: float = 120.0,
    release: bool = True,
) -> dict[str, str]:
    """Wait until the job is in one of ``states``; its fields then.

    With ``release``, a job held after a requeue is let go at once. A job that reaches a final
    state not asked for fails the wait right away, with its fields in the message.
    """
    wanted = set(states)
    deadline = time.monotonic() + timeout_s
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(cluster, job_ref)
        state = fields.get("JobState", "")
        if state in wanted:
            return fields
        if state in FINAL_STATES:
            raise AssertionError(f"job {job_ref} ended {state}, not {sorted(wanted)}: {fields}")
        if release:
            release_if_held(cluster, job_ref, fields)
        time.sleep(SLURM_POLL_S)
    raise AssertionError(f"job {job_ref} not {sorted(wanted)} after {timeout_s} s: {fields}")


def wait_done(cluster: Cluster, job_ref: str, timeout_s: float = 180.0) -> dict[str, str]:
    """Wait until the job is finished for good (requeue holds released); its final fields."""
    return wait_state(cluster, job_ref, FINAL_STATES, timeout_s=timeout_s)


def wait_all_done(
    cluster: Cluster, job_refs: Sequence[str], timeout_s: float = 180.0
) -> list[dict[str, str]]:
    """:func:`wait_done` for several jobs at once (e.g. array tasks ``A_0``, ``A_1``): each is
    released from a requeue hold while the others are still being waited for."""
    deadline = time.monotonic() + timeout_s
    final: dict[str, dict[str, str]] = {}
    while len(final) < len(job_refs):
        if time.monotonic() > deadline:
            missing = [r for r in job_refs if r not in final]
            raise AssertionError(f"jobs {missing} not finished after {timeout_s} s")
        for ref in job_refs:
            if ref in final:
                continue
            fields = job_fields(cluster, ref)
            if fields.get("JobState") in FINAL_STATES:
                final[ref] = fields
            else:
                release_if_held(cluster, ref, fields)
        time.sleep(SLURM_POLL_S)
    return [final[r] for r in job_refs]


def signal_job(
    cluster: Cluster, job_ref: str, signal: str = "USR2", *, full: bool = False
) -> float:
    """``scancel --signal=SIGNAL [--full] JOB_REF``; returns the time (epoch s) it was sent.

    Without ``--full`` only the step's tasks get the signal, as for the ``--signal`` Slurm sends
    before a time limit; with it the batch shell and srun too (srun forwards it to the tasks).
    """
    argv = ["scancel", f"--signal={signal}", *(["--full"] if full else []), job_ref]
    sent = time.time()
    cluster.run(*argv)
    return sent


# --- the run directory -----------------------------------------------------------------------


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of ``metrics.jsonl`` (a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def last_step(run_dir: Path) -> int:
    """The highest step rank 0 has logged (0 before the first)."""
    return max((int(r["step"]) for r in metric_rows(run_dir) if "step" in r), default=0)


def wait_for(
    what: str,
    probe: Callable[[], Any],
    *,
    timeout_s: float = 90.0,
    poll_s: float = 0.05,
    release: tuple[Cluster, str] | None = None,
) -> Any:
    """Poll ``probe`` until it returns something truthy; that value. ``what`` names it on failure.

    ``release``: (cluster, job ref) of a job to let go whenever Slurm holds it after a requeue
    meanwhile (checked every :data:`SLURM_POLL_S`), so waiting for a later attempt costs no hold
    time.
    """
    deadline = time.monotonic() + timeout_s
    next_check = 0.0
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        if release is not None and time.monotonic() >= next_check:
            cluster, job_ref = release
            release_if_held(cluster, job_ref, job_fields(cluster, job_ref))
            next_check = time.monotonic() + SLURM_POLL_S
        time.sleep(poll_s)
    raise AssertionError(f"not seen within {timeout_s} s: {what}")


def wait_step(
    run_dir: Path, step: int, timeout_s: float = 90.0, release: tuple[Cluster, str] | None = None
) -> int:
    """Wait until rank 0 has logged ``step`` or a later one; the step seen."""
    return int(
        wait_for(
            f"{run_dir}: step {step}",
            lambda: (s := last_step(run_dir)) >= step and s,
            timeout_s=timeout_s,
            release=release,
        )
    )


def wait_checkpoint(
    run_dir: Path, step: int, timeout_s: float = 90.0, release: tuple[Cluster, str] | None = None
) -> Path:
    """Wait until ``checkpoints/step-<step>.pt`` is in place (it is renamed in when complete)."""
    path = run_dir / "checkpoints" / f"step-{step:08d}.pt"
    wait_for(str(path), path.exists, timeout_s=timeout_s, release=release)
    return path


def ledger(run_dir: Path) -> list[Attempt]:
    """The run's attempts as :func:`hpc_ddp.rundir.ledger.read_ledger` folds them."""
    return read_ledger(run_dir / "ledger.jsonl")


def wait_attempt(
    run_dir: Path, number: int, timeout_s: float = 90.0, release: tuple[Cluster, str] | None = None
) -> Attempt:
    """Wait until attempt ``number`` (``SLURM_RESTART_COUNT``) has written its start."""
    found = wait_for(
        f"{run_dir}: attempt {number} started",
        lambda: [a for a in ledger(run_dir) if a.attempt == number],
        timeout_s=timeout_s,
        release=release,
    )
    attempt: Attempt = found[-1]
    return attempt


def causes(run_dir: Path) -> list[str | None]:
    """Each attempt's end cause in order (None for one that never wrote its end)."""
    return [a.cause.value if a.cause else None for a in ledger(run_dir)]


def story(run_dir: Path, tail: int = 12) -> str:
    """What a failed assertion about a run should print: each attempt's end, and the last
    ``tail`` lines of every ``.err`` log (the batch script's and each rank's)."""
    lines = [
        f"attempt {a.attempt} (restart {a.restart}, launch {a.launch}): {a.cause} at step "
        f"{a.steps_done} from {a.resumed_from_step}, next {a.next}: {a.message}"
        + (f"; rescue: {a.rescue.words}" if a.rescue is not None else "")
        + (f"; blame: {a.blame.describe()}" if a.blame is not None else "")
        for a in ledger(run_dir)
    ]
    for log in sorted((run_dir / "logs").glob("*.err")):
        text = log.read_text(errors="replace").splitlines()[-tail:]
        lines += [f"--- {log.name}", *text]
    return "\n".join(lines)


def batch_log(run_dir: Path, job_id: str, stream: str = "err") -> str:
    """The batch script's own log (``logs/batch-<job>.<stream>``), '' when absent."""
    path = run_dir / "logs" / f"batch-{job_id}.{stream}"
    return path.read_text(errors="replace") if path.exists() else ""


# --- processes on the fake nodes -------------------------------------------------------------


def rank_pids(
    job_id: str, rank: int, marker: str = "hpc_ddp", *, launch: int | None = None
) -> list[int]:
    """Pids of the processes of ``job_id`` running global rank ``rank`` whose command line
    holds ``marker`` (the python task, not srun's step daemons), of the supervisor's
    ``launch`` when given. Both fake nodes are this machine, so /proc shows every task;
    processes that vanish meanwhile are skipped.
    """
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={rank}".encode()}
    if launch is not None:
        want.add(f"HPC_DDP_LAUNCH={launch}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if marker.encode() not in cmdline or b"srun" in cmdline.split(b"\0")[0]:
                continue
            env = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            found.append(int(entry.name))
    return sorted(found)


# --- a dataset whose pace is wall-clock time, not CPU ----------------------------------------

IO_DELAY_S = 0.0025
"""Seconds :func:`io_bound_synthetic` waits per sample: 64 samples make a 0.16 s step."""


def io_bound_synthetic(cfg: TrainConfig, train: bool) -> Dataset[Any]:
    """``train.dataset=tests.e2e_util:io_bound_synthetic``: the built-in synthetic data, as if
    read from a slow file system (each sample waits :data:`IO_DELAY_S`). Steps then take about
    the same wall-clock time however busy the cores are, which tests of Slurm's clock need.
    """
    from hpc_ddp.train.data import SyntheticImages

    n = cfg.synthetic_samples if train else max(1, cfg.synthetic_samples // 8)
    inner = SyntheticImages(n, cfg.num_classes, cfg.image_size, cfg.seed, train=train)
    return cast("Dataset[Any]", _Delayed(inner))


class _Delayed:
    """A map-style dataset that waits :data:`IO_DELAY_S` before each sample."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        time.sleep(IO_DELAY_S)
        while _stalled():
            time.sleep(0.1)
        return self.inner[index]


STALL_DIR_ENV = "HPC_DDP_TEST_STALL_DIR"
"""A directory whose ``stall-<RANK>`` file, holding a launch number, makes that rank's data
wait for ever in that launch: a rank stuck inside a step whose process and heartbeat live on
(``benchmarks/bench_faults.py``)."""


def _stalled() -> bool:
    where = os.environ.get(STALL_DIR_ENV)
    if not where:
        return False
    try:
        with open(os.path.join(where, f"stall-{os.environ.get('RANK', '')}")) as f:
            return f.read().strip() == os.environ.get("HPC_DDP_LAUNCH", "0")
    except OSError:
        return False


__all__ = [
    "FINAL_STATES",
    "HPC_DDP",
    "IO_DELAY_S",
    "REPO",
    "STALL_DIR_ENV",
    "STEADY_THREADS",
    "Submitted",
    "batch_log",
    "causes",
    "checkpoints",
    "final_digest",
    "hpc",
    "io_bound_synthetic",
    "job_fields",
    "last_step",
    "ledger",
    "metric_rows",
    "rank_pids",
    "release_if_held",
    "restarts",
    "signal_job",
    "status",
    "story",
    "submit",
    "sweep",
    "wait_all_done",
    "wait_attempt",
    "wait_checkpoint",
    "wait_done",
    "wait_for",
    "wait_state",
    "wait_step",
]


def helper_job(directory: Path, name: str, script: str, args: str, extra: str = "") -> Path:
    """``DIRECTORY/NAME.yaml``: a 2-node job of one task each whose ``command:`` runs
    ``tests/helpers/SCRIPT`` with ``args`` (the YAML flow items after the script, as written),
    one thread per rank, five minutes; ``extra``: more YAML lines."""
    config = directory / f"{name}.yaml"
    config.write_text(
        f"name: {name}\n"
        f"command: [python, {Path(__file__).resolve().parent / 'helpers' / script}, {args}]\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n' + extra
    )
    return config


def crashy_job(
    directory: Path,
    steps: int,
    every: int,
    crash_at: int | str,
    *,
    on_crash: bool,
    how: str = "raise",
    extra: str = "",
    fault: str = "{enabled: false}",
) -> Path:
    """A 2-node job file running ``[python, tests/helpers/crashy.py, ...]`` (rank 1 fails once
    at ``crash_at``, by ``how``: ``raise`` or ``sigkill``), with at most one requeue;
    ``crash_at`` may be a ``{params.X}`` placeholder; ``extra``: more YAML lines. ``fault``:
    the fault section, by default off: "once" is the first Slurm attempt (restart count 0), so
    these jobs pin the requeue path, which an in-job restart would stand in front of."""
    return helper_job(
        directory,
        "crashy",
        "crashy.py",
        f"'{steps}', '{every}', '{crash_at}', {how}",
        f"requeue: {{max_requeues: 1, on_crash: {str(on_crash).lower()}}}\n"
        f"fault: {fault}\n" + extra,
    )
