"""The attempt ledger: writing, folding, torn lines, and the requeue decisions."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.fault.requeue import RequeueDecision, decide_requeue
from hpc_ddp.rundir.attempt import Attempt, Blame
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import Checkpoint, checkpoint_name
from hpc_ddp.rundir.ledger import attempt_number, read_ledger
from hpc_ddp.rundir.ledger_events import (
    LaunchId,
    checkpoint_event,
    command_start_event,
    end_event,
    launch_end_event,
    launch_event,
    node_fail_event,
    start_event,
)
from tests.ledgers import record_end, record_start

JOB_42 = LaunchId("42", "42", 0)


def start(path: Path, attempt: int, now: float, **kw: object) -> None:
    args: dict[str, object] = dict(
        attempt=attempt,
        job_id="4242",
        job_ref="4242",
        nodelist="n[1-2]",
        world_size=4,
        resumed_from_step=None,
        checkpoint=None,
        now=now,
    )
    args.update(kw)
    record_start(path, **args)


def finish(path: Path, attempt: int, now: float, cause: EndCause, **kw: object) -> None:
    """The ``attempt_end`` of ``attempt`` by its number, with no step, no checkpoint and no
    requeue unless ``kw`` says."""
    args: dict[str, object] = dict(
        attempt=attempt,
        cause=cause,
        steps_done=None,
        checkpoint=None,
        requeue_requested=False,
        now=now,
    )
    args.update(kw)
    record_end(path, **args)


def test_a_requeued_run_folds_into_attempts(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 100.0)
    finish(
        path,
        0,
        160.0,
        EndCause.TIME_LIMIT,
        steps_done=120,
        checkpoint="checkpoints/step-00000120.pt",
        requeue_requested=True,
        message="time-limit warning signal",
    )
    start(path, 1, 300.0, resumed_from_step=120, checkpoint="checkpoints/step-00000120.pt")
    finish(
        path, 1, 400.0, EndCause.FINISHED, steps_done=300, checkpoint="checkpoints/step-00000300.pt"
    )
    first, second = read_ledger(path)
    assert first == Attempt(
        attempt=0,
        started=100.0,
        ended=160.0,
        cause=EndCause.TIME_LIMIT,
        steps_done=120,
        checkpoint="checkpoints/step-00000120.pt",
        nodelist="n[1-2]",
        job_ref="4242",
        resumed_from_step=None,
        job_id="4242",
        world_size=4,
        resumed_from=None,
        requeue_requested=True,
        message="time-limit warning signal",
        restart=0,
    )
    assert first.duration_s == 60.0
    assert (second.attempt, second.resumed_from_step, second.resumed_from) == (
        1,
        120,
        "checkpoints/step-00000120.pt",
    )
    assert (second.cause, second.steps_done, second.checkpoint) == (
        EndCause.FINISHED,
        300,
        "checkpoints/step-00000300.pt",
    )


def test_events_are_one_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    finish(path, 0, 2.0, EndCause.CRASH, message="boom")
    lines = path.read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["attempt_start", "attempt_end"]
    assert json.loads(lines[1])["cause"] == "crash"


def test_an_attempt_without_an_end_is_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0, checkpoint="checkpoints/step-00000010.pt", resumed_from_step=10)
    (only,) = read_ledger(path)
    assert only.is_open
    assert (only.ended, only.cause, only.steps_done, only.duration_s) == (None, None, None, None)
    assert only.checkpoint == "checkpoints/step-00000010.pt"


def test_no_ledger_is_no_attempts(tmp_path: Path) -> None:
    assert read_ledger(tmp_path / "missing.jsonl") == []


def test_a_directory_in_place_of_the_ledger_is_a_run_dir_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.mkdir()
    with pytest.raises(RunDirError, match=r"ledger\.jsonl: unreadable ledger .*HINT:"):
        read_ledger(path)


def _read_as_nobody(path: Path) -> str:
    """What ``read_ledger(path)`` raises, read by a forked child whose effective user is
    ``nobody`` (when this process is root, which reads any file)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so the interpreter under /root need not be reachable
        os.close(reader)
        said = "no error"
        try:
            if os.geteuid() == 0:
                os.seteuid(NOBODY)
            read_ledger(path)
        except RunDirError as exc:
            said = str(exc)
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(writer, said.encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    return said


NOBODY = 65534


def test_an_unreadable_ledger_is_a_run_dir_error(tmp_path: Path) -> None:
    """Read by a process that the file's mode really shuts out (as root, in CI, a child whose
    effective user is ``nobody``)."""
    tmp_path.chmod(0o755)
    for parent in tmp_path.parents:  # pytest's base temp dir is root's alone (0700)
        if parent.owner() == "root" and str(parent).startswith(tempfile.gettempdir() + "/"):
            parent.chmod(parent.stat().st_mode | 0o011)
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    path.chmod(0)
    said = _read_as_nobody(path)
    assert re.search(r"unreadable ledger .*HINT:", said), said


def test_a_torn_last_line_is_skipped_and_the_next_event_survives(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    with path.open("a") as f:
        f.write('{"event": "attempt_end", "attempt": 0, "ti')  # killed mid-write
    attempts = read_ledger(path)
    assert len(attempts) == 1
    assert attempts[0].is_open
    # The next writer starts on a fresh line, so its event is not glued to the torn one.
    start(path, 1, 5.0)
    attempts = read_ledger(path)
    assert [a.attempt for a in attempts] == [0, 1]
    assert path.read_text().count("\n") == 3


def test_garbage_and_unknown_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    with path.open("a") as f:
        f.write("\n")
        f.write("not json\n")
        f.write('{"event": "something_new", "attempt": 0}\n')
        f.write('{"event": "attempt_start"}\n')  # missing fields
        f.write("[1, 2]\n")
        f.write("\xff\xfe\n")
        f.write('{"event": "attempt_end", "attempt": 7, "time": 3.0, "cause": "finished"}\n')
        f.write('{"event": "attempt_end", "attempt": 0, "time": 4.0, "cause": "from_the_future"}\n')
    only, no_start = read_ledger(path)
    assert (only.attempt, only.ended, only.cause) == (0, 4.0, EndCause.UNKNOWN)
    # An end without its start is an attempt that failed before rank 0 recorded the start; it
    # is numbered by its place in the run, and the number it was written with is its restart.
    assert (no_start.attempt, no_start.started, no_start.cause) == (1, 3.0, EndCause.FINISHED)
    assert no_start.restart == 7


def test_a_relaunched_attempt_gets_its_own_entry(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)  # died without a word
    start(path, 0, 10.0)
    finish(path, 0, 20.0, EndCause.FINISHED, steps_done=5)
    died, relaunched = read_ledger(path)
    assert died.is_open
    assert (relaunched.started, relaunched.ended) == (10.0, 20.0)


def test_causes_round_trip_as_strings(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    for n, cause in enumerate(EndCause):
        start(path, n, float(n))
        finish(path, n, n + 0.5, cause, steps_done=n)
    assert [a.cause for a in read_ledger(path)] == list(EndCause)
    assert json.dumps({"c": EndCause.PREEMPTED}) == '{"c": "preempted"}'  # a str Enum


@pytest.mark.parametrize(
    ("cause", "so_far", "max_requeues", "on_crash", "requeue"),
    [
        (EndCause.FINISHED, 0, 5, True, False),
        (EndCause.TIME_LIMIT, 0, 5, False, True),
        (EndCause.TIME_LIMIT, 4, 5, False, True),
        (EndCause.TIME_LIMIT, 5, 5, False, False),
        (EndCause.PREEMPTED, 2, 5, False, True),
        (EndCause.MANUAL_REQUEUE, 0, 1, False, True),
        (EndCause.MANUAL_REQUEUE, 1, 1, False, False),
        (EndCause.TIME_LIMIT, 0, 0, False, False),
        (EndCause.CRASH, 0, 5, False, False),
        (EndCause.CRASH, 0, 5, True, True),
        (EndCause.CRASH, 5, 5, True, False),
        (EndCause.CANCELLED, 0, 5, True, False),
        (EndCause.UNKNOWN, 0, 5, True, False),
        (EndCause.BUDGET_EXHAUSTED, 0, 5, True, False),
        (EndCause.REQUEUE_FAILED, 0, 5, True, False),
    ],
)
def test_decide_requeue(
    cause: EndCause, so_far: int, max_requeues: int, on_crash: bool, requeue: bool
) -> None:
    decision = decide_requeue(cause, so_far, max_requeues, on_crash)
    assert isinstance(decision, RequeueDecision)
    assert decision.requeue is requeue
    assert decision.reason


def test_an_exhausted_budget_says_which_setting_to_raise() -> None:
    decision = decide_requeue(EndCause.PREEMPTED, 5, 5, on_crash=False)
    assert not decision.requeue
    assert "5 of requeue.max_requeues=5" in decision.reason
    assert "`hpc-ddp resume RUN_DIR requeue.max_requeues=10`" in decision.reason


def test_a_failed_requeue_is_recorded_as_such_not_as_a_request(tmp_path: Path) -> None:
    """What ``hpc-ddp status`` reads to tell an unfinished run from a finished one."""
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    finish(
        path,
        0,
        2.0,
        EndCause.REQUEUE_FAILED,
        steps_done=12,
        checkpoint="step-00000012.pt",
        message="could not requeue job 4242: ... HINT: ...",
    )
    line = json.loads(path.read_text().splitlines()[-1])
    assert (line["cause"], line["requeue_requested"]) == ("requeue_failed", False)
    [attempt] = read_ledger(path)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.REQUEUE_FAILED, False)
    assert (attempt.steps_done, attempt.checkpoint) == (12, "step-00000012.pt")


def test_a_crash_without_on_crash_points_at_the_setting() -> None:
    assert "requeue.on_crash=true" in decide_requeue(EndCause.CRASH, 0, 5, False).reason


# --- ends without a start, and numbers no clock or counter can hold ------------------------


def crash(path: Path, attempt: int, now: float, rank: int) -> None:
    record_end(path, attempt=attempt, cause=EndCause.CRASH, steps_done=0, checkpoint=None,
               requeue_requested=False, message=f"rank {rank} on n1: ValueError: no model",
               now=now)  # fmt: skip


def test_a_crash_before_the_start_is_an_attempt_and_the_first_rank_to_write_it_is_named(
    tmp_path: Path,
) -> None:
    """Every rank records its crash; the model failed to build before rank 0 wrote a start."""
    path = tmp_path / "ledger.jsonl"
    crash(path, 0, 10.0, rank=1)
    crash(path, 0, 10.5, rank=0)
    (failed,) = read_ledger(path)
    assert (failed.attempt, failed.cause, failed.started, failed.ended) == (
        0, EndCause.CRASH, 10.0, 10.0,
    )  # fmt: skip
    assert failed.message is not None
    assert failed.message.startswith("rank 1 on n1")
    assert not failed.is_open


def test_peers_repeating_a_recorded_crash_add_no_attempt(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    crash(path, 0, 5.0, rank=1)
    crash(path, 0, 6.0, rank=0)  # the peer that lost its connection
    (attempt,) = read_ledger(path)
    assert attempt.started == 1.0
    assert attempt.message is not None
    assert attempt.message.startswith("rank 1")


def test_a_resumed_jobs_crash_before_its_start_is_told_apart_by_the_submit_time(
    tmp_path: Path,
) -> None:
    """A resumed run's new job counts its attempts from 0 again: without the job's submit
    time its early crash would read as a peer's repeat of the old job's end."""
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    record_end(path, attempt=0, cause=EndCause.CANCELLED, steps_done=10, checkpoint=None,
               requeue_requested=False, now=5.0)  # fmt: skip
    crash(path, 0, 50.0, rank=1)  # the new job, submitted at 40
    crash(path, 0, 50.2, rank=0)
    assert [a.cause for a in read_ledger(path)] == [EndCause.CANCELLED]
    old, new = read_ledger(path, since=40.0)
    assert (old.cause, new.cause, new.started) == (EndCause.CANCELLED, EndCause.CRASH, 50.0)
    assert new.message is not None
    assert new.message.startswith("rank 1")


BAD_NUMBERS = [
    # (field, value as JSON): the event is skipped, with a warning
    ("time", "1e20"), ("time", "1e400"), ("time", "-1e400"), ("time", "NaN"),
    ("time", "Infinity"), ("time", "-5"), ("time", '"soon"'), ("time", "true"),
    ("attempt", "-1"), ("attempt", "1e400"), ("attempt", "NaN"), ("attempt", "1.5"),
    ("attempt", "99999999999999999999999"), ("attempt", "null"), ("attempt", "[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), BAD_NUMBERS)
def test_an_event_whose_time_or_attempt_is_no_sane_number_is_skipped(
    tmp_path: Path, field: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    good_end = {"event": "attempt_end", "attempt": 0, "time": 9.0, "cause": "finished"}
    bad_start = {"event": "attempt_start", "attempt": 1, "time": 10.0}
    bad_end = {"event": "attempt_end", "attempt": 1, "time": 11.0, "cause": "crash"}
    with path.open("a") as f:
        f.write(json.dumps(good_end) + "\n")
        for event in (bad_start, bad_end):
            text = json.dumps({k: v for k, v in event.items() if k != field})
            f.write(f'{text[:-1]}, "{field}": {value}}}\n')
    (attempt,) = read_ledger(path)
    assert (attempt.attempt, attempt.cause) == (0, EndCause.FINISHED)
    assert sum("skipping an unreadable ledger line" in r.message for r in caplog.records) == 2


OPTIONAL_BAD = [
    ("steps_done", "-3"), ("steps_done", "1e400"), ("steps_done", "NaN"), ("steps_done", '"x"'),
    ("steps_done", "2.5"), ("steps_done", "99999999999999999999999"), ("world_size", "0"),
    ("resumed_from_step", "-1"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), OPTIONAL_BAD)
def test_an_optional_number_that_is_no_sane_number_is_unknown(
    tmp_path: Path, field: str, value: str
) -> None:
    path = tmp_path / "ledger.jsonl"
    begin = {"event": "attempt_start", "attempt": 0, "time": 1.0, "world_size": 2}
    end = {"event": "attempt_end", "attempt": 0, "time": 2.0, "cause": "cancelled"}
    with path.open("a") as f:
        for event in (begin, end):
            text = json.dumps({k: v for k, v in event.items() if k != field})
            extra = f', "{field}": {value}' if (field == "steps_done") == (event is end) else ""
            f.write(f"{text[:-1]}{extra}}}\n")
    (attempt,) = read_ledger(path)
    assert getattr(attempt, field) is None
    assert (attempt.started, attempt.cause) == (1.0, EndCause.CANCELLED)  # the rest still counts


def test_huge_but_whole_numbers_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0)
    record_end(path, attempt=0, cause=EndCause.FINISHED, steps_done=2**40, checkpoint=None,
               requeue_requested=False, now=4102444800.0)  # 2100-01-01  # fmt: skip
    (attempt,) = read_ledger(path)
    assert (attempt.steps_done, attempt.ended) == (2**40, 4102444800.0)


# --- attempts numbered across the run ------------------------------------------------------


def test_a_ledger_from_before_run_wide_numbers_reads_numbered_across_the_run(
    tmp_path: Path,
) -> None:
    """Old ledgers numbered each job's attempts from 0 (the SLURM_RESTART_COUNT): read back,
    every attempt has its place in the run, and the old number is its restart."""
    path = tmp_path / "ledger.jsonl"
    for job, restart, t in (("41", 0, 1.0), ("41", 1, 3.0), ("42", 0, 10.0)):
        with path.open("a") as f:  # exactly what the old writer wrote: no "restart" field
            f.write(json.dumps({"event": "attempt_start", "attempt": restart, "time": t,
                                "job_id": job, "job_ref": job, "nodelist": "n1",
                                "world_size": 2, "resumed_from_step": None,
                                "checkpoint": None}) + "\n")  # fmt: skip
            f.write(json.dumps({"event": "attempt_end", "attempt": restart, "time": t + 1,
                                "cause": "time_limit", "steps_done": 5, "checkpoint": None,
                                "requeue_requested": True, "message": ""}) + "\n")  # fmt: skip
    attempts = read_ledger(path)
    assert [(a.attempt, a.restart, a.job_id) for a in attempts] == [
        (0, 0, "41"), (1, 1, "41"), (2, 0, "42"),
    ]  # fmt: skip
    assert all(not a.is_open for a in attempts)


def test_attempt_number_finds_the_entry_of_its_job_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 1.0, restart=0, job_id="41")
    start(path, 1, 5.0, restart=1, job_id="41")
    start(path, 2, 50.0, restart=0, job_id="42")
    attempts = read_ledger(path)
    assert attempt_number(attempts, job_id="41", restart=1) == 1
    assert attempt_number(attempts, job_id="42", restart=0) == 2
    assert attempt_number(attempts, job_id="42", restart=1) == 3  # not written yet: the next
    # A run without job ids (local): only an entry started since this process began is its.
    local = tmp_path / "local.jsonl"
    start(local, 0, 1.0, job_id=None, restart=0)
    assert attempt_number(read_ledger(local), job_id=None, restart=0, since=0.5) == 0
    assert attempt_number(read_ledger(local), job_id=None, restart=0, since=40.0) == 1


# --- launches (the supervisor's events) ------------------------------------------------------


def _events(path: Path, *lines: str) -> list[Attempt]:
    with path.open("a") as f:
        f.write("".join(lines))
    return read_ledger(path)


def test_a_launch_end_replaces_a_survivors_crash_with_the_supervisors_blame(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    attempts = _events(
        path,
        launch_event(launch_id=JOB_42, nodes="n1,n2,n3", alloc_nodes=3, excluded=[],
                     world_size=2, from_step=None, now=1.0),
        start_event(attempt=0, launch_id=JOB_42, nodelist="n1,n2", world_size=2,
                    resumed_from_step=None, checkpoint=None, now=3.0),
        end_event(attempt=0, launch_id=JOB_42, cause=EndCause.CRASH, steps_done=21, checkpoint=None,
                  requeue_requested=False, message="rank 0 on n1: Connection reset by peer",
                  now=5.0),
        launch_end_event(attempt=0, launch_id=JOB_42, launched_at=1.0,
                         cause=EndCause.CRASH,
                         blame=Blame((1,), ("n2",), "Killed", False, 4.9, 4.5),
                         steps_reached=21, checkpoint=Checkpoint(20, "step-00000020.pt"),
                         next_step="restart", message="crash: rank 1 on n2: Killed", now=6.0),
    )  # fmt: skip
    [a] = attempts
    assert (a.cause, a.message, a.next, a.launched_at, a.alloc_nodes) == (
        EndCause.CRASH, "crash: rank 1 on n2: Killed", "restart", 1.0, 3,
    )  # fmt: skip
    assert a.blame is not None
    assert a.blame.describe() == "rank 1 on n2: Killed"
    assert (a.started, a.ended, a.checkpoint_step, a.launch_ended) == (3.0, 5.0, 20, 6.0)


def test_a_launch_end_names_a_shard_set_by_its_directory(tmp_path: Path) -> None:
    """An FSDP run's checkpoint is the directory step-N/, and the launch_end line (and the
    attempt read back from it) says so; a file checkpoint keeps its step-N.pt."""

    def end(name: str) -> str:
        return launch_end_event(attempt=0, launch_id=JOB_42,
                                launched_at=1.0, cause=EndCause.CRASH, blame=None,
                                steps_reached=21, checkpoint=Checkpoint(20, name),
                                next_step="restart", now=6.0)  # fmt: skip

    assert json.loads(end("step-00000020"))["checkpoint"] == "step-00000020"
    assert json.loads(end("step-00000020.pt"))["checkpoint"] == "step-00000020.pt"
    [a] = _events(tmp_path / "ledger.jsonl", *_launch_0(verdict=end("step-00000020")))
    assert (a.checkpoint, a.checkpoint_step) == ("step-00000020", 20)


def test_a_launch_whose_ranks_wrote_nothing_becomes_an_attempt_and_late_words_refine_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.jsonl"
    attempts = _events(
        path,
        *_launch_0(),
        checkpoint_event(launch_id=JOB_42, step=10, stall_s=0.25, now=2.5),
        launch_end_event(attempt=0, launch_id=JOB_42, launched_at=1.0,
                         cause=EndCause.HANG, blame=Blame((1,), ("n2",), "heartbeat stopped"),
                         steps_reached=12, checkpoint=Checkpoint(10, "step-00000010.pt"),
                         next_step="restart", now=9.0),
        node_fail_event(launch_id=JOB_42, node="n2", evidence="srun: Node failure",
                        now=12.0),
        launch_event(launch_id=LaunchId("42", "42", 0, 1), nodes="n1,n3", alloc_nodes=3,
                     excluded=["n2"], world_size=2, from_step=10, now=9.5),
        launch_end_event(attempt=1, launch_id=LaunchId("42", "42", 0, 1), launched_at=9.5,
                         cause=EndCause.CRASH, blame=Blame((0,), ("n1",), "ImportError"),
                         steps_reached=None, checkpoint=Checkpoint(10, "step-00000010.pt"),
                         next_step="stop", now=11.0),
    )  # fmt: skip
    first, second = attempts
    # The open attempt is closed by the supervisor; srun's late word makes it a node failure.
    assert (first.cause, first.ended, first.steps_done, first.stall_s) == (
        EndCause.NODE_FAIL, 9.0, 12, 0.25,
    )  # fmt: skip
    assert first.blame is not None
    assert first.blame.node_level
    assert first.blame.evidence == "srun: Node failure"
    # A launch that died before rank 0 wrote a start is an attempt of its own, never trained.
    assert (second.launch, second.trained, second.started, second.cause, second.from_step) == (
        1, False, 9.5, EndCause.CRASH, 10,
    )  # fmt: skip
    assert second.nodelist == "n1,n3"


def _launch_0(*ends: str, verdict: str | None = None) -> list[str]:
    return [
        launch_event(launch_id=JOB_42, nodes="n1,n2", alloc_nodes=2, excluded=[],
                     world_size=2, from_step=None, now=1.0),
        start_event(attempt=0, launch_id=JOB_42, nodelist="n1,n2", world_size=2,
                    resumed_from_step=None, checkpoint=None, now=2.0),
        *ends,
        *([verdict] if verdict else []),
    ]  # fmt: skip


def _end(cause: EndCause, message: str, *, witness: bool = False, now: float = 5.0,
         checkpoint: str | None = None, steps: int = 30) -> str:  # fmt: skip
    return end_event(attempt=0, launch_id=JOB_42, cause=cause, steps_done=steps,
                     checkpoint=checkpoint, requeue_requested=False, message=message, now=now,
                     witness=witness)  # fmt: skip


def _verdict(cause: EndCause, ranks: tuple[int, ...], evidence: str, *, ckpt: int = 20) -> str:
    return launch_end_event(attempt=0, launch_id=JOB_42,
                            launched_at=1.0, cause=cause, blame=Blame(ranks, ("n2",), evidence),
                            steps_reached=30, checkpoint=Checkpoint(ckpt, checkpoint_name(ckpt)),
                            next_step="restart",
                            message=f"{cause.value}: {evidence}", now=9.0)  # fmt: skip


def test_a_survivors_end_is_a_witness_never_the_verdict(tmp_path: Path) -> None:
    """Rank 0's "connection reset" (a witness) is written before the killed rank's launch_end:
    the attempt's one verdict is the supervisor's; the survivor's word is kept as a witness."""
    reset = "rank 0 on n1: RuntimeError: Connection reset by peer"
    [a] = _events(
        tmp_path / "ledger.jsonl",
        *_launch_0(_end(EndCause.CRASH, reset, witness=True),
                   verdict=_verdict(EndCause.CRASH, (1,), "Killed")),
    )  # fmt: skip
    assert (a.cause, a.message, a.witnesses) == (EndCause.CRASH, "crash: Killed", (reset,))
    assert a.blame is not None
    assert a.blame.ranks == (1,)


def test_a_witness_written_first_yields_to_the_failing_ranks_own_end(tmp_path: Path) -> None:
    """Without a supervisor's word yet, the failing rank's own end (written a moment after its
    peer's complaint) is the verdict, not the first end in the file."""
    reset = "rank 0 on n1: RuntimeError: Connection reset by peer"
    boom = "rank 1 on n2: ValueError: boom"
    [a] = _events(
        tmp_path / "ledger.jsonl",
        *_launch_0(_end(EndCause.CRASH, reset, witness=True), _end(EndCause.CRASH, boom, now=6)),
    )  # fmt: skip
    assert (a.message, a.ended, a.witnesses) == (boom, 5.0, (reset,))
    # A witness after the verdict changes nothing but the witnesses.
    [b] = _events(
        tmp_path / "other.jsonl",
        *_launch_0(_end(EndCause.CRASH, boom), _end(EndCause.CRASH, reset, witness=True, now=6)),
    )  # fmt: skip
    assert (b.message, b.witnesses) == (boom, (reset,))


def test_the_supervisors_fault_verdict_overrules_a_finished_from_a_rank_that_left_early(
    tmp_path: Path,
) -> None:
    """Rank 0 left its loop at step 30 of 100 and wrote `finished`; the supervisor found that
    rank 1 trained on without it: the launch is a crash, and its checkpoint is the one on
    disk, not a save the rank named while it was in flight."""
    left = "left the training loop at step 30 of 100"
    [a] = _events(
        tmp_path / "ledger.jsonl",
        *_launch_0(
            _end(EndCause.FINISHED, left, checkpoint="step-00000030.pt"),
            verdict=_verdict(EndCause.CRASH, (0,), "left its training loop at step 30 of 100"),
        ),
    )  # fmt: skip
    assert (a.cause, a.next, a.checkpoint) == (EndCause.CRASH, "restart", "step-00000020.pt")
    assert a.blame is not None
    assert a.blame.ranks == (0,)


# --- a command's program that opened no session (issue 39, Low) ----------------------------


def _command_start(path: Path, now: float, job: str | None = "4242", **kw: Any) -> None:
    from hpc_ddp.durable import append_line

    fields: dict[str, Any] = {"restart": 0, "launch": 0, "nodelist": "n[1-2]", "world_size": 8}
    fields.update(kw)
    key = LaunchId(job, job, fields.pop("restart"), fields.pop("launch"))
    append_line(path, command_start_event(launch_id=key, now=now, **fields))


def test_a_running_program_without_a_session_is_an_open_attempt_for_status_only(
    tmp_path: Path,
) -> None:
    """Rank 0's `command_start` is the attempt while nothing else says so: `status` shows it
    running (`provisional`), and the node side, which numbers attempts, never sees it."""
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 100.0)
    record_end(path, attempt=0, restart=0, job_id="4242", job_ref="4242", cause=EndCause.TIME_LIMIT,
               steps_done=None, checkpoint=None, requeue_requested=True, now=150.0)  # fmt: skip
    _command_start(path, 200.0, restart=1)
    assert [a.cause for a in read_ledger(path)] == [EndCause.TIME_LIMIT]
    _, running = read_ledger(path, provisional=True)
    assert (running.attempt, running.started, running.is_open) == (1, 200.0, True)
    assert (running.restart, running.world_size, running.nodelist) == (1, 8, "n[1-2]")
    assert attempt_number(read_ledger(path), job_id="4242", restart=1) == 1
    # Its end, written with the start of its own (as `hpc-ddp run` does), supersedes it.
    start(path, 1, 200.0, restart=1, world_size=8)
    record_end(path, attempt=1, restart=1, job_id="4242", job_ref="4242",
               cause=EndCause.FINISHED, steps_done=None, checkpoint=None,
               requeue_requested=False, now=260.0)  # fmt: skip
    assert read_ledger(path, provisional=True) == read_ledger(path)
    assert [a.cause for a in read_ledger(path)] == [EndCause.TIME_LIMIT, EndCause.FINISHED]


def test_a_sessions_own_start_supersedes_the_command_start(tmp_path: Path) -> None:
    """A session in the program writes its start as ever, later: its attempt is the one shown,
    with the session's own fields (its world size under torchrun, where it resumed)."""
    path = tmp_path / "ledger.jsonl"
    _command_start(path, 100.0, world_size=2)
    start(path, 0, 104.0, world_size=4, resumed_from_step=7)
    [a] = read_ledger(path, provisional=True)
    assert (a.started, a.world_size, a.resumed_from_step, a.is_open) == (104.0, 4, 7, True)
    assert read_ledger(path, provisional=True) == read_ledger(path)


def test_a_local_command_start_is_superseded_only_by_its_own_jobs_attempt(tmp_path: Path) -> None:
    """Without job ids (the local backend), an earlier job's attempt of the same restart and
    launch, ended before the program started, is not this program's."""
    path = tmp_path / "ledger.jsonl"
    start(path, 0, 100.0, job_id=None, job_ref=None)
    record_end(path, attempt=0, cause=EndCause.CRASH, steps_done=None, checkpoint=None,
               requeue_requested=False, now=110.0)  # fmt: skip
    _command_start(path, 300.0, job=None)
    old, running = read_ledger(path, provisional=True)
    assert (old.cause, running.started, running.is_open) == (EndCause.CRASH, 300.0, True)
    start(path, 1, 300.0, job_id=None, job_ref=None, restart=0)
    assert len(read_ledger(path, provisional=True)) == 2


def test_a_requeued_attempt_says_requeue_where_the_supervisor_saw_a_clean_stop(
    tmp_path: Path,
) -> None:
    """Its ranks stopped and asked for the requeue (or Slurm requeued the job itself), so the
    launch ended cleanly and the supervisor wrote `stop`: the attempt's `next` is `requeue`.
    A finished or cancelled attempt's `stop` stays."""
    from hpc_ddp.durable import append_line

    def clean_end(restart: int, cause: EndCause, now: float) -> None:
        append_line(path, launch_end_event(
            attempt=restart, launch_id=LaunchId("4242", "4242", restart),
            launched_at=now - 10, cause=cause, blame=None, steps_reached=None,
            checkpoint=None, next_step="stop", now=now,
        ))  # fmt: skip

    path = tmp_path / "ledger.jsonl"
    for restart, (cause, asked) in enumerate([(EndCause.TIME_LIMIT, True),
                                               (EndCause.PREEMPTED, False),
                                               (EndCause.CANCELLED, False)]):  # fmt: skip
        now = 100.0 * (restart + 1)
        start(path, restart, now, restart=restart)
        record_end(path, attempt=restart, restart=restart, job_id="4242", job_ref="4242",
                   cause=cause, steps_done=None, checkpoint=None, requeue_requested=asked,
                   now=now + 5)  # fmt: skip
        clean_end(restart, cause, now + 6)
    # The preemption's requeue was Slurm's own: the next restart of the job says so.
    assert [a.next for a in read_ledger(path)] == ["requeue", "requeue", "stop"]
