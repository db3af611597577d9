"""A ``command:`` program as the task's child (:mod:`hpc_ddp.job.command`): its argv and
interpreter, which of its exits are crashes, what is recorded for a plain program, how many
ranks it runs, and the wait for the task's own stop signal. The whole path on real tasks is in
``test_plain_command_status_e2e.py`` and ``tests/fault/test_plain_command_requeue_e2e.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import ContainerConfig, EnvConfig, JobConfig
from hpc_ddp.job.command import (
    child_failure,
    command_argv,
    exit_status,
    task_interpreter,
)
from hpc_ddp.runtime.distenv import derive_dist_env

pytestmark = pytest.mark.usefixtures("own_process")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["python", "train.py", "--lr", "{params.lr}"],
            ["/venv/bin/python", "train.py", "--lr", "0.5"],
        ),
        (["python3", "-m", "pkg"], ["/venv/bin/python", "-m", "pkg"]),
        (["python3.11", "x.py"], ["python3.11", "x.py"]),  # exactly python or python3 only
        (["/usr/bin/python", "x.py"], ["/usr/bin/python", "x.py"]),  # a path is run as written
        (["torchrun", "python"], ["torchrun", "python"]),  # only the program itself
    ],
)
def test_python_in_a_command_is_the_tasks_interpreter(
    command: list[str], expected: list[str]
) -> None:
    cfg = job_config_from_dict({"name": "x", "command": command, "params": {"lr": 0.5}}, "t")
    assert command_argv(cfg, "/venv/bin/python") == expected


def test_the_tasks_interpreter_is_the_one_running_hpc_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    container = EnvConfig(container=ContainerConfig("apptainer", "/i.sif", python="/opt/py"))
    assert task_interpreter(JobConfig("x")) == sys.executable
    assert task_interpreter(JobConfig("x", env=container)) == sys.executable  # in the image
    monkeypatch.setattr(sys, "executable", "")  # Python could not tell its own path
    assert task_interpreter(JobConfig("x", env=container)) == "/opt/py"
    assert task_interpreter(JobConfig("x")) == ""
    assert command_argv(JobConfig("x", command=("python", "t.py")), "") == ["python", "t.py"]


@pytest.mark.parametrize(
    ("code", "expected", "status"),
    [
        (-9, "command `p x` was killed by SIGKILL", 137),
        (-11, "command `p x` was killed by SIGSEGV", 139),
        (-6, "command `p x` was killed by SIGABRT", 134),
        (1, "command `p x` exited with status 1", 1),
        (137, "command `p x` exited with status 137", 137),
        (0, None, 0),  # finished, or stopped and requeued by its session
        (3, None, 3),  # its session's requeue budget ran out: recorded by the session
        (4, None, 4),  # its session's requeue request failed: recorded by the session
    ],
)
def test_which_child_exits_are_crashes(code: int, expected: str | None, status: int) -> None:
    assert child_failure(code, "p x") == expected
    assert exit_status(code) == status


@pytest.mark.parametrize("code", [3, 4])
def test_hpc_ddps_own_codes_are_a_plain_programs_failures(code: int) -> None:
    """Without a session nothing of hpc-ddp's ran in the child: 3 and 4 are its own errors."""
    assert child_failure(code, "p x", session=False) == f"command `p x` exited with status {code}"
    assert child_failure(0, "p x", session=False) is None


@pytest.mark.parametrize(
    ("launcher", "command", "ranks"),
    [
        (None, ["python", "train.py"], 2),
        ("torchrun", ["python", "train.py"], 2 * 4),
        (None, ["torchrun", "--nnodes=2", "--nproc-per-node=3", "train.py"], 6),
        (
            None,
            [
                "python",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "train.py",
            ],
            2,
        ),
        (None, ["torchrun", "--nproc-per-node=gpu", "train.py"], 2),  # not known: the tasks
        (None, ["torchrun", "--nnodes=1:4", "--nproc-per-node=2", "train.py"], 2),
    ],
)
def test_the_ranks_a_command_runs(launcher: str | None, command: list[str], ranks: int) -> None:
    """Issue 39 (Low): a torchrun task showed `ranks 1`. What `hpc-ddp run` records for its
    program counts torchrun's workers (2 Slurm tasks here, 4 workers each under the launcher)."""
    from hpc_ddp.job.command import program_ranks

    dist = {"launcher": launcher, "procs_per_node": 4} if launcher else {}
    cfg = job_config_from_dict(
        {"name": "r", "command": command, "dist": dist,
         "slurm": {"nodes": 2, "tasks_per_node": 1}}, "test",
    )  # fmt: skip
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)",
           "SLURM_STEP_ID": "0"}  # fmt: skip
    assert program_ranks(cfg, command, derive_dist_env(env)) == ranks


def test_a_child_killed_by_sigterm_waits_for_the_tasks_own_stop_signal() -> None:
    """A cancel signals every process of the step, but not at once: the child's SIGTERM can
    end it before its task's own arrives. The task waits for that signal (a real one, here
    0.3 s late) before it takes the end for the program's crash; any other end is not held."""
    import threading

    from hpc_ddp.job.command import _await_own_stop, _Forwarder

    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    forward = _Forwarder(done, None, 0.0, signal.SIGUSR2, 1.0)  # type: ignore[arg-type]
    forward.plain = False  # a session's child: the signal is only passed on (to no one)
    before = signal.signal(signal.SIGUSR1, forward)
    try:
        began = time.monotonic()
        _await_own_stop(forward, 1, lag_s=5.0)  # an exit status: no wait
        assert time.monotonic() - began < 0.5
        late = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        late.start()
        _await_own_stop(forward, -signal.SIGTERM, lag_s=5.0)
        late.join()
        assert forward.stops == [signal.SIGUSR1]
        assert time.monotonic() - began < 3.0
    finally:
        signal.signal(signal.SIGUSR1, before)
