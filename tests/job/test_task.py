"""The on-node runtime: finding the task's run dir, entry points, and a single-process run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.allocation import SlurmAllocation
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.config.load import dump_job_config, load_resolved_config
from hpc_ddp.config.model import JobConfig, RequeueConfig, TrainConfig
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.fault.coordinator import Coordinator
from hpc_ddp.job.command import record_child_end
from hpc_ddp.job.task import (
    resolve_entrypoint,
    run_job,
    task_run_dir,
)
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.provenance import read_code_runs
from hpc_ddp.runtime.distenv import derive_dist_env
from tests.conftest import REPO
from tests.ledgers import record_end, record_start
from tests.runtime.array_task import REF, TASK

pytestmark = pytest.mark.usefixtures("own_process")


def _run_dir(root: Path, cfg: JobConfig) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(dump_job_config(cfg))
    return root


def test_plain_run_dir(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "r", JobConfig(name="x"))
    assert task_run_dir(run, {}) == run


@pytest.mark.parametrize(
    ("index", "offset", "expected"), [("0", None, 0), ("2", None, 2), ("1", "1000", 1001)]
)
def test_array_task_finds_its_own_dir(
    tmp_path: Path, index: str, offset: str | None, expected: int
) -> None:
    sweep = tmp_path / "sweep"
    _run_dir(sweep / "tasks" / str(expected), JobConfig(name="x"))
    env = {"SLURM_ARRAY_TASK_ID": index}
    if offset:
        env["HPC_DDP_ARRAY_OFFSET"] = offset
    assert task_run_dir(sweep, env) == sweep / "tasks" / str(expected)


def test_missing_config_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="HINT"):
        task_run_dir(tmp_path, {})
    (tmp_path / "tasks").mkdir()
    with pytest.raises(RunDirError, match="array task 3"):
        task_run_dir(tmp_path, {"SLURM_ARRAY_TASK_ID": "3"})


def test_bad_entrypoint_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        resolve_entrypoint("no_such_module_xyz:main")
    with pytest.raises(ConfigError, match="HINT"):
        resolve_entrypoint("json:no_such_function")
    assert resolve_entrypoint("json:dumps") is json.dumps


@pytest.mark.torch
def test_single_process_run_trains_and_records_the_attempt(tmp_path: Path) -> None:
    """No launcher at all: the built-in trainer runs as rank 0 of 1 and finishes."""
    cfg = JobConfig(
        name="solo",
        train=TrainConfig(
            epochs=None,
            max_steps=12,
            batch_size=16,
            synthetic_samples=256,
            checkpoint_every=5,
            log_every=4,
        ),
    )
    run = _run_dir(tmp_path / "solo", cfg)
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    assert attempt.steps_done == 12
    assert (run / "checkpoints" / "step-00000012.pt").exists()
    assert (run / "checkpoints" / "step-00000010.pt").exists()


def _counted(monkeypatch: pytest.MonkeyPatch, name: str, *modules: str) -> list[object]:
    """Every call of the real ``name`` (as ``modules`` import it) from here on, by its result."""
    import importlib

    real = getattr(importlib.import_module(modules[0]), name)
    calls: list[object] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(result := real(*args, **kwargs))
        return result

    for module in modules:
        monkeypatch.setattr(importlib.import_module(module), name, counting)
    return calls


def test_a_task_derives_its_dist_env_once_and_passes_it_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code record, the watchdog and the built-in trainer's session each derived it again
    from the environment (three times per rank)."""
    derived = _counted(
        monkeypatch, "derive_dist_env", "hpc_ddp.runtime.distenv", "hpc_ddp.sessions.startup"
    )
    train = TrainConfig(epochs=None, max_steps=2, batch_size=16, synthetic_samples=64)
    cfg = JobConfig(name="once", train=train)
    run = _run_dir(tmp_path / "once", cfg)
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    assert len(derived) == 1
    assert read_ledger(run / "ledger.jsonl")[0].cause is EndCause.FINISHED


SESSION_CONFIGS: list[JobConfig] = []


def entry_opening_a_session() -> int:
    """A job's entry point (``entrypoint: tests.job.test_task:entry_opening_a_session``)."""
    import hpc_ddp

    with hpc_ddp.session() as s:
        SESSION_CONFIGS.append(s.config)
    return 0


def test_an_entry_points_session_takes_the_config_the_task_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task loaded and checked RUN_DIR/config.yaml, then the entry point's session loaded
    it again; a session opened later, outside the task, loads it itself."""
    loaded = _counted(
        monkeypatch, "load_resolved_config", "hpc_ddp.config.load", "hpc_ddp.sessions.startup"
    )
    cfg = JobConfig(name="entry", entrypoint="tests.job.test_task:entry_opening_a_session")
    run = _run_dir(tmp_path / "entry", cfg)
    SESSION_CONFIGS.clear()
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    assert len(loaded) == 1
    assert [c is loaded[0] for c in SESSION_CONFIGS] == [True]
    monkeypatch.setenv("HPC_DDP_RUN_DIR", str(run))
    entry_opening_a_session()  # not under the task: its own load
    assert len(loaded) == 2
    assert SESSION_CONFIGS[1] == loaded[1]


# --- `command:` jobs: the interpreter, and the parent of a child that crashes -------------------


KILL_SELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.fixture
def _own_signal_handlers() -> Iterator[None]:
    """run_command forwards stop signals to its child; pytest keeps its own handlers."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
    saved = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _command_run(
    tmp_path: Path, code: str, *, on_crash: bool, restart_count: int = 0
) -> tuple[Path, dict[str, str], FakeSlurm]:
    """A one-task Slurm `command:` run dir whose child runs ``python -c CODE``, and a Slurm
    that holds the job, running."""
    cfg = JobConfig(
        name="cmd",
        command=("python", "-c", code),
        requeue=RequeueConfig(max_requeues=1, on_crash=on_crash),
    )
    slurm = FakeSlurm()
    slurm.add_job("78", array_job_id="77", array_task_id="3", state=JobState.RUNNING,
                  restart_count=restart_count)  # fmt: skip
    env = {**TASK, "PATH": os.environ["PATH"], "SLURM_RESTART_COUNT": str(restart_count)}
    return _run_dir(tmp_path / "run", cfg), env, slurm


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_killed_command_child_is_requeued_with_on_crash(tmp_path: Path) -> None:
    """The child dies of SIGKILL, which no session inside it can see: the ``hpc_ddp run``
    parent takes the session's crash path, asks Slurm for exactly one requeue and records it."""
    run, env, slurm = _command_run(tmp_path, KILL_SELF, on_crash=True)
    assert (
        run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 128 + signal.SIGKILL
    )
    assert slurm.commands("scontrol") == [f"scontrol requeue {REF}"]
    assert slurm.jobs[REF].restart_count == 1
    [attempt] = read_ledger(run / "ledger.jsonl")  # the parent wrote the start the child did not
    assert (attempt.attempt, attempt.job_id, attempt.job_ref) == (0, "78", REF)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, True)
    assert attempt.message is not None
    assert attempt.message.startswith(f"rank 0 on n1: command `{sys.executable} -c` was killed")
    assert "SIGKILL; crash: requeue 1 of 1 (requeue.max_requeues)" in attempt.message
    # A second crash in the same attempt (another rank's parent) finds the claim taken.
    assert (
        run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 128 + signal.SIGKILL
    )
    assert slurm.commands("scontrol") == [f"scontrol requeue {REF}"]
    assert _events(run) == ["command_start", "attempt_start", "attempt_end", "command_start"]


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_crashed_command_child_without_on_crash_is_recorded_not_requeued(tmp_path: Path) -> None:
    run, env, slurm = _command_run(tmp_path, "raise SystemExit(7)", on_crash=False)
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 7
    assert slurm.calls == []
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, False)
    assert attempt.message is not None
    assert "exited with status 7; crashed: not requeued" in attempt.message
    assert f"then `hpc-ddp resume {run}` goes on from the newest checkpoint" in attempt.message


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_command_crash_past_the_budget_is_not_requeued(tmp_path: Path) -> None:
    run, env, slurm = _command_run(tmp_path, KILL_SELF, on_crash=True, restart_count=1)
    assert (
        run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 128 + signal.SIGKILL
    )
    assert slurm.commands("scontrol") == []
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert (attempt.restart, attempt.cause, attempt.requeue_requested) == (1, EndCause.CRASH, False)
    assert "requeue budget exhausted: 1 of requeue.max_requeues=1" in (attempt.message or "")


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_crash_the_childs_session_handled_is_not_handled_twice(tmp_path: Path) -> None:
    """A session that crashes raises out of its ``with`` block: the child exits 1 after its
    session claimed the requeue (on_crash) or wrote the attempt's end. Neither is repeated."""
    run, env, slurm = _command_run(tmp_path, "raise SystemExit(1)", on_crash=True)
    claim = run / "rendezvous" / "crash-requeue-78-0"  # as Coordinator.crash claims it
    claim.parent.mkdir()
    claim.touch()
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 1
    assert slurm.calls == []
    assert read_ledger(run / "ledger.jsonl") == []  # only rank 0's word that the child started

    claim.unlink()  # on_crash off, or past the budget: the session wrote the end, no claim
    ledger = run / "ledger.jsonl"
    record_start(ledger, attempt=0, job_id="78", job_ref=REF, nodelist="n1", world_size=1,
                 resumed_from_step=None, checkpoint=None)  # fmt: skip
    record_end(ledger, attempt=0, cause=EndCause.CRASH, steps_done=3, checkpoint=None,
               requeue_requested=False, message="rank 0 on n1: ValueError: x")  # fmt: skip
    before = _events(run)
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 1
    assert slurm.calls == []
    assert _events(run) == [*before, "command_start"]


SESSION_START = (
    "import os, pathlib; from hpc_ddp.durable import append_line; "
    "from hpc_ddp.rundir.ledger_events import LaunchId, start_event; "
    "append_line(pathlib.Path(os.environ['HPC_DDP_RUN_DIR']) / 'ledger.jsonl', start_event("
    "attempt=0, launch_id=LaunchId('78', '77_3', 0), nodelist='n1', world_size=1, "
    "resumed_from_step=None, checkpoint=None)); "
)
"""What a child's session writes first (rank 0): the attempt's start, for job 78, restart 0."""


@pytest.mark.usefixtures("_own_signal_handlers")
@pytest.mark.parametrize("code", [0, 3, 4])
def test_hpc_ddps_own_exit_codes_are_not_crashes(tmp_path: Path, code: int) -> None:
    """A child whose session recorded its attempt exits 0, 3 or 4 by hpc-ddp's own rules: the
    session said why in the ledger, the parent adds nothing."""
    run, env, slurm = _command_run(
        tmp_path, SESSION_START + f"raise SystemExit({code})", on_crash=True
    )
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == code
    assert slurm.calls == []
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.is_open  # only the session's own start: nothing added here


@pytest.mark.usefixtures("_own_signal_handlers")
@pytest.mark.parametrize("code", [3, 4])
def test_a_plain_command_exiting_3_or_4_crashed(tmp_path: Path, code: int) -> None:
    run, env, slurm = _command_run(tmp_path, f"raise SystemExit({code})", on_crash=False)
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == code
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.CRASH
    assert f"exited with status {code}; crashed: not requeued" in (attempt.message or "")


def _events(run: Path) -> list[str]:
    """The kinds of the ledger's lines, in order."""
    lines = (run / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in lines]


SIGTERM_PARENT = "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
"""A child that sends its ``hpc_ddp run`` parent SIGTERM, as Slurm does to every process."""


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_child_killed_by_a_forwarded_stop_signal_did_not_crash(tmp_path: Path) -> None:
    """A SIGTERM while Slurm still runs the job (srun ending the step for a rank that failed,
    whose own record speaks): the parent forwards it, and a child without a session dies of
    it. That is a stop, not a crash, and no requeue of this task's asking."""
    run, env, slurm = _command_run(tmp_path, SIGTERM_PARENT, on_crash=True)
    assert (
        run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 128 + signal.SIGTERM
    )
    assert slurm.commands("scontrol") == [f"scontrol show job -o {REF}"]  # asked, not requeued
    assert read_ledger(run / "ledger.jsonl") == []


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_cancelled_program_without_a_session_is_recorded_cancelled(tmp_path: Path) -> None:
    """Issue 39 (Low): `hpc-ddp cancel` (scancel: SIGTERM to every process, the job
    COMPLETING with no new restart) of a program without a session said `unknown`. Its parent
    records the attempt `cancelled`, as a session's cancel is, and asks for no requeue."""
    run, env, slurm = _command_run(tmp_path, SIGTERM_PARENT, on_crash=True)
    slurm.jobs[REF].state = JobState.COMPLETING
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 0
    assert slurm.commands("scontrol") == [f"scontrol show job -o {REF}"]
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CANCELLED, False)
    assert "cancelled" in (attempt.message or "")


def _plain_stop_code(marker: Path, on_term: str) -> str:
    """A child without a session that handles SIGTERM by ``on_term`` (``exit``: note it in
    ``marker`` and exit 0; ``ignore``), then sends its parent the requeue signal (USR2)."""
    handler = (
        f"lambda *a: (open({str(marker)!r}, 'w').write('TERM'), os._exit(0))"
        if on_term == "exit"
        else "signal.SIG_IGN"
    )
    return (
        "import os, signal, time; "
        f"signal.signal(signal.SIGTERM, {handler}); "
        "os.kill(os.getppid(), signal.SIGUSR2); "
        "time.sleep(60)"
    )


@pytest.mark.usefixtures("_own_signal_handlers")
@pytest.mark.parametrize("on_term", ["exit", "ignore"])
def test_a_program_without_a_session_gets_sigterm_for_the_warning_and_is_requeued(
    tmp_path: Path, on_term: str
) -> None:
    """Issue 32 item 13: the requeue signal's default action would kill the program unrecorded
    and unrequeued. It gets SIGTERM (one that ignores it, SIGKILL after the grace: half of a
    2 s lead time here), and its ``hpc_ddp run`` parent asks Slurm for one requeue."""
    marker = tmp_path / "termed"
    run, env, slurm = _command_run(tmp_path, _plain_stop_code(marker, on_term), on_crash=False)
    cfg = load_resolved_config(run / "config.yaml")
    lead = dataclasses.replace(cfg, requeue=dataclasses.replace(cfg.requeue, lead_time=2))
    (run / "config.yaml").write_text(dump_job_config(lead))
    began = time.monotonic()
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 0
    assert time.monotonic() - began < 30  # never the 60 s the child sleeps
    assert marker.exists() == (on_term == "exit")
    assert slurm.commands("scontrol") == [f"scontrol show job -o {REF}", f"scontrol requeue {REF}"]
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.TIME_LIMIT, True)
    assert attempt.steps_done is None
    assert "requeue 1 of 1 (requeue.max_requeues)" in (attempt.message or "")


# --- `command:` jobs through the local backend, as a user runs them -----------------------------


def _local_command_run(tmp_path: Path, code: str, path: str) -> Path:
    """``hpc-ddp submit --backend local --wait`` of a one-task job running
    ``[python, -c, CODE]``, with ``path`` as PATH; returns the run directory."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: cmd\n"
        f"command: [python, -c, {json.dumps(code)}]\n"
        "slurm: {nodes: 1, tasks_per_node: 1}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend", "local", "--wait",
         "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, env={**env, "PATH": path}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    return run_dir


def _printed(run_dir: Path) -> list[str]:
    """What the command printed after ``ran:`` (the rank log also holds submitit's lines)."""
    lines = (run_dir / "logs" / "rank-0.out").read_text().splitlines()
    return [line.removeprefix("ran: ") for line in lines if line.startswith("ran: ")]


def test_python_in_a_local_command_is_the_submitting_interpreter(tmp_path: Path) -> None:
    """Another ``python`` comes first on PATH (the nodes' /usr/bin/python, without torch):
    ``[python, ...]`` still runs the interpreter hpc-ddp was started with."""
    impostor = tmp_path / "bin"
    impostor.mkdir()
    for name in ("python", "python3"):
        (impostor / name).write_text("#!/bin/sh\necho impostor; exit 9\n")
        (impostor / name).chmod(0o755)
    run_dir = _local_command_run(
        tmp_path, "import sys; print('ran:', sys.executable)", f"{impostor}:{os.environ['PATH']}"
    )
    assert _printed(run_dir) == [sys.executable]


def test_a_command_job_gets_the_run_id(tmp_path: Path) -> None:
    run_dir = _local_command_run(
        tmp_path, "import os; print('ran:', os.environ['HPC_DDP_RUN_ID'])", os.environ["PATH"]
    )
    printed = _printed(run_dir)
    assert printed == [(run_dir / "run_id").read_text().strip()]
    assert printed[0].startswith("cmd-")


@pytest.mark.parametrize(("code", "state", "rc"), [(0, "COMPLETED", 0), (3, "FAILED", 1)])
def test_a_local_plain_command_gets_one_verdict_from_its_exit_status(
    tmp_path: Path, code: int, state: str, rc: int
) -> None:
    """A command without a session: `--wait` said COMPLETED while `status` said GONE? (no
    ledger entry). Its exit status is now its verdict, in both; 3 is the program's own error,
    not hpc-ddp's "budget spent" (no session ran in it)."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: cmd\ncommand: [python, -c, 'raise SystemExit({code})']\n"
        "slurm: {nodes: 1, tasks_per_node: 1}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend", "local", "--wait",
         "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == rc, done.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    [said] = [line for line in done.stderr.splitlines() if line.startswith("local job ")]
    assert said.split(": ")[1] == state
    shown = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "status", str(run_dir), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    [row] = json.loads(shown.stdout)["runs"]
    assert row["state"] == state, row
    [attempt] = read_ledger(run_dir / "ledger.jsonl")
    assert attempt.cause is (EndCause.FINISHED if code == 0 else EndCause.CRASH)


def _hpc(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_running_program_without_a_session_shows_its_attempt_running(tmp_path: Path) -> None:
    """Issue 39 (Low): a command without a session wrote nothing until its child ended, so
    `status` of a running plain attempt showed no attempt at all (`attempts 0`, causes `-`).
    Rank 0's `command_start` shows it running, and its end supersedes it: one attempt."""
    release = tmp_path / "release"
    code = (
        "import pathlib, time\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)\n"
    )
    (tmp_path / "wait.py").write_text(code)
    (tmp_path / "job.yaml").write_text(
        "name: plain\ncommand: [python, wait.py]\nslurm: {nodes: 1, tasks_per_node: 1}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    runs = tmp_path / "runs"
    started = _hpc("submit", "job.yaml", "--backend", "local", "--runs-dir", str(runs),
                   "--json", env=env, cwd=tmp_path)  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    [run_dir] = runs.iterdir()

    def status_until(done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while True:
            shown = _hpc("status", str(run_dir), "--json", env=env, cwd=tmp_path)
            [row] = json.loads(shown.stdout)["runs"]
            if done(row) or time.monotonic() > deadline:
                return dict(row)
            time.sleep(0.3)

    try:
        row = status_until(lambda r: bool(r["attempts"]))
        assert (row["state"], row["attempts"], row["causes"]) == ("RUNNING", 1, ["running"]), row
        [running] = row["attempt_list"]
        assert (running["cause"], running["world_size"], running["restart"]) == (None, 1, 0)
        assert row["elapsed_s"] is not None
        assert read_ledger(run_dir / "ledger.jsonl") == []  # the node side numbers without it
    finally:
        release.touch()
    row = status_until(lambda r: r["state"] != "RUNNING")
    assert (row["state"], row["attempts"], row["causes"]) == ("COMPLETED", 1, ["finished"]), row


@pytest.mark.torch
def test_a_torchrun_command_records_its_ranks_and_its_script(tmp_path: Path) -> None:
    """Issue 39 (Low): a plain program under torchrun was recorded with the task's world
    (`ranks 1`) and no code identity (torchrun's own file, at best). Its two workers and its
    script are what the ledger and `status` name now."""
    script = tmp_path / "work.py"
    script.write_text(
        "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )
    torchrun = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "--max-restarts=0", "work.py"]  # fmt: skip
    (tmp_path / "job.yaml").write_text(
        f"name: tr\ncommand: {json.dumps(torchrun)}\nslurm: {{nodes: 1, tasks_per_node: 1}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    runs = tmp_path / "runs"
    done = _hpc("submit", "job.yaml", "--backend", "local", "--wait", "--runs-dir", str(runs),
                env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = runs.iterdir()
    [attempt] = read_ledger(run_dir / "ledger.jsonl")
    assert (attempt.cause, attempt.world_size) == (EndCause.FINISHED, 2)
    shown = _hpc("status", str(run_dir), "--json", env=env, cwd=tmp_path)
    [row] = json.loads(shown.stdout)["runs"]
    assert [a["world_size"] for a in row["attempt_list"]] == [2]
    [code] = read_code_runs(run_dir / "ledger.jsonl")
    assert code.file == str(script.resolve())
    assert json.loads((run_dir / "manifest.json").read_text())["code_file"] == code.file


@pytest.mark.usefixtures("_own_signal_handlers")
def test_a_plain_command_that_exits_0_finished(tmp_path: Path) -> None:
    """No session in the child: its exit status is the verdict, recorded by the parent with
    the attempt's start, so `status` says COMPLETED rather than INCOMPLETE."""
    run, env, slurm = _command_run(tmp_path, "print('done')", on_crash=True)
    assert run_job(run, env, allocation=SlurmAllocation(env, slurm.client())) == 0
    assert slurm.calls == []
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert (attempt.attempt, attempt.job_id, attempt.job_ref) == (0, "78", REF)
    assert (attempt.cause, attempt.steps_done) == (EndCause.FINISHED, None)
    assert attempt.message == f"command `{sys.executable} -c` exited 0"
    # Another rank's parent: its child's exit 0 adds nothing (rank 0 speaks for the attempt).
    other = derive_dist_env({**env, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    fresh = tmp_path / "fresh" / "ledger.jsonl"
    face = SlurmAllocation(env, slurm.client())
    record_child_end(Coordinator(other, fresh, RequeueConfig(), face), 0, "p x", 0.0)
    assert not fresh.exists()
