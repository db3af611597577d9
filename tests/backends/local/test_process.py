"""Process identities (:mod:`hpc_ddp.backends.local.process`): who the controller and the ranks
are, proven against what they recorded, and the SIGTERM a local cancel sends.

Identities are read from real processes (``sleep``), and signals go to real ones; a record
with a number no process can have is damaged, never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from hpc_ddp.backends.local.process import (
    cancel_local,
    clear_rank_identities,
    controller_cmdline_matches,
    identify,
    identify_started,
    live_ranks,
    local_alive,
    mark_cancelled,
    parse_pid,
    parse_stat,
    read_identity,
    read_rank_identities,
    session_members,
    signal_if_same,
    unmark_cancelled,
    was_cancelled,
    write_identity,
    write_rank_identity,
)
from hpc_ddp.errors import RunDirError, TargetError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from tests import e2e_util as e2e
from tests.backends.local.machine import proc_state
from tests.conftest import REPO


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


# --- pids no process can have (a damaged record is never signalled) ---------------------------

HUGE = "99999999999999999999"


@pytest.mark.parametrize("job_id", [HUGE, str(2**22 + 1), "9" * 400])
def test_parse_pid_refuses_a_pid_above_any_linux_gives(job_id: str) -> None:
    with pytest.raises(TargetError, match=r"is not a process id \(an integer from 2 to 4194304\)"):
        parse_pid(job_id, "RUN")


def test_parse_pid_accepts_the_largest_pid() -> None:
    assert parse_pid(str(2**22), "RUN") == 2**22


@pytest.mark.parametrize(
    "record",
    [{"pid": int(HUGE)}, {"pid": 2**22 + 1}, {"pid": 1}, {"pid": True}, {"pid": 1.5},
     {"pgid": -1}, {"start_ticks": -3}],
)  # fmt: skip
def test_a_local_record_with_an_impossible_number_is_damaged(
    tmp_path: Path, record: dict[str, object]
) -> None:
    ident = identify(os.getpid())
    assert ident is not None
    write_identity(tmp_path, ident)
    data = {**json.loads((tmp_path / "local.json").read_text()), **record}
    (tmp_path / "local.json").write_text(json.dumps(data))
    with pytest.raises(RunDirError, match=r"damaged local process record.*HINT:"):
        read_identity(tmp_path)


def _local_run(runs: Path, job_id: str, pid: int) -> Path:
    run_dir = runs / "d"
    run_dir.mkdir(parents=True)
    write_manifest(RunPaths(run_dir), Manifest("d", "local", job_id, "2026-01-01T00:00:00+00:00",
                                               ["x"], "job.yaml", str(run_dir)))  # fmt: skip
    ident = identify(os.getpid())
    assert ident is not None
    (run_dir / "local.json").write_text(json.dumps({**asdict(ident), "pid": pid}))
    return run_dir


@pytest.mark.parametrize(
    ("job_id", "pid", "code", "says"),
    [(HUGE, int(HUGE), 2, f"local job id '{HUGE}' is not a process id"),
     ("4242", int(HUGE), 1, "damaged local process record (ValueError: pid")],
)  # fmt: skip
def test_cancel_of_a_run_with_a_huge_pid_is_an_error_not_a_traceback(
    tmp_path: Path, job_id: str, pid: int, code: int, says: str
) -> None:
    run_dir = _local_run(tmp_path, job_id, pid)
    hpc = [sys.executable, "-m", "hpc_ddp"]
    done = subprocess.run([*hpc, "cancel", str(run_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, "Traceback" in done.stderr) == (code, False), done.stderr
    assert says in done.stderr
    assert "HINT:" in done.stderr
    # status: one damaged run is a DAMAGED row (exit 1), never the end of the table
    done = subprocess.run([*hpc, "status", str(run_dir), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    [row] = json.loads(done.stdout)["runs"]
    assert (done.returncode, row["state"]) == (1, "DAMAGED")
    assert "damaged local process record" in row["note"]


# --- the ranks' own records --------------------------------------------------------------------


def test_rank_records_find_the_ranks_that_still_run(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    run_sleeper: Callable[[Path], subprocess.Popen[bytes]],
) -> None:
    rank = run_sleeper(tmp_path)
    ident = identify_started(rank.pid)
    me = identify(os.getpid())
    other = identify_started(sleeper.pid)  # runs as recorded, but not this run dir's
    assert ident is not None
    assert me is not None
    assert other is not None
    write_rank_identity(tmp_path, 0, replace(me, start_ticks=me.start_ticks + 1))  # a stranger
    write_rank_identity(tmp_path, 1, ident)
    write_rank_identity(tmp_path, 2, other)
    assert read_rank_identities(tmp_path) == {0: replace(me, start_ticks=me.start_ticks + 1),
                                              1: ident, 2: other}  # fmt: skip
    assert live_ranks(tmp_path) == {1: ident}
    assert local_alive(tmp_path, None)
    rank.kill()
    rank.wait()
    assert live_ranks(tmp_path) == {}
    assert not local_alive(tmp_path, None)
    clear_rank_identities(tmp_path)
    assert read_rank_identities(tmp_path) == {}


def test_cancel_signals_the_ranks_once_the_controller_is_gone(
    tmp_path: Path, run_sleeper: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    run_dir = _local_run(tmp_path, str(2**22), 2**22)  # a controller that cannot exist
    rank = run_sleeper(run_dir)
    ident = identify_started(rank.pid)
    assert ident is not None
    write_rank_identity(run_dir, 3, ident)
    said = cancel_local(run_dir, str(2**22))
    assert said.outcome == "cancelled"
    assert said.message.endswith("signalled the rank process(es) still running: rank 3")
    assert rank.wait(timeout=10) == -15
    assert was_cancelled(run_dir)
    assert cancel_local(run_dir, str(2**22)).message.endswith(
        "already ended; nothing was signalled"
    )


def test_session_members_are_the_leaders_session_started_since_it(tmp_path: Path) -> None:
    """A process that left its parent (reparented: no record names it) is still found through
    the session its controller leads; a process of another session, or a leader recorded
    before controllers led their own session, finds nothing of it."""
    pidfile = tmp_path / "orphan.pid"
    # The leader starts a child that forks an orphan and exits: only the session links them.
    code = (
        "import os, subprocess, sys, time\n"
        "subprocess.run([sys.executable, '-c', 'import os, sys, time\\n"
        'if os.fork() == 0:\\n    open(sys.argv[1], "w").write(str(os.getpid()))\\n'
        "    time.sleep(120)\\nos._exit(0)', sys.argv[1]])\n"
        "time.sleep(120)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", code, str(pidfile)], start_new_session=True)
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        ident = identify_started(leader.pid)
        assert ident is not None
        e2e.wait_for("the orphan", lambda: pidfile.exists() and pidfile.read_text())
        orphan = int(pidfile.read_text())
        e2e.wait_for("its parent gone", lambda: {i.pid for i in session_members(ident)}
                     == {leader.pid, orphan})  # fmt: skip
        assert other.pid not in {i.pid for i in session_members(ident)}
        # A controller that did not lead its session: its session is its caller's, never swept.
        me = identify(os.getpid())
        assert me is not None
        assert session_members(me) == []
        # Its pid held by another process than the one recorded: that session is not the run's.
        assert session_members(replace(ident, start_ticks=ident.start_ticks - 1)) == []
        # The leader dead (a zombie until reaped, then gone), its session lives on in the
        # orphan, which is still found.
        leader.kill()
        e2e.wait_for("a zombie", lambda: proc_state(leader.pid) == "Z")
        assert [i.pid for i in session_members(ident)] == [orphan]
        leader.wait()
        assert [i.pid for i in session_members(ident)] == [orphan]
    finally:
        for proc in (leader, other):
            proc.kill()
            proc.wait()
        if pidfile.exists() and pidfile.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
