"""The local backend's bookkeeping: who the controller is (``localproc``) and how its tasks ended.

Process identities are read from real processes (``sleep``), and signals go to real ones; the
task outcomes are read from result files written with submitit's own pickler, as its task
wrapper writes them. The last test runs a real two-rank local job whose model cannot be
imported and checks that ``submit --wait`` fails and names the rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError, TargetError
from hpc_ddp.local.backend import LocalResult, TaskOutcome, first_failure, task_outcomes
from hpc_ddp.local.process import (
    controller_cmdline_matches,
    identify,
    identify_started,
    mark_cancelled,
    parse_pid,
    parse_stat,
    read_identity,
    signal_if_same,
    unmark_cancelled,
    was_cancelled,
    write_identity,
)
from tests.conftest import REPO


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real, unrelated process: ``sleep 60``, killed at the end if still there."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _stat_line(comm: str, pgrp: int, sid: int, start: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice num_threads itrealvalue starttime vsize ...
    rest = ["S", "1", str(pgrp), str(sid)] + ["0"] * 15 + [str(start), "4096", "0"]
    return f"4242 ({comm}) {' '.join(rest)}\n"


@pytest.mark.parametrize("comm", ["sleep", "a b", "x) (y", "))", "python3 (x) 9 9 9"])
def test_parse_stat_counts_fields_after_the_last_parenthesis(comm: str) -> None:
    assert parse_stat(_stat_line(comm, 77, 88, 123456)) == (77, 88, 123456)


def test_identify_reads_the_started_process_and_none_once_it_is_gone() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ident = identify_started(proc.pid)
        assert ident is not None
        assert ident.cmdline == ("sleep", "60")
        assert ident.pgid == ident.sid == proc.pid  # its own session and group
        assert ident.start_ticks > 0
        assert ident.start_ticks == parse_stat(Path(f"/proc/{proc.pid}/stat").read_text())[2]
        assert identify(proc.pid) == ident  # stable while it lives
    finally:
        proc.kill()
        proc.wait()
    assert identify(proc.pid) is None


@pytest.mark.parametrize("job_id", ["0", "1", "-1", "-42", "abc", "", "12a", " 12", "1.5"])
def test_parse_pid_refuses_what_could_signal_a_group_or_everyone(job_id: str) -> None:
    with pytest.raises(TargetError, match=f"local job id {job_id!r}.*HINT:"):
        parse_pid(job_id, "RUN")


def test_parse_pid_accepts_a_plain_pid() -> None:
    assert parse_pid("4242", "RUN") == 4242


def test_signal_if_same_spares_a_process_that_only_shares_the_pid(
    sleeper: subprocess.Popen[bytes],
) -> None:
    real = identify_started(sleeper.pid)
    assert real is not None
    for other in (
        replace(real, start_ticks=real.start_ticks - 1),
        replace(real, boot_id="another-boot"),
        replace(real, cmdline=("python", "-m", "submitit.local._local")),
        replace(real, pgid=real.pgid + 1),
    ):
        assert signal_if_same(other, 15) is False
    time.sleep(0.2)
    assert sleeper.poll() is None  # still sleeping: nothing reached it
    assert signal_if_same(real, 15) is True
    assert sleeper.wait(timeout=10) == -15
    assert signal_if_same(real, 15) is False  # gone: nothing to signal


def test_identity_round_trips_through_local_json(tmp_path: Path) -> None:
    ident = identify(os.getpid())
    assert ident is not None
    assert read_identity(tmp_path) is None
    write_identity(tmp_path, ident)
    assert read_identity(tmp_path) == ident
    (tmp_path / "local.json").write_text('{"pid": "x"}')
    with pytest.raises(RunDirError, match=r"damaged local process record.*HINT:"):
        read_identity(tmp_path)


def test_controller_cmdline_must_name_this_runs_folder(tmp_path: Path) -> None:
    mine = ("/py", "-m", "submitit.local._local", str(tmp_path / "submitit"))
    assert controller_cmdline_matches(mine, tmp_path)
    assert not controller_cmdline_matches(mine, tmp_path / "other")
    assert not controller_cmdline_matches(("sleep", "60"), tmp_path)


def test_cancel_note_is_taken_back_only_by_whoever_wrote_it(tmp_path: Path) -> None:
    assert not was_cancelled(tmp_path)
    assert mark_cancelled(tmp_path) is True
    assert mark_cancelled(tmp_path) is False  # a second cancel finds it noted
    assert was_cancelled(tmp_path)
    unmark_cancelled(tmp_path)
    assert not was_cancelled(tmp_path)


# --- task outcomes ---------------------------------------------------------------------------

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "x.py", line 1, in <module>\n'
    "hpc_ddp.errors.ConfigError: train.model: cannot import module 'nope'. HINT: install it.\n"
)


def _write_result(folder: Path, job_id: str, rank: int, result: tuple[str, object]) -> None:
    from submitit.core.utils import JobPaths, cloudpickle_dump

    folder.mkdir(parents=True, exist_ok=True)
    cloudpickle_dump(result, JobPaths(folder, job_id, rank).result_pickle)


def test_task_outcomes_read_submitits_result_files(tmp_path: Path) -> None:
    _write_result(tmp_path, "77", 0, ("success", 0))
    _write_result(tmp_path, "77", 1, ("success", 3))
    _write_result(tmp_path, "77", 2, ("error", TRACE))
    got = task_outcomes(tmp_path, "77", 4)
    assert [(o.rank, o.ok) for o in got] == [(0, True), (1, False), (2, False), (3, False)]
    assert got[1].detail == "exit code 3"
    assert got[2].detail.startswith("ConfigError: train.model: cannot import module 'nope'.")
    assert got[3].detail.startswith("ended without a result")
    assert got[3].reported_at is None


def test_the_rank_killed_outright_is_blamed_before_its_complaining_peers() -> None:
    peer = TaskOutcome(0, False, "RuntimeError: Connection reset by peer", 10.0)
    killed = TaskOutcome(1, False, "ended without a result", None)
    assert first_failure([peer, killed]) == killed
    early = TaskOutcome(2, False, "ValueError: bad", 5.0)
    assert first_failure([peer, early]) == early
    assert first_failure([TaskOutcome(0, True, "exit code 0", 1.0)]) is None


def test_local_result_reads_like_slurms_verdict() -> None:
    ok = [TaskOutcome(0, True, "exit code 0", 1.0), TaskOutcome(1, True, "exit code 0", 1.0)]
    assert LocalResult("9", "FINISHED", ok).describe() == "local job 9: COMPLETED"
    assert LocalResult("9", "FINISHED", ok).describe(cancelled=True) == "local job 9: CANCELLED"
    bad = [TaskOutcome(0, False, "ConfigError: x", 2.0), TaskOutcome(1, False, "E: y", 3.0)]
    result = LocalResult("9", "FINISHED", bad)
    assert result.state(False) == "FAILED"
    assert result.describe() == "local job 9: FAILED: rank 0 failed (then rank 1): ConfigError: x"
    assert LocalResult("9", "INTERRUPTED", []).describe() == (
        "local job 9: FAILED: the controller ended INTERRUPTED"
    )


def model_broken_on_rank_1(cfg: object) -> object:
    """``train.model`` for the test below: rank 1 fails at once, rank 0 a moment later."""
    del cfg
    if os.environ["RANK"] == "1":
        raise ValueError("model broken on rank 1")
    time.sleep(2.0)
    raise ValueError("rank 0 gave up too")


@pytest.mark.torch
def test_local_wait_fails_and_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    """The model imports (so the submit-time checks pass) but breaks on the ranks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path),
         "train.model=tests.local.test_backend:model_broken_on_rank_1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    last = [ln for ln in done.stderr.splitlines() if ln.startswith("local job ")][-1]
    assert last.endswith(
        ": FAILED: rank 1 failed (then rank 0): ValueError: model broken on rank 1"
    )
    [run_dir] = tmp_path.iterdir()
    assert read_identity(run_dir) is not None  # the controller was recorded at submit time
