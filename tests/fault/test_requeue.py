"""The requeue coordinator on rank 0, against Slurm's answers through an injected runner.

Each test gives the coordinator a :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm` that answers
``scontrol``
the way Slurm 22.05 was seen to (or fails the way it does when it cannot be reached), then
checks the three things a stop decides: which Slurm commands ran, the exit code the tasks
leave with (non-zero: Slurm records the job FAILED), and the ledger's ``attempt_end``.

Why a stop came: ``classify_stop``, the table of what a task sees when told to stop (observed
on Slurm 22.05).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.allocation import SlurmAllocation, standing_of
from hpc_ddp.backends.slurm.client import SlurmClient, subprocess_runner
from hpc_ddp.backends.slurm.fake import Answer, FakeSlurm
from hpc_ddp.config.model import RequeueConfig
from hpc_ddp.errors import SlurmUnavailableError
from hpc_ddp.exitcodes import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.fault.coordinator import Coordinator
from hpc_ddp.fault.requeue import (
    classify_stop,
    classify_unanswered_stop,
    decide_requeue,
    signal_number,
)
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.runtime.distenv import derive_dist_env
from tests.runtime.array_task import REF, TASK

USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)
CKPT = "step-00000012.pt"


RUNNING = "JobId=78 ArrayJobId=77 ArrayTaskId=3 JobState=RUNNING Restarts=0 PreemptTime=None"
REQUEUEING = "JobId=78 JobState=COMPLETING Restarts=1 PreemptTime=None"
CANCELLING = "JobId=78 JobState=COMPLETING Restarts=0 PreemptTime=None"
# What scontrol prints when it cannot reach the controller, and without munged's socket.
UNREACHABLE = "scontrol: error: Unable to contact slurm controller (connect failure)\n"
NO_MUNGE = (
    'scontrol: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": '
    "No such file or directory (Did you start munged?)\n"
)


def fake(show: Sequence[Answer] = (), requeue: Sequence[Answer] = ()) -> FakeSlurm:
    """A Slurm whose next ``scontrol show job`` / ``scontrol requeue`` answers are scripted."""
    slurm = FakeSlurm()
    slurm.script("scontrol show job", *show)
    slurm.script("scontrol requeue", *requeue)
    return slurm


def coordinator(
    tmp_path: Path,
    runner: FakeSlurm | None,
    *,
    env: dict[str, str] | None = None,
    restart_count: int = 0,
    max_requeues: int = 5,
    on_crash: bool = False,
) -> Coordinator:
    task = dict(TASK if env is None else env)
    if restart_count:
        task["SLURM_RESTART_COUNT"] = str(restart_count)
    return Coordinator(
        derive_dist_env(task),
        tmp_path / "ledger.jsonl",
        RequeueConfig(max_requeues=max_requeues, on_crash=on_crash),
        SlurmAllocation(
            task, runner.client() if runner is not None else SlurmClient(subprocess_runner)
        ),
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
    runner = fake(show=[RUNNING], requeue=[""])
    assert stop(coordinator(tmp_path, runner), USR2)[:3] == (EndCause.TIME_LIMIT, True, 0)
    assert runner.commands() == [f"scontrol show job -o {REF}", f"scontrol requeue {REF}"]
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
    runner = fake(show=[failure, failure], requeue=[failure])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), USR2)
    assert (cause, requested, code) == (EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE)
    assert code not in (0, BUDGET_EXIT_CODE)
    # Asked why, asked for the requeue, asked again whether Slurm had won a race: no answer.
    assert runner.commands() == [
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
    # Slurm forgets the job after MinJobAge, and `scontrol requeue` with it: resume still works.
    assert f"`hpc-ddp resume {tmp_path}`" in message
    # What Slurm (or the missing command) said, verbatim.
    assert isinstance(failure, Exception | tuple)
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
    c = coordinator(tmp_path, None)
    cause, requested, code, message = stop(c, USR2)
    assert (cause, requested, code) == (EndCause.REQUEUE_FAILED, False, REQUEUE_FAILED_EXIT_CODE)
    assert "'scontrol' is not on PATH" in message
    assert ended(tmp_path).cause is EndCause.REQUEUE_FAILED


def test_requeue_refused_while_the_job_still_runs_is_a_failure(tmp_path: Path) -> None:
    """Slurm answers, but refuses the request and is not requeueing the job itself."""
    refused = (1, "scontrol: error: Access/permission denied for job 77_3\n")
    runner = fake(show=[RUNNING, RUNNING], requeue=[refused])
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
    runner = fake(show=[RUNNING, after], requeue=[refused])
    assert stop(coordinator(tmp_path, runner), USR2)[:3] == (cause, False, 0)
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (cause, False)
    assert attempt.message is not None
    assert "Job is being requeued" in attempt.message


def test_unanswered_requeue_signal_still_asks_and_succeeds(tmp_path: Path) -> None:
    """``show job`` failed once, the requeue went through: a requeue, honestly recorded."""
    runner = fake(show=[(1, UNREACHABLE)], requeue=[""])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), USR2)
    assert (cause, requested, code) == (EndCause.TIME_LIMIT, True, 0)
    assert "could not be asked" in message
    assert runner.commands() == [f"scontrol show job -o {REF}", f"scontrol requeue {REF}"]


def test_unanswered_sigterm_asks_for_nothing_and_exits_non_zero(tmp_path: Path) -> None:
    """SIGTERM with no answer from Slurm: perhaps Slurm's requeue, perhaps a cancel. No
    request (a second requeue or a cancelled job brought back would be wrong), not assumed
    to be a requeue, and a non-zero exit so a job nobody brings back ends FAILED."""
    runner = fake(show=[(1, UNREACHABLE)])
    cause, requested, code, message = stop(coordinator(tmp_path, runner), TERM)
    assert (cause, requested, code) == (EndCause.UNKNOWN, False, REQUEUE_FAILED_EXIT_CODE)
    assert runner.commands() == [f"scontrol show job -o {REF}"]
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
    runner = fake(show=[job])
    assert stop(coordinator(tmp_path, runner), TERM)[:3] == (cause, False, 0)
    assert runner.commands("scontrol") == [f"scontrol show job -o {REF}"]


def test_a_requeue_slurm_started_for_a_lost_node_is_a_node_failure(tmp_path: Path) -> None:
    """Slurm requeues a job whose node failed (and keeps no reason for it in the job): the
    rank that handles the SIGTERM finds the job's node down, and says node_fail, not a
    person's manual requeue."""
    runner = fake(show=[f"{REQUEUEING} NodeList=n[1-2]"])
    runner.node_states = {"n1": "allocated", "n2": "down*"}
    cause, requested, code, message = stop(coordinator(tmp_path, runner), TERM)
    assert (cause, requested, code) == (EndCause.NODE_FAIL, False, 0)
    assert "node n2 failed" in message
    assert runner.commands("sinfo") == ["sinfo -h -N -n n1,n2 -o %N|%T"]
    assert ended(tmp_path).cause is EndCause.NODE_FAIL


@pytest.mark.parametrize("show", [RUNNING.replace("Restarts=0", "Restarts=2"), (1, UNREACHABLE)])
def test_budget_exhausted_at_a_stop_fails_without_a_request(tmp_path: Path, show: Answer) -> None:
    """Attempt 2 of max_requeues=2 gets the requeue signal: no requeue, exit 3 (FAILED);
    also when Slurm cannot be asked (the budget needs no answer from it)."""
    runner = fake(show=[show])
    c = coordinator(tmp_path, runner, restart_count=2, max_requeues=2)
    cause, requested, code, message = stop(c, USR2)
    assert (cause, requested, code) == (EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE)
    assert runner.commands() == [f"scontrol show job -o {REF}"]  # never `scontrol requeue`
    assert "2 of requeue.max_requeues=2" in message
    assert f"HINT: go on with a larger budget: `hpc-ddp resume {tmp_path} " in message
    assert message.count("requeue budget exhausted") == 1, message  # said once, not twice
    assert message.startswith("time_limit: requeue budget exhausted: 2 of")
    attempt = ended(tmp_path)
    # The first attempt this run's ledger holds, restart 2 of its job (the budget's count).
    assert (attempt.attempt, attempt.restart, attempt.cause, attempt.requeue_requested) == (
        0,
        2,
        EndCause.BUDGET_EXHAUSTED,
        False,
    )


def test_one_requeue_left_is_still_asked_for(tmp_path: Path) -> None:
    runner = fake(show=[RUNNING.replace("Restarts=0", "Restarts=1")], requeue=[""])
    c = coordinator(tmp_path, runner, restart_count=1, max_requeues=2)
    assert stop(c, USR2)[:3] == (EndCause.TIME_LIMIT, True, 0)


def test_an_attempt_beyond_the_budget_ends_at_its_start(tmp_path: Path) -> None:
    """Slurm requeued the job itself once too often: the attempt ends before training."""
    runner = fake()
    c = coordinator(tmp_path, runner, restart_count=3, max_requeues=2)
    outcome = c.begin(resumed_from_step=40, checkpoint="step-00000040.pt")
    assert outcome is not None
    assert (outcome.cause, outcome.exit_code) == (EndCause.BUDGET_EXHAUSTED, BUDGET_EXIT_CODE)
    assert "HINT" in outcome.message
    assert runner.commands() == []
    attempt = ended(tmp_path)
    assert (attempt.restart, attempt.cause, attempt.steps_done) == (
        3,
        EndCause.BUDGET_EXHAUSTED,
        40,
    )


def test_only_rank_zero_asks_and_writes(tmp_path: Path) -> None:
    runner = fake()
    c = coordinator(tmp_path, runner, env={**TASK, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert stop(c, USR2)[:3] == (EndCause.UNKNOWN, False, 0)
    assert runner.commands() == []
    assert not (tmp_path / "ledger.jsonl").exists()


def test_outside_slurm_nothing_is_asked_and_the_run_stops_cleanly(tmp_path: Path) -> None:
    runner = fake()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    cause, requested, code, message = stop(coordinator(tmp_path, runner, env=env), USR2)
    assert (cause, requested, code) == (EndCause.TIME_LIMIT, False, 0)
    assert "not a Slurm job, so no requeue is possible" in message
    assert "requeue 1 of" not in message  # no requeue is counted that nothing will make
    assert f"HINT: `hpc-ddp resume {tmp_path}`" in message
    assert runner.commands() == []


def test_attempts_are_numbered_across_the_runs_jobs_and_the_budget_per_job(
    tmp_path: Path,
) -> None:
    """Job 78 runs twice (a requeue: restart 1), then `hpc-ddp resume` submits job 90: its
    first attempt is the run's third (2), its requeue budget starts afresh (restart 0), and a
    peer's crash end with no start of its own joins the attempt its job and restart have."""
    runner = fake(show=[RUNNING, RUNNING.replace("Restarts=0", "Restarts=1")], requeue=["", ""])
    expected = [
        (EndCause.TIME_LIMIT, True, 0),
        (EndCause.BUDGET_EXHAUSTED, False, BUDGET_EXIT_CODE),
    ]
    for restart in (0, 1):
        c = coordinator(tmp_path, runner, restart_count=restart, max_requeues=1)
        assert stop(c, USR2)[:3] == expected[restart]
    plain = {**{k: v for k, v in TASK.items() if "ARRAY" not in k}, "SLURM_JOB_ID": "90",
             "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]"}  # fmt: skip
    new = coordinator(tmp_path, fake(), env=plain, max_requeues=1)
    assert new.begin(resumed_from_step=12, checkpoint=CKPT) is None  # within its own budget
    peer = coordinator(tmp_path, fake(), env={**plain, "SLURM_PROCID": "1"})
    peer.crash(step=None, checkpoint=None, error="ValueError: boom")
    attempts = read_ledger(tmp_path / "ledger.jsonl")
    assert [(a.attempt, a.restart, a.job_id, a.cause) for a in attempts] == [
        (0, 0, "78", EndCause.TIME_LIMIT),
        (1, 1, "78", EndCause.BUDGET_EXHAUSTED),
        (2, 0, "90", EndCause.CRASH),
    ]
    raw = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["attempt"] for e in raw] == [0, 0, 1, 1, 2, 2]  # the file says so too


# --- crashes ------------------------------------------------------------------------------------


def running_task(restart_count: int = 0) -> FakeSlurm:
    """A Slurm whose job table holds this task, running: it answers from its table."""
    slurm = FakeSlurm()
    slurm.add_job(
        "78",
        array_job_id="77",
        array_task_id="3",
        state=JobState.RUNNING,
        restart_count=restart_count,
    )
    return slurm


def crash(c: Coordinator) -> None:
    c.begin(resumed_from_step=None, checkpoint=None)
    c.crash(step=7, checkpoint=CKPT, error=ValueError("boom at step 7"))


def test_a_crash_with_on_crash_requeues_the_job_once(tmp_path: Path) -> None:
    slurm = running_task()
    crash(coordinator(tmp_path, slurm, max_requeues=1, on_crash=True))
    assert slurm.commands("scontrol") == [f"scontrol requeue {REF}"]
    assert slurm.jobs[REF].restart_count == 1  # Slurm took it
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, True)
    assert attempt.message is not None
    assert "ValueError: boom at step 7" in attempt.message
    assert "requeue 1 of 1" in attempt.message


def test_only_the_first_rank_to_crash_requests_the_requeue(tmp_path: Path) -> None:
    """Rank 1 crashed first; rank 0 dies of the lost connection: one request, one end."""
    slurm = running_task()
    env1 = {**TASK, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    first = coordinator(tmp_path, slurm, env=env1, max_requeues=1, on_crash=True)
    peer = coordinator(
        tmp_path, slurm, env={**TASK, "SLURM_NTASKS": "2"}, max_requeues=1, on_crash=True
    )
    peer.begin(resumed_from_step=None, checkpoint=None)  # rank 0 writes the start
    first.crash(step=7, checkpoint=CKPT, error=ValueError("boom at step 7"))
    peer.crash(step=7, checkpoint=CKPT, error=RuntimeError("Connection closed by peer"))
    assert slurm.commands("scontrol requeue") == [f"scontrol requeue {REF}"]
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len([line for line in lines if "attempt_end" in line]) == 1
    assert "rank 1" in (ended_message := ended(tmp_path).message or "")
    assert "Connection closed" not in ended_message


def test_a_crash_without_on_crash_is_not_requeued(tmp_path: Path) -> None:
    slurm = running_task()
    crash(coordinator(tmp_path, slurm, max_requeues=1, on_crash=False))
    assert slurm.calls == []
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, False)
    assert attempt.message is not None
    # How to go on: fix the error and resume, or let crashes requeue.
    assert f"fix the error in the rank logs, then `hpc-ddp resume {tmp_path}`" in attempt.message
    assert "requeue.on_crash=true" in attempt.message


def test_a_crash_described_in_words_by_a_claim_holder_requeues(tmp_path: Path) -> None:
    """The ``hpc_ddp run`` parent of a ``command`` child that was killed has already won the
    claim: it describes the death in words and asks for the requeue itself."""
    slurm = running_task()
    c = coordinator(tmp_path, slurm, max_requeues=1, on_crash=True)
    c.begin(resumed_from_step=None, checkpoint=None)
    c.crash(step=None, checkpoint=None, error="command `x` was killed by SIGKILL", claimed=True)
    assert slurm.commands("scontrol") == [f"scontrol requeue {REF}"]
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, True)
    assert attempt.message == (
        "rank 0 on n1: command `x` was killed by SIGKILL; crash: requeue 1 of 1 "
        "(requeue.max_requeues)"
    )


def test_a_crash_past_the_budget_is_not_requeued(tmp_path: Path) -> None:
    slurm = running_task(restart_count=1)
    crash(coordinator(tmp_path, slurm, restart_count=1, max_requeues=1, on_crash=True))
    assert slurm.calls == []
    attempt = ended(tmp_path)
    assert (attempt.restart, attempt.cause, attempt.requeue_requested) == (
        1,
        EndCause.CRASH,
        False,
    )
    assert attempt.message is not None
    assert "requeue budget exhausted: 1 of requeue.max_requeues=1" in attempt.message
    assert f"hpc-ddp resume {tmp_path} requeue.max_requeues=" in attempt.message


def test_a_crash_whose_requeue_fails_says_so_and_how_to_go_on(tmp_path: Path) -> None:
    slurm = running_task()
    slurm.fail("scontrol requeue", "scontrol: error: Access/permission denied for job 77_3")
    crash(coordinator(tmp_path, slurm, max_requeues=1, on_crash=True))
    assert slurm.commands() == [f"scontrol requeue {REF}"]
    assert slurm.jobs[REF].restart_count == 0
    attempt = ended(tmp_path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, False)
    assert attempt.message is not None
    assert "Access/permission denied for job 77_3" in attempt.message
    assert f"`hpc-ddp resume {tmp_path}`" in attempt.message


def test_a_crash_outside_slurm_asks_nothing(tmp_path: Path) -> None:
    slurm = running_task()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    crash(coordinator(tmp_path, slurm, env=env, max_requeues=1, on_crash=True))
    assert slurm.calls == []
    attempt = ended(tmp_path)
    assert attempt.requeue_requested is False
    assert attempt.message is not None
    # It used to read "crash: requeue 1 of 1" beside requeue_requested false.
    assert "requeue 1 of 1" not in attempt.message
    assert "not a Slurm job, so no requeue is possible" in attempt.message
    assert f"`hpc-ddp resume {tmp_path}`" in attempt.message


def test_the_budget_hint_names_the_resume_command(tmp_path: Path) -> None:
    """A stop past the budget and an attempt past it both say how to go on."""
    slurm = running_task(restart_count=3)
    outcome = coordinator(tmp_path, slurm, restart_count=3, max_requeues=2).begin(
        resumed_from_step=None, checkpoint=None
    )
    assert outcome is not None
    assert f"`hpc-ddp resume {tmp_path} requeue.max_requeues=4`" in outcome.message


USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)


def job(state: str, restarts: int, preempt: str = "None") -> dict[str, str]:
    return {"JobState": state, "Restarts": str(restarts), "PreemptTime": preempt}


@pytest.mark.parametrize(
    ("signum", "restart_count", "fields", "cause", "requeue"),
    [
        # --signal=USR2@lead before the time limit (or scancel --signal=USR2)
        (USR2, 0, job("RUNNING", 0), EndCause.TIME_LIMIT, True),
        (USR2, 3, job("RUNNING", 3), EndCause.TIME_LIMIT, True),
        # preemption with grace time: USR2 first, job still running, PreemptTime set
        (USR2, 0, job("RUNNING", 0, "2026-11-22T07:53:04"), EndCause.PREEMPTED, True),
        # preemption after grace: Slurm already counted the restart
        (TERM, 0, job("COMPLETING", 1, "2026-11-22T07:53:04"), EndCause.PREEMPTED, False),
        # scontrol requeue: Slurm already counted the restart, no preempt time
        (TERM, 0, job("COMPLETING", 1), EndCause.MANUAL_REQUEUE, False),
        (TERM, 2, job("COMPLETING", 3), EndCause.MANUAL_REQUEUE, False),
        # scancel: completing without a new restart -> never requeue
        (TERM, 0, job("COMPLETING", 0), EndCause.CANCELLED, False),
        (TERM, 1, job("CANCELLED", 1), EndCause.CANCELLED, False),
        # SIGTERM sent by hand to a running job: come back
        (TERM, 0, job("RUNNING", 0), EndCause.MANUAL_REQUEUE, True),
    ],
)
def test_classify_stop(
    signum: int, restart_count: int, fields: dict[str, str], cause: EndCause, requeue: bool
) -> None:
    verdict = classify_stop(
        signum, requeue_signum=USR2, restart_count=restart_count, job=standing_of(fields)
    )
    assert (verdict.cause, verdict.request_requeue) == (cause, requeue)
    assert verdict.explanation


def test_without_slurm_the_requeue_signal_asks_to_come_back_and_term_is_a_cancel() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.TIME_LIMIT, True)
    v = classify_stop(TERM, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.CANCELLED, False)
    assert "SIGTERM outside Slurm" in v.explanation


def test_when_slurm_cannot_be_asked_nothing_is_taken_for_a_requeue_under_way() -> None:
    """Inside a Slurm job whose state could not be read: the requeue signal still asks for a
    requeue (Slurm sends it only to a running job); SIGTERM asks for none and is not called a
    requeue by Slurm (it may be one, or a cancel: unknown)."""
    why = "scontrol show job failed (exit 1). Slurm said: Unable to contact slurm controller"
    v = classify_unanswered_stop(USR2, requeue_signum=USR2, error=why)
    assert (v.cause, v.request_requeue, v.slurm_answered) == (EndCause.TIME_LIMIT, True, False)
    assert why in v.explanation
    v = classify_unanswered_stop(TERM, requeue_signum=USR2, error=why)
    assert (v.cause, v.request_requeue, v.slurm_answered) == (EndCause.UNKNOWN, False, False)
    assert v.cause not in (EndCause.MANUAL_REQUEUE, EndCause.PREEMPTED)
    assert "SIGTERM" in v.explanation
    assert why in v.explanation
    # A custom requeue signal is the one that asks.
    v = classify_unanswered_stop(USR2, requeue_signum=int(signal.SIGUSR1), error=why)
    assert (v.cause, v.request_requeue) == (EndCause.UNKNOWN, False)


def test_slurms_answer_counts_as_answered() -> None:
    v = classify_stop(
        USR2, requeue_signum=USR2, restart_count=0, job=standing_of(job("RUNNING", 0))
    )
    assert v.slurm_answered


def test_missing_restarts_field_is_not_mistaken_for_a_requeue() -> None:
    v = classify_stop(
        USR2, requeue_signum=USR2, restart_count=0, job=standing_of({"JobState": "RUNNING"})
    )
    assert v.request_requeue


@pytest.mark.parametrize(("name", "num"), [("USR2", USR2), ("SIGUSR2", USR2), ("term", TERM)])
def test_signal_number(name: str, num: int) -> None:
    assert signal_number(name) == num


def test_a_supervised_survivors_crash_is_a_witness_and_names_only_a_checkpoint_on_disk(
    tmp_path: Path,
) -> None:
    """Under a supervisor, a rank that only lost a peer writes its end as a witness (the
    supervisor's launch_end is the verdict), and a rank that is not the writer names no save
    rank 0 was still writing when it failed (step 40, never written): the newest on disk."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "step-00000020.pt").write_bytes(b"x")
    env = {**TASK, "SLURM_NTASKS": "2", "HPC_DDP_SUPERVISED": "1", "SLURM_PROCID": "1"}
    lost = coordinator(tmp_path, None, env=env)
    lost.crash(step=41, checkpoint="step-00000040.pt",
               error="RuntimeError: gloo: Connection reset by peer")  # fmt: skip
    own = coordinator(tmp_path, None, env={**env, "SLURM_PROCID": "0"})
    own.crash(step=41, checkpoint="step-00000020.pt", error=ValueError("boom"))
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert (first["witness"], first["checkpoint"]) == (True, "step-00000020.pt")
    assert "witness" not in second
    assert second["checkpoint"] == "step-00000020.pt"


def test_a_crashed_rank_of_an_fsdp_run_names_the_committed_shard_set(tmp_path: Path) -> None:
    """An FSDP run's checkpoints are step-N/ directories: a rank that is not the writer names
    the committed set it saved with the others, or the one before a set still in flight."""
    checkpoints = tmp_path / "checkpoints"
    for step in (20, 40):
        (checkpoints / f"step-{step:08d}").mkdir(parents=True)
        (checkpoints / f"step-{step:08d}" / "digests.json").write_text("{}")
    (checkpoints / ".partial-step-00000060").mkdir()
    env = {**TASK, "SLURM_NTASKS": "2", "HPC_DDP_SUPERVISED": "1", "SLURM_PROCID": "1"}
    coordinator(tmp_path, None, env=env).crash(
        step=41, checkpoint="step-00000040", error=ValueError("boom")
    )
    coordinator(tmp_path, None, env=env).crash(
        step=61, checkpoint="step-00000060", error=ValueError("boom")
    )
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["checkpoint"] for line in lines] == ["step-00000040", "step-00000040"]


_OLD_DECISIONS = {
    # cause: (requeued without requeue.on_crash, with it, the start of the reason without it)
    EndCause.FINISHED: (False, False, "finished: nothing left to do"),
    EndCause.TIME_LIMIT: (True, True, "time_limit: requeue 1 of 5"),
    EndCause.PREEMPTED: (True, True, "preempted: requeue 1 of 5"),
    EndCause.MANUAL_REQUEUE: (True, True, "manual_requeue: requeue 1 of 5"),
    EndCause.CRASH: (False, True, "crashed: not requeued"),
    EndCause.BUDGET_EXHAUSTED: (False, False, "requeue budget exhausted: 0 of"),
    EndCause.REQUEUE_FAILED: (False, False, "the requeue request failed: nothing brings"),
    EndCause.CANCELLED: (False, False, "cancelled: a cancelled job is not brought back"),
    EndCause.UNKNOWN: (False, False, "stopped for an unknown reason: not requeued"),
    EndCause.HANG: (False, True, "crashed: not requeued"),
    EndCause.NODE_FAIL: (True, True, "node_fail: requeue 1 of 5"),
    EndCause.NO_PROGRESS: (False, False, "no progress: a crash loop is not requeued"),
}
"""What :func:`decide_requeue` answered for each cause before the end-cause table decided."""


@pytest.mark.parametrize("cause", list(EndCause), ids=[c.value for c in EndCause])
def test_every_cause_is_requeued_as_it_was_before_the_table(cause: EndCause) -> None:
    plain, on_crash, reason = _OLD_DECISIONS[cause]
    decision = decide_requeue(cause, 0, 5, on_crash=False)
    assert decision.requeue is plain
    assert decision.reason.startswith(reason)
    assert decide_requeue(cause, 0, 5, on_crash=True).requeue is on_crash


def test_the_budgets_hint_says_what_a_program_without_a_session_goes_on_from() -> None:
    plain = decide_requeue(EndCause.TIME_LIMIT, 1, 1, False, "RUN", own_snapshots=True)
    assert not plain.requeue
    assert "from its own snapshot if it keeps one" in plain.reason
    assert "resumes from its last checkpoint" not in plain.reason
    session = decide_requeue(EndCause.TIME_LIMIT, 1, 1, False, "RUN")
    assert "the run resumes from its last checkpoint" in session.reason
