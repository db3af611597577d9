"""What ``status`` concludes for runs whose witnesses are unusual: a crash before the attempt's
start (for local runs also read from the tasks' result files), a local run cancelled before any
attempt, a local run whose ranks outlived their controller, and ledger times no clock shows.

Run directories are built by hand; processes are real (``sleep`` stands in for a rank), Slurm
is the shipped :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.local.process import identify_started, mark_cancelled, write_rank_identity
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.state.report import reason_lines, run_status
from hpc_ddp.state.resumable import check_resumable
from hpc_ddp.state.verdict import BackendView, Source, current_attempts, describe_attempt, judge
from tests.ledgers import record_end, record_start

T0 = 1_767_268_800.0  # 2026-01-01T12:00:00Z, the manifests' submit time
DEAD_PID = "4194304"  # the largest pid Linux hands out: never this test's neighbour


def make_run(runs: Path, name: str, *, backend: BackendName = "local", job: str = DEAD_PID) -> Path:
    run_dir = runs / name
    paths = RunPaths(run_dir)
    paths.logs.mkdir(parents=True)
    write_manifest(paths, Manifest(name, backend, job, "2026-01-01T12:00:00+00:00", ["x"],
                                   "job.yaml", str(run_dir)))  # fmt: skip
    return run_dir


def crash_end(run_dir: Path, rank: int, now: float, attempt: int = 0) -> None:
    record_end(RunPaths(run_dir).ledger, attempt=attempt, cause=EndCause.CRASH, steps_done=0,
               checkpoint=None, requeue_requested=False,
               message=f"rank {rank} on n{rank + 1}: AttributeError: no model 'Nope'",
               now=now)  # fmt: skip


def write_result(run_dir: Path, rank: int, result: tuple[str, object]) -> None:
    from submitit.core.utils import JobPaths, cloudpickle_dump

    folder = run_dir / "submitit"
    folder.mkdir(exist_ok=True)
    cloudpickle_dump(result, JobPaths(folder, DEAD_PID, rank).result_pickle)


LOCAL = BackendView({}, accounting={})


# --- the verdict, pure -------------------------------------------------------------------


def attempt(**kw: Any) -> Attempt:
    fields: dict[str, Any] = {"attempt": 0, "started": T0, "ended": None, "cause": None,
                              "steps_done": None, "checkpoint": None, "nodelist": "n1",
                              "job_ref": "7", "resumed_from_step": None}  # fmt: skip
    return Attempt(**{**fields, **kw})


@pytest.mark.parametrize("when", [1e20, -1e20, float("nan"), float("inf")])
def test_a_time_no_clock_can_show_is_a_question_mark(when: float) -> None:
    assert "(started ? on n1) never recorded its end" in describe_attempt(attempt(started=when))
    verdict = judge(None, Source.GONE_NO_ACCOUNTING, [attempt(started=when)], lambda: None)
    assert verdict.state == "GONE?"


NO_START = attempt(started=T0 + 5, ended=T0 + 5, cause=EndCause.CRASH, nodelist="",
                   job_ref=None, message="rank 1 on n2: AttributeError: no model")  # fmt: skip


@pytest.mark.parametrize(
    ("slurm", "source", "state", "note"),
    [
        (None, Source.LOCAL_ENDED, "FAILED", "rank 1 on n2: AttributeError: no model"),
        (None, Source.GONE_NO_ACCOUNTING, "FAILED", "rank 1 on n2: AttributeError"),
        (JobState.COMPLETED, Source.SQUEUE, "FAILED", "rank 1 on n2: AttributeError"),
        (JobState.FAILED, Source.SQUEUE, "FAILED", None),  # the row's note adds the ledger's
        (None, Source.LOCAL_RUNNING, "RUNNING", None),
        (JobState.CANCELLED, Source.LOCAL_ENDED, "CANCELLED", None),
    ],
)
def test_a_crash_recorded_before_its_start_is_a_failure(
    slurm: JobState | None, source: Source, state: str, note: str | None
) -> None:
    verdict = judge(slurm, source, [NO_START], lambda: None)
    assert verdict.state == state
    assert (verdict.note is None) if note is None else (note in (verdict.note or ""))


# --- one status row -------------------------------------------------------------------------


def test_a_local_run_that_crashed_before_its_attempt_names_the_rank_and_error(
    tmp_path: Path,
) -> None:
    run_dir = make_run(tmp_path, "a")
    crash_end(run_dir, 1, T0 + 3)
    crash_end(run_dir, 0, T0 + 3.1)  # the peer's word: the first written is named
    row = run_status(run_dir, LOCAL, Registry())
    assert (row["state"], row["attempts"], row["causes"]) == ("FAILED", 1, "crash")
    assert "the local job's process has exited" in row["note"]
    assert "rank 1 on n2: AttributeError: no model 'Nope'" in row["note"]
    assert "command:" not in row["note"]


def test_a_local_run_with_no_ledger_is_judged_by_its_tasks_result_files(tmp_path: Path) -> None:
    """A task that failed outside the session (a bad entry point, a `command:` that cannot
    start) left no ledger line; submitit's result file still says which rank and why."""
    run_dir = make_run(tmp_path, "a")
    trace = "Traceback (most recent call last):\n  ...\nbuiltins.ValueError: bad entry point\n"
    write_result(run_dir, 0, ("success", 0))
    write_result(run_dir, 1, ("error", trace))
    row = run_status(run_dir, LOCAL, Registry())
    assert row["state"] == "FAILED"
    assert "no attempt started: rank 1 failed: ValueError: bad entry point" in row["note"]
    assert reason_lines(row) == [f"{run_dir}: {row['note']}"]


def test_a_result_file_that_names_code_is_not_run(tmp_path: Path) -> None:
    """A result file is plain values; one that would call something is read as unreadable."""
    run_dir = make_run(tmp_path, "a")
    (run_dir / "submitit").mkdir()
    witness = tmp_path / "ran"
    # Protocol 0 for os.system("touch WITNESS"): what plain pickle.load would run.
    evil = b"cos\nsystem\n(S'touch " + str(witness).encode() + b"'\ntR."
    (run_dir / "submitit" / f"{DEAD_PID}_0_result.pkl").write_bytes(evil)
    row = run_status(run_dir, LOCAL, Registry())
    assert not witness.exists()
    assert row["state"] == "FAILED"
    assert "rank 0 failed: unreadable result" in row["note"]


def test_a_local_run_cancelled_before_any_attempt_is_cancelled(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "a")
    mark_cancelled(run_dir)
    row = run_status(run_dir, LOCAL, Registry())
    assert (row["state"], row["note"]) == ("CANCELLED", None)


def test_a_local_run_is_live_while_any_recorded_rank_runs(
    tmp_path: Path, run_sleeper: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    run_dir = make_run(tmp_path, "a")
    sleeper = run_sleeper(run_dir)  # its command line names a/submitit, as a rank's does
    ident = identify_started(sleeper.pid)
    assert ident is not None
    write_rank_identity(run_dir, 1, ident)
    record_start(RunPaths(run_dir).ledger, attempt=0, job_id=None, job_ref=None, nodelist="",
                 world_size=2, resumed_from_step=None, checkpoint=None, now=T0)  # fmt: skip
    row = run_status(run_dir, LOCAL, Registry())
    assert row["state"] == "RUNNING"
    assert row["note"] == (
        f"the local controller has exited, but rank 1 still run: `hpc-ddp cancel {run_dir}` "
        "stops them"
    )
    refusal = check_resumable(row["state"], str(run_dir), DEAD_PID, force=True).refusal
    assert refusal is not None
    assert "two jobs must never write one run directory" in refusal
    sleeper.kill()
    sleeper.wait()
    assert run_status(run_dir, LOCAL, Registry())["state"] == "GONE?"


def test_a_slurm_run_that_crashed_before_its_start_is_failed_with_the_ranks_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "a", backend="slurm", job="81")
    crash_end(run_dir, 1, T0 + 3)
    slurm = FakeSlurm()
    slurm.add_job("81", state=JobState.FAILED, command=str(run_dir / "job.sbatch"))
    assert main(["status", str(run_dir), "--json"], backends=Registry(slurm.client())) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert (row["state"], row["causes"]) == ("FAILED", ["crash"])
    assert "attempt 0 ended 'crash' at step 0 (rank 1 on n2: AttributeError" in row["note"]


def test_one_ledger_with_times_no_clock_shows_breaks_no_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = make_run(tmp_path, "a-bad", backend="slurm", job="81")
    good = make_run(tmp_path, "b-good", backend="slurm", job="82")
    lines = ['{"event":"attempt_start","attempt":0,"time":1e20}',
             '{"event":"attempt_start","attempt":0,"time":NaN}',
             '{"event":"attempt_end","attempt":0,"time":-1e400,"cause":"crash"}',
             '{"event":"attempt_start","attempt":1e400,"time":5}']  # fmt: skip
    RunPaths(bad).ledger.write_text("\n".join(lines) + "\n")
    record_start(RunPaths(good).ledger, attempt=0, job_id="82", job_ref="82", nodelist="n1",
                 world_size=1, resumed_from_step=None, checkpoint=None, now=T0)  # fmt: skip
    slurm = FakeSlurm(accounting=False)
    slurm.add_job("82", state=JobState.RUNNING, command=str(good / "job.sbatch"))
    assert main(["status", "--runs-dir", str(tmp_path)], backends=Registry(slurm.client())) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    table = [line.split() for line in out.out.splitlines()]
    assert [row[2] for row in table if row[0] in (str(bad), str(good))] == ["GONE?", "RUNNING"]


def test_a_resumed_local_run_that_crashes_before_its_start_is_failed_not_cancelled(
    tmp_path: Path,
) -> None:
    """The resumed job counts its attempts from 0 again; its crash ends came after it was
    submitted (the manifest's time, T0), the old job's cancelled end before."""
    run_dir = make_run(tmp_path, "a")
    ledger = RunPaths(run_dir).ledger
    record_start(ledger, attempt=0, job_id=None, job_ref=None, nodelist="", world_size=2,
                 resumed_from_step=None, checkpoint=None, now=T0 - 100)  # fmt: skip
    record_end(ledger, attempt=0, cause=EndCause.CANCELLED, steps_done=40,
               checkpoint="step-00000040.pt", requeue_requested=False, now=T0 - 90)  # fmt: skip
    crash_end(run_dir, 1, T0 + 3)
    crash_end(run_dir, 0, T0 + 3.2)
    row = run_status(run_dir, LOCAL, Registry())
    assert (row["state"], row["causes"]) == ("FAILED", "cancelled,crash")
    assert "rank 1 on n2: AttributeError" in row["note"]


def test_current_attempts_are_the_current_jobs_by_ref_id_or_time() -> None:
    def entry(started: float, job_id: str | None, job_ref: str | None) -> Attempt:
        return Attempt(0, started, started + 1, EndCause.CRASH, None, None, "", job_ref, None,
                       job_id=job_id)  # fmt: skip

    old, new = entry(1.0, "90", "90"), entry(50.0, "91", "91")
    no_ids_early, no_ids_late = entry(2.0, None, None), entry(60.0, None, None)
    history = [old, no_ids_early, new, no_ids_late]
    assert current_attempts(history, job_id="91", job_ref="91", since=40.0) == [new, no_ids_late]
    assert current_attempts(history, since=40.0) == [new, no_ids_late]  # local: by time alone
    assert current_attempts(history) == history  # nothing to tell them by: all of them
    task_old, task_new = entry(1.0, "5001", "77_3"), entry(9.0, "5002", "80_3")
    assert current_attempts([task_old, task_new], job_ref="80_3") == [task_new]
