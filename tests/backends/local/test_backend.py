"""The local backend's bookkeeping: who the controller is (``localproc``) and how its tasks ended.

Process identities are read from real processes (``sleep``), and signals go to real ones; the
task outcomes are read from result files written with submitit's own pickler, as its task
wrapper writes them. The last test runs a real two-rank local job whose model cannot be
imported and checks that ``submit --wait`` fails and names the rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import pytest

from hpc_ddp.backends.local.backend import (
    ForcedStop,
    LocalResult,
    TaskOutcome,
    check_local_size,
    first_failure,
    force_stop,
    task_outcomes,
)
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
from hpc_ddp.cli.main import main
from hpc_ddp.errors import ConfigError, RunDirError, TargetError
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import Checkpoint, RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.manifest import Manifest, read_manifest, write_manifest
from tests import e2e_util as e2e
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


def test_local_result_says_the_verdict_status_gives_and_whom_to_blame() -> None:
    """The state is status's verdict (one verdict: never "the controller ended INTERRUPTED"
    beside a status that says CANCELLED); the result files only name the rank to blame."""
    ok = [TaskOutcome(0, True, "exit code 0", 1.0), TaskOutcome(1, True, "exit code 0", 1.0)]
    assert LocalResult("9", "FINISHED", ok).describe("COMPLETED") == "local job 9: COMPLETED"
    assert LocalResult("9", "INTERRUPTED", ok).describe("CANCELLED") == "local job 9: CANCELLED"
    bad = [TaskOutcome(0, False, "ConfigError: x", 2.0), TaskOutcome(1, False, "E: y", 3.0)]
    result = LocalResult("9", "FINISHED", bad)
    assert result.describe("FAILED") == (
        "local job 9: FAILED: rank 0 failed (then rank 1): ConfigError: x"
    )
    assert LocalResult("9", "INTERRUPTED", []).describe("FAILED") == "local job 9: FAILED"


def model_broken_on_rank_1(cfg: object) -> object:
    """``train.model`` for the test below: rank 1 fails at once, rank 0 a moment later."""
    del cfg
    if os.environ["RANK"] == "1":
        raise ValueError("model broken on rank 1")
    time.sleep(2.0)
    raise ValueError("rank 0 gave up too")


def _submit_broken(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path),
         "train.model=tests.backends.local.test_backend:model_broken_on_rank_1", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.torch
def test_local_wait_fails_and_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    """The model imports (so the submit-time checks pass) but breaks on the ranks; without a
    supervisor each rank's submitit result names it."""
    done = _submit_broken(tmp_path, "fault.enabled=false")
    assert done.returncode == 1, done.stderr[-3000:]
    last = [ln for ln in done.stderr.splitlines() if ln.startswith("local job ")][-1]
    assert last.endswith(
        ": FAILED: rank 1 failed (then rank 0): ValueError: model broken on rank 1"
    )
    [run_dir] = tmp_path.iterdir()
    assert read_identity(run_dir) is not None  # the controller was recorded at submit time


@pytest.mark.torch
def test_a_supervised_local_run_that_always_fails_stops_as_a_crash_loop(tmp_path: Path) -> None:
    """The supervisor restarts the broken ranks once in their own process tree, sees the same
    error at the same step with no newer checkpoint, and stops with no_progress, naming rank 1
    and its error; rank 0, which adopted the fault, is not blamed."""
    done = _submit_broken(tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    reason = f"{run_dir}: failed first: no_progress: rank 1 on local: ValueError: model broken"
    assert any(ln.startswith(reason) for ln in done.stderr.splitlines()), done.stderr[-3000:]
    attempts = read_ledger(run_dir / "ledger.jsonl")
    assert [(a.launch, a.cause, a.next) for a in attempts] == [
        (0, EndCause.CRASH, "restart"),
        (1, EndCause.NO_PROGRESS, "stop"),
    ]
    assert attempts[-1].message is not None
    assert f"`hpc-ddp resume {run_dir}` goes on from the start" in attempts[-1].message
    assert "rank 0 gave up too" not in (run_dir / "logs" / "rank-0.err").read_text()


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


def test_a_result_file_is_read_as_plain_values_only(tmp_path: Path) -> None:
    witness = tmp_path / "ran"
    evil = b"cos\nsystem\n(S'touch " + str(witness).encode() + b"'\ntR."
    (tmp_path / "77_0_result.pkl").write_bytes(evil)
    [got] = task_outcomes(tmp_path, "77", 1)
    assert not witness.exists()
    assert (got.ok, got.detail.startswith("unreadable result 77_0_result.pkl")) == (False, True)


# --- how many processes a local job may start --------------------------------------------------


@pytest.mark.parametrize(
    ("ntasks", "cpus", "refused"),
    [(2, 1, False), (4, 1, False), (5, 1, True), (8, 2, False), (9, 2, True),
     (256, 64, False), (257, 64, True), (257, 1024, True), (1000, 2, True)],
)  # fmt: skip
def test_a_local_job_is_capped_by_the_cpus_and_a_hard_limit(
    ntasks: int, cpus: int, refused: bool
) -> None:
    if not refused:
        check_local_size(ntasks, cpus)
        return
    with pytest.raises(ConfigError, match=rf"= {ntasks} local processes, more than .*HINT:"):
        check_local_size(ntasks, cpus)


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_submit_refuses_a_thousand_local_processes_before_creating_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: list[str]
) -> None:
    runs = tmp_path / "runs"
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "slurm.nodes=1000",
            "--runs-dir", str(runs), *dry_run]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "slurm.nodes x slurm.tasks_per_node = 1000 local processes" in err
    assert "--backend slurm" in err
    assert not runs.exists()


def test_a_local_dry_run_says_what_the_local_backend_would_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "--dry-run", "--runs-dir",
            str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# backend: local; would start 2 process(es) on this machine (ranks 0-1" in out
    assert "under a supervisor (the local executor's one task) that restarts them" in out
    assert "sbatch" not in out
    assert main([*argv, "fault.enabled=false"]) == 0
    assert "with submitit's local executor in" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"][1:3] == ["-m", "submitit.local._local"]
    assert data["plan"].startswith("backend: local; would start 2 process(es)")
    assert not any(tmp_path.iterdir())


@pytest.mark.torch
def test_a_local_run_that_fails_before_its_attempt_starts_is_failed_in_status(
    tmp_path: Path,
) -> None:
    """The model cannot be built: every rank crashes inside the session before rank 0 records
    the attempt's start. status must say FAILED, with the rank and its error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path), "train.model=tests.helpers.user_code:Nope"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    status = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "status", str(run_dir), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    [row] = json.loads(status.stdout)["runs"]
    # Restarted once in its process tree, then stopped as a crash loop: the same error again.
    assert (row["state"], row["causes"]) == ("FAILED", ["crash", "no_progress"])
    said = r"rank [01] on [^:]+: ConfigError: train\.model: module 'tests\.helpers\.user_code' "
    assert re.search(said + "has no attribute 'Nope'", row["note"]), row["note"]
    assert "command:" not in row["note"]


# --- a cancel that must kill: every process of the run, gone --------------------------------

STUBBORN = """
import signal, sys, time
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
print("ignoring every stop signal", flush=True)
while True:
    time.sleep(1)
"""


def _stubborn_job(tmp_path: Path) -> Path:
    """A ``command:`` job of 2 tasks whose program ignores TERM, USR1, USR2, INT and HUP."""
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    job = tmp_path / "stubborn.yaml"
    job.write_text(
        "name: stubborn\n"
        f"command: [python, {tmp_path / 'stubborn.py'}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
    )
    return job


def _says(log: Path, text: str) -> bool:
    return log.is_file() and text in log.read_text()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _pids_running(needle: str) -> list[int]:
    """Every process whose command line contains ``needle`` (read from /proc: no code of the
    package under test decides what is found)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if needle in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def _hpc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run([sys.executable, "-m", "hpc_ddp", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def test_cancel_kills_a_local_job_that_ignores_every_stop_signal(tmp_path: Path) -> None:
    """SIGTERM changes nothing; after the grace (``--kill-wait``) every process of the run is
    SIGKILLed (the controller, the supervisor, both ranks and both programs), and only once
    they are all gone does cancel say "cancelled", and that it killed."""
    job = _stubborn_job(tmp_path)
    done = _hpc("submit", str(job), "--backend", "local", "--json", "--runs-dir",
                str(tmp_path / "runs"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    script = str(tmp_path / "stubborn.py")
    try:
        for rank in (0, 1):
            log = run_dir / "logs" / f"rank-{rank}.out"
            e2e.wait_for(
                f"rank {rank} ignoring", partial(_says, log, "ignoring every"), timeout_s=120
            )
        programs = _pids_running(script)
        assert len(programs) == 2
        ran = _pids_running(str(run_dir))  # controller, supervisor, ranks
        assert len(ran) >= 4
        said = _hpc("cancel", str(run_dir), "--kill-wait", "2")
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith(f"cancelled local job {read_manifest(run_dir).job_id} ")
        assert "; killed after 2 s: " in said.stdout, said.stdout
        assert "still ran after SIGTERM" in said.stdout
        assert _pids_running(script) == []
        assert _pids_running(str(run_dir)) == []
        row = json.loads(_hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "CANCELLED"
        again = _hpc("cancel", str(run_dir))
        assert "already ended; nothing was signalled" in again.stdout
    finally:
        for pid in _pids_running(script) + _pids_running(str(run_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


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
        e2e.wait_for("a zombie", lambda: _state(leader.pid) == "Z")
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


# --- a local submit returns when it has submitted -------------------------------------------

GATED = """
import os, pathlib, time
flag = pathlib.Path(os.environ["GATE"])
print("waiting for", flag, flush=True)
while not flag.exists():
    time.sleep(0.1)
"""

API_CALLER = """
import sys
import hpc_ddp
job = hpc_ddp.submit(sys.argv[1], backend="local", runs_dir=sys.argv[2])
print(job.run_dir, flush=True)
"""


def _gated_job(tmp_path: Path) -> Path:
    """A ``command:`` job of 2 tasks that runs until the file ``$GATE`` exists."""
    (tmp_path / "gated.py").write_text(GATED)
    job = tmp_path / "gated.yaml"
    job.write_text(
        "name: gated\n"
        f"command: [python, {tmp_path / 'gated.py'}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
    )
    return job


@pytest.mark.parametrize("caller", ["capture", "tee", "api"])
def test_a_local_submit_whose_output_is_read_to_its_end_returns_while_the_run_runs(
    tmp_path: Path, caller: str
) -> None:
    """``x=$(hpc-ddp submit ... --json)``, ``... | tee f`` and a script that calls
    ``hpc_ddp.submit(backend="local")`` with its output captured: each reads its output to
    the end, which comes only once no process holds it. The run's processes hold none of
    it: the caller is back while the run is RUNNING (it waits for a file that only appears
    after), and the run then ends COMPLETED."""
    job, runs, gate = _gated_job(tmp_path), tmp_path / "runs", tmp_path / "gate"
    submit = shlex.join([sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend",
                         "local", "--json", "--runs-dir", str(runs)])  # fmt: skip
    argv = {
        "capture": ["bash", "-c", f'x=$({submit}) && printf "%s\\n" "$x"'],
        "tee": ["bash", "-c", f"set -o pipefail; {submit} | tee {tmp_path / 'tee.out'}"],
        "api": [sys.executable, "-c", API_CALLER, str(job), str(runs)],
    }[caller]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
           "GATE": str(gate), "PYTHONPATH": str(REPO)}  # fmt: skip
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=90, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        [run_dir] = runs.iterdir()
        said = done.stdout.strip()
        assert said == str(run_dir) if caller == "api" else json.loads(said)["run_dir"]
        row = json.loads(_hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "RUNNING", row
        for rank in (0, 1):
            log = run_dir / "logs" / f"rank-{rank}.out"
            e2e.wait_for(f"rank {rank} waiting", partial(_says, log, "waiting for"), timeout_s=120)
        gate.touch()
        job_id = read_manifest(run_dir).job_id
        e2e.wait_for("the run's end", lambda: not local_alive(run_dir, job_id), timeout_s=120)
        row = json.loads(_hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "COMPLETED", row
    finally:
        gate.touch()
        for run_dir in runs.iterdir() if runs.is_dir() else []:
            for pid in _pids_running(str(run_dir)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_forced_stop_names_the_checkpoint_it_goes_on_from_file_or_shard_set() -> None:
    """What a forced local stop writes to the ledger and says was lost names an FSDP run's
    shard set by its directory (step-N), a DDP run's checkpoint by its file (step-N.pt)."""
    assert (
        ForcedStop([0], 25, Checkpoint(20, "step-00000020"))
        .lost()
        .endswith("the 5 step(s) after checkpoint step-00000020 are lost")
    )
    assert ForcedStop([0], 25, None).lost().startswith("no checkpoint was saved")


def _labelled(path: Path, step: int, run_id: str) -> None:
    """A zip archive whose pickle says ``step`` and ``run_id``, as a checkpoint's does."""
    payload = {"progress": {"step": step}, "meta": {"run_id": run_id}, "pad": "x" * 400}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def test_a_forced_stop_goes_on_from_this_runs_newest_checkpoint_not_another_runs(
    tmp_path: Path,
) -> None:
    """A checkpoint copied in from another run (its label names that run) is passed over, as
    the ranks' resume passes it over: the stop says the run goes on from its own newest."""
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    paths.run_id_file.write_text("mine-1\n")
    _labelled(paths.checkpoints / "step-00000010.pt", 10, "mine-1")
    _labelled(paths.checkpoints / "step-00000030.pt", 30, "theirs-2")
    forced = force_stop(tmp_path, None, time.time())
    assert (forced.ranks, forced.checkpoint) == ([], Checkpoint(10, "step-00000010.pt"))
