"""The requeue coordinator on rank 0, against Slurm's answers through an injected runner.

Each test gives :class:`~hpc_ddp.slurm.client.SlurmClient` a runner that answers ``scontrol``
the way Slurm 22.05 was seen to (or fails the way it does when it cannot be reached), then
checks the three things a stop decides: which Slurm commands ran, the exit code the tasks
leave with (non-zero: Slurm records the job FAILED), and the ledger's ``attempt_end``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hpc_ddp.config.model import RequeueConfig
from hpc_ddp.errors import SlurmUnavailableError
from hpc_ddp.runtime.distenv import derive_dist_env
from hpc_ddp.runtime.ledger import Attempt, EndCause, read_ledger
from hpc_ddp.runtime.requeue import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE, Coordinator
from hpc_ddp.slurm.client import CompletedCommand, SlurmClient, subprocess_runner

USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)
REF = "77_3"
CKPT = "step-00000012.pt"

TASK = {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_JOB_ID": "78",
    "SLURM_ARRAY_JOB_ID": "77",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_JOB_NODELIST": "n1",
    "SLURMD_NODENAME": "n1",
    "SLURM_STEP_ID": "0",
}

RUNNING = "JobId=78 ArrayJobId=77 ArrayTaskId=3 JobState=RUNNING Restarts=0 PreemptTime=None"
REQUEUEING = "JobId=78 JobState=COMPLETING Restarts=1 PreemptTime=None"
CANCELLING = "JobId=78 JobState=COMPLETING Restarts=0 PreemptTime=None"
# What scontrol prints when it cannot reach the controller, and without munged's socket.
UNREACHABLE = "scontrol: error: Unable to contact slurm controller (connect failure)\n"
NO_MUNGE = (
    'scontrol: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": '
    "No such file or directory (Did you start munged?)\n"
)

Answer = str | tuple[int, str] | Exception
"""A fake command's answer: stdout (exit 0), (exit code, stderr), or an error to raise."""


class FakeRunner:
    """Answers ``scontrol show job`` and ``scontrol requeue`` from queues; records every argv."""

    def __init__(self, show: Sequence[Answer] = (), requeue: Sequence[Answer] = ()) -> None:
        self.answers = {"show": list(show), "requeue": list(requeue)}
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        del timeout
        self.calls.append(" ".join(argv))
        assert argv[0] == "scontrol", argv
        queue = self.answers[argv[1]]
        assert queue, f"unexpected command: {' '.join(argv)}"
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, str):
            return CompletedCommand(tuple(argv), 0, answer + "\n", "")
        code, stderr = answer
        return CompletedCommand(tuple(argv), code, "", stderr)


def coordinator(
    tmp_path: Path,
    runner: Callable[..., CompletedCommand],
    *,
    env: dict[str, str] | None = None,
    restart_count: int = 0,
    max_requeues: int = 5,
) -> Coordinator:
    task = dict(TASK if env is None else env)
    if restart_count:
        task["SLURM_RESTART_COUNT"] = str(restart_count)
    return Coordinator(
        derive_dist_env(task),
        tmp_path / "ledger.jsonl",
        RequeueConfig(max_requeues=max_requeues),
        SlurmClient(runner),
    )


def ended(tmp_path: Path) -> Attempt:
    """The one attempt in the ledger (no start was recorded: the end alone is not folded)."""
    [attempt] = read_ledger(tmp_path / "ledger.jsonl")
    assert attempt.ended is not None
    return attempt


def stop(c: Coordinator, signum: int) -> tuple[EndCause, bool, int, str]:
    c.begin(resumed_from_step=None, checkpoint=None)
    out = c.stop(signum, step=12, checkpoint=CKPT)
    return out.cause, out.requeue_requested, out.exit_code, out.message


def test_requeue_signal_while_running_asks_for_exactly_one_requeue(tmp_path: Path) -> None:
    runner = FakeRunner(show=[RUNNING], requeue=[""])
    assert stop(coordinator(tmp_path, runner), USR2)[:3] == (EndCause.TIME_LIMIT, True, 0)
    assert runner.calls == [f"scontrol show job -o {REF}", f"scontrol requeue {REF}"]
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.TIME_LIMIT, True)


FAILURES = {
    "controller-unreachable": (1, UNREACHABLE),
    "no-munge-socket": (1, NO_MUNGE),
    "scontrol-missing": SlurmUnavailableError("'scontrol' is not on PATH (running `scontrol`)"),
}


@pytest.mark.parametrize("failure", list(FAILURES.values()), ids=list(FAILURES))
def test_a_failed_requeue_is_a_failure_not_a_requeue(tmp_path: Path, failure: Answer) -> None:
    """The bug of issue 11: Slurm's silence after a failed request was read as "Slurm
    requeued it itself", the ledger said requeue_requested and the job ended COMPLETED."""
    runner = FakeRunner(show=[failure, failure], requeue=[failure])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), USR2)
    assert (cause, requested, code) == (EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE)
    assert code not in (0, BUDGET_EXIT_CODE)
    # Asked why, asked for the requeue, asked again whether Slurm had won a race: no answer.
    assert runner.calls == [
        f"scontrol show job -o {REF}",
        f"scontrol requeue {REF}",
        f"scontrol show job -o {REF}",
    ]
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.REQUEUE_FAILED, False)
    assert (attempt.steps_done, attempt.checkpoint) == (12, CKPT)
    assert attempt.message == message
    assert f"could not requeue job {REF}" in message
    assert f"The checkpoint at step 12 ({CKPT}) is kept" in message
    assert "FAILED" in message
    assert "HINT: let the job reach Slurm" in message
    assert f"run `scontrol requeue {REF}`" in message
    # What Slurm (or the missing command) said, verbatim.
    said = failure.args[0] if isinstance(failure, Exception) else failure[1].strip()
    assert said.removeprefix("scontrol: error: ") in message
    assert message.count("HINT:") == 1  # the client's own hint is not carried along


def test_scontrol_missing_through_the_real_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As inside a container without Slurm's commands: PATH has no scontrol at all."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    c = coordinator(tmp_path, subprocess_runner)
    cause, requested, code, message = stop(c, USR2)
    assert (cause, requested, code) == (EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE)
    assert "'scontrol' is not on PATH" in message
    assert ended(tmp_path).cause is EndCause.REQUEUE_FAILED


def test_requeue_refused_while_the_job_still_runs_is_a_failure(tmp_path: Path) -> None:
    """Slurm answers, but refuses the request and is not requeueing the job itself."""
    refused = (1, "scontrol: error: Access/permission denied for job 77_3\n")
    runner = FakeRunner(show=[RUNNING, RUNNING], requeue=[refused])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), USR2)
    assert (cause, requested, code) == (EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE)
    assert "Access/permission denied for job 77_3" in message
    assert "after time_limit" in message


@pytest.mark.parametrize(
    ("after", "cause"),
    [(REQUEUEING, EndCause.MANUAL_REQUEUE), (CANCELLING, EndCause.CANCELLED)],
    ids=["slurm-requeued-meanwhile", "cancelled-meanwhile"],
)
def test_a_refusal_explained_by_slurm_is_not_a_failure(
    tmp_path: Path, after: str, cause: EndCause
) -> None:
    """Lost a race: the refusal is explained by Slurm's own answer (Restarts went up, or the
    job is being cancelled). Exit 0: Slurm decides the job's fate; nothing claims a request."""
    refused = (1, "scontrol: error: Job is being requeued\n")
    runner = FakeRunner(show=[RUNNING, after], requeue=[refused])
    assert stop(coordinator(tmp_path, runner), USR2)[:3] == (cause, False, 0)
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (cause, False)
    assert attempt.message is not None
    assert "Job is being requeued" in attempt.message


def test_unanswered_requeue_signal_still_asks_and_succeeds(tmp_path: Path) -> None:
    """``show job`` failed once, the requeue went through: a requeue, honestly recorded."""
    runner = FakeRunner(show=[(1, UNREACHABLE)], requeue=[""])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), USR2)
    assert (cause, requested, code) == (EndCause.TIME_LIMIT, True, 0)
    assert "could not be asked" in message
    assert runner.calls == [f"scontrol show job -o {REF}", f"scontrol requeue {REF}"]


def test_unanswered_sigterm_asks_for_nothing_and_exits_non_zero(tmp_path: Path) -> None:
    """SIGTERM with no answer from Slurm: perhaps Slurm's requeue, perhaps a cancel. No
    request (a second requeue or a cancelled job brought back would be wrong), not assumed
    to be a requeue, and a non-zero exit so a job nobody brings back ends FAILED."""
    runner = FakeRunner(show=[(1, UNREACHABLE)])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), TERM)
    assert (cause, requested, code) == (EndCause.UNKNOWN, False, REQUEUE_FAILED_EXIT_CODE)
    assert runner.calls == [f"scontrol show job -o {REF}"]
    assert "Unable to contact slurm controller" in message
    assert f"The checkpoint at step 12 ({CKPT}) is kept" in message
    assert "HINT:" in message
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.UNKNOWN, False)


@pytest.mark.parametrize(
    ("job", "cause"),
    [(REQUEUEING, EndCause.MANUAL_REQUEUE), (CANCELLING, EndCause.CANCELLED)],
)
def test_sigterm_slurm_explains_asks_for_nothing_and_exits_zero(
    tmp_path: Path, job: str, cause: EndCause
) -> None:
    runner = FakeRunner(show=[job])
    assert stop(coordinator(tmp_path, runner), TERM)[:3] == (cause, False, 0)
    assert runner.calls == [f"scontrol show job -o {REF}"]


@pytest.mark.parametrize("show", [RUNNING.replace("Restarts=0", "Restarts=2"), (1, UNREACHABLE)])
def test_budget_exhausted_at_a_stop_fails_without_a_request(tmp_path: Path, show: Answer) -> None:
    """Attempt 2 of max_requeues=2 gets the requeue signal: no requeue, exit 3 (FAILED);
    also when Slurm cannot be asked (the budget needs no answer from it)."""
    runner = FakeRunner(show=[show])
    c = coordinator(tmp_path, runner, restart_count=2, max_requeues=2)
    cause, requested, code, message = stop(c, USR2)
    assert (cause, requested, code) == (EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE)
    assert runner.calls == [f"scontrol show job -o {REF}"]  # never `scontrol requeue`
    assert "2 of requeue.max_requeues=2" in message
    assert "HINT: raise it" in message
    attempt = ended(tmp_path)
    assert (attempt.attempt, attempt.cause, attempt.requeue_requested) == (
        2,
        EndCause.BUDGET_EXHAUSTED,
        False,
    )


def test_one_requeue_left_is_still_asked_for(tmp_path: Path) -> None:
    runner = FakeRunner(show=[RUNNING.replace("Restarts=0", "Restarts=1")], requeue=[""])
    c = coordinator(tmp_path, runner, restart_count=1, max_requeues=2)
    assert stop(c, USR2)[:3] == (EndCause.TIME_LIMIT, True, 0)


def test_an_attempt_beyond_the_budget_ends_at_its_start(tmp_path: Path) -> None:
    """Slurm requeued the job itself once too often: the attempt ends before training."""
    runner = FakeRunner()
    c = coordinator(tmp_path, runner, restart_count=3, max_requeues=2)
    outcome = c.begin(resumed_from_step=40, checkpoint="step-00000040.pt")
    assert outcome is not None
    assert (outcome.cause, outcome.exit_code) == (EndCause.BUDGET_EXHAUSTED, BUDGET_EXIT_CODE)
    assert "HINT" in outcome.message
    assert runner.calls == []
    attempt = ended(tmp_path)
    assert (attempt.attempt, attempt.cause, attempt.steps_done) == (
        3,
        EndCause.BUDGET_EXHAUSTED,
        40,
    )


def test_only_rank_zero_asks_and_writes(tmp_path: Path) -> None:
    runner = FakeRunner()
    c = coordinator(tmp_path, runner, env={**TASK, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert stop(c, USR2)[:3] == (EndCause.UNKNOWN, False, 0)
    assert runner.calls == []
    assert not (tmp_path / "ledger.jsonl").exists()


def test_outside_slurm_nothing_is_asked_and_the_run_stops_cleanly(tmp_path: Path) -> None:
    runner = FakeRunner()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    cause, requested, code, message = stop(coordinator(tmp_path, runner, env=env), USR2)
    assert (cause, requested, code) == (EndCause.TIME_LIMIT, False, 0)
    assert "not a Slurm job" in message
    assert runner.calls == []
