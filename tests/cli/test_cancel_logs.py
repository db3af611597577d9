"""``hpc-ddp cancel`` and ``hpc-ddp logs`` through the real CLI, in subprocesses.

Cancel must never signal a process that is not the run's: a pid now reused by an unrelated
``sleep`` survives, and job ids that ``kill(2)`` reads as "my process group" (0) or "every
process" (-1) are refused before any signal. Those refusals run the CLI under a guard that
records ``os.kill``, ``os.killpg`` and ``signal.pidfd_send_signal`` instead of sending, so a
regression shows as a recorded call rather than a killed test machine; a positive control
proves the guard sees a real cancel's signal. A real two-rank local job is then cancelled and
its tasks end; a real Slurm sweep of two job arrays is cancelled as a whole.
"""

from __future__ import annotations

import io
import json
import os
import pty
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.local.process import identify_started, write_identity
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import parse_scontrol_oneliner
from hpc_ddp.cli import cmd_logs
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.submission.submit import make_run_dir
from tests import e2e_util as e2e
from tests.cli.test_status import command_job
from tests.cli.test_targets import write_run, write_sweep
from tests.conftest import REPO, Cluster

GUARD = """
import json, os, signal, sys
calls = []
def recorder(name):
    def fake(*args):
        calls.append([name, *map(str, args)])
    return fake
os.kill, os.killpg = recorder("kill"), recorder("killpg")
signal.pidfd_send_signal = recorder("pidfd_send_signal")
from hpc_ddp.cli.main import main
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(calls, f)
sys.exit(rc)
"""


def local_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}


def hpc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``hpc-ddp ARGS`` for real."""
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=cwd, env=local_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def guarded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``hpc-ddp ARGS`` with every signal-sending call recorded, not made; (result, calls)."""
    record = tmp_path / "signals.json"
    done = subprocess.run(
        [sys.executable, "-c", GUARD, str(record), *args],
        cwd=tmp_path, env={**local_env(), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    calls = json.loads(record.read_text()) if record.exists() else ["<no record: guard died>"]
    return done, calls


def local_run(root: Path, job_id: str) -> Path:
    """A run directory whose manifest says: local job ``job_id``."""
    paths = RunPaths(root)
    make_run_dir(paths)
    write_manifest(
        paths,
        Manifest(
            name="quickstart", backend="local", job_id=job_id,
            submitted_at="2026-11-22T10:00:00+00:00", command=["submitit-local", job_id],
            config_source="jobs/quickstart.yaml", run_dir=str(root),
        ),
    )  # fmt: skip
    return root


# --- cancel: nothing wrongly killed ----------------------------------------------------------


def test_a_pid_reused_by_an_unrelated_process_is_not_killed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    ident = identify_started(sleeper.pid)
    assert ident is not None
    # The run's controller had this pid once, but started at another time.
    run_dir = local_run(tmp_path / "run", str(sleeper.pid))
    write_identity(run_dir, replace(ident, start_ticks=ident.start_ticks - 1))
    done = hpc("cancel", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert f"local job {sleeper.pid} already ended; nothing was signalled" in done.stdout
    time.sleep(0.3)
    assert sleeper.poll() is None  # still sleeping
    assert not (run_dir / "local-cancelled").exists()


def test_a_run_without_local_json_is_cancelled_only_if_the_pid_runs_its_controller(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    run_dir = local_run(tmp_path / "run", str(sleeper.pid))  # from before local.json existed
    done = hpc("cancel", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert "already ended; nothing was signalled" in done.stdout
    time.sleep(0.3)
    assert sleeper.poll() is None


@pytest.mark.parametrize("job_id", ["0", "-1", "1", "abc"])
def test_manifest_job_ids_that_are_no_pid_are_refused_without_a_signal(
    tmp_path: Path, job_id: str
) -> None:
    run_dir = local_run(tmp_path / "run", job_id)
    done, calls = guarded(tmp_path, "cancel", str(run_dir))
    assert calls == []
    assert done.returncode == 2, done.stderr
    assert f"local job id {job_id!r} is not a process id" in done.stderr
    assert "nothing was signalled. HINT:" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("target", ["abc", "0", "-1", "12x"])
def test_a_target_that_is_neither_a_dir_nor_a_job_id_is_a_usage_error(
    tmp_path: Path, target: str
) -> None:
    done, calls = guarded(tmp_path, "cancel", target, "--runs-dir", str(tmp_path))
    assert calls == []
    assert done.returncode == 2, done.stderr
    assert f"cancel target {target!r} is neither a run directory nor a job id" in done.stderr
    assert "HINT:" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_guard_sees_a_real_cancels_signal(
    tmp_path: Path, run_sleeper: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    """Positive control: with the right identity recorded, the guard records the SIGTERM, and
    the SIGKILL after the grace. No signal was really sent, so the process still runs: cancel
    never says "cancelled" then, but names it and exits 1."""
    run_dir = local_run(tmp_path / "run", "2")
    sleeper = run_sleeper(run_dir)  # its command line names run/submitit, as a controller's
    ident = identify_started(sleeper.pid)
    assert ident is not None
    local_run(run_dir, str(sleeper.pid))
    write_identity(run_dir, ident)
    done, calls = guarded(tmp_path, "cancel", str(run_dir), "--json", "--kill-wait", "0.5")
    assert done.returncode == 1, done.stderr
    assert calls[0][0] == "pidfd_send_signal"
    assert calls[0][2] == "15"
    assert len(calls) > 1
    assert {tuple(c[::2]) for c in calls[1:]} == {("pidfd_send_signal", "9")}
    [shown] = json.loads(done.stdout)["results"]
    assert shown["outcome"] == "still_running"
    assert "cancelled" not in shown["message"]
    assert f"local job {sleeper.pid} still runs after SIGTERM and, 0.5 s later, SIGKILL: " \
        f"pid {sleeper.pid} (`{sys.executable} -c" in shown["message"]  # fmt: skip
    assert sleeper.poll() is None


def test_a_copied_local_json_signals_nothing_of_the_original_run(
    tmp_path: Path, run_sleeper: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    """``cp -r runs/a runs/b``: b's local.json names a's live controller, which runs exactly
    as recorded; its command line names a, so cancelling b signals nothing and says why."""
    original = local_run(tmp_path / "a", "2")
    controller = run_sleeper(original)
    ident = identify_started(controller.pid)
    assert ident is not None
    local_run(original, str(controller.pid))
    write_identity(original, ident)
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    done, calls = guarded(tmp_path, "cancel", str(copy), "--json")
    assert calls == []
    assert done.returncode == 2, done.stderr
    [shown] = json.loads(done.stdout)["results"]
    assert shown["outcome"] == "not_this_run"
    assert f"its process {controller.pid}" in shown["message"]
    assert f"runs {original.resolve()}, not {copy.resolve()}" in shown["message"]
    assert "nothing was signalled. HINT:" in shown["message"]
    assert not (copy / "local-cancelled").exists()
    assert controller.poll() is None
    # Status agrees: the copy runs nothing, the original runs.
    shown = json.loads(hpc("status", str(copy), str(original), "--json").stdout)
    states = {Path(r["run_dir"]).name: r["state"] for r in shown["runs"]}
    assert states["a"] == "RUNNING"
    assert states["b"] != "RUNNING"


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.torch
def test_cancel_stops_a_running_local_job_and_wait_reports_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend",
             "local", "--wait", "--runs-dir", str(runs), "train.epochs=50", "train.log_every=1"],
            cwd=REPO, env=local_env(), stdout=out, stderr=err,
        )  # fmt: skip
    try:
        run_dir = e2e.wait_for("run dir", lambda: next(runs.glob("*/manifest.json"), None)).parent
        e2e.wait_step(run_dir, 3, timeout_s=180)
        pid = int(json.loads((run_dir / "manifest.json").read_text())["job_id"])
        [supervisor] = _children(pid)  # the controller's one task (fault.enabled)
        ranks = e2e.wait_for("the two ranks", lambda: len(_children(supervisor)) == 2)
        assert ranks
        tasks = [supervisor, *_children(supervisor)]
        # A copy of the live run dir (`cp -r`) names these processes too: it signals nothing.
        copy = shutil.copytree(run_dir, tmp_path / "copy")
        refused = hpc("cancel", str(copy))
        assert refused.returncode == 2, refused.stdout
        assert f"{copy}: local job {pid} is not this run's: its process " in refused.stderr
        assert f"runs {run_dir}, not {copy}; nothing was signalled" in refused.stderr
        assert all(identify_started(t, timeout_s=0) is not None for t in [pid, *tasks])
        done = hpc("cancel", str(run_dir))
        assert done.returncode == 0, done.stderr
        assert f"cancelled local job {pid}" in done.stdout
        assert waiter.wait(timeout=120) == 1
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert f"local job {pid}: CANCELLED" in (tmp_path / "err").read_text()
    assert all(identify_started(t, timeout_s=0) is None for t in [pid, *tasks])
    # A person's SIGTERM outside Slurm is recorded as a cancel, not as an unknown stop.
    assert read_ledger(run_dir / "ledger.jsonl")[-1].cause is EndCause.CANCELLED
    again = hpc("cancel", str(run_dir))
    assert again.returncode == 0, again.stderr
    assert "already ended; nothing was signalled" in again.stdout
    # The default `logs` stream is where rank 0's progress went, stop included.
    log = hpc("logs", str(run_dir)).stdout
    assert "rank 0/2" in log
    assert "step 3/" in log
    assert "stopping at step" in log
    assert "stopping at step" not in hpc("logs", str(run_dir), "--out").stdout


# --- cancel SWEEP_DIR on the real cluster ----------------------------------------------------


@pytest.mark.slurm
def test_cancel_sweep_dir_cancels_every_array_job(slurm_cluster: Cluster, tmp_path: Path) -> None:
    sweep_file = tmp_path / "sweep.yaml"
    # Two values of a Slurm setting: two scripts, so two job arrays in one sweep.
    sweep_file.write_text(
        f"base: {REPO / 'jobs' / 'quickstart.yaml'}\n"
        "sweep:\n  grid:\n    slurm.time: ['00:10:00', '00:09:00']\n    train.seed: [0, 1]\n"
        "  max_parallel: 1\n"
    )
    sub = e2e.sweep(slurm_cluster, tmp_path / "runs", sweep_file, "train.epochs=50")
    jobs = sub["array_jobs"]
    assert len(jobs) == 2
    done = e2e.hpc(slurm_cluster, "cancel", sub["sweep_dir"])
    assert f"cancelled slurm job arrays {', '.join(jobs)}" in done.stdout

    def states() -> dict[tuple[str, str], str]:
        """(array job, task ids) -> state for every record scontrol holds of the arrays."""
        out = "".join(slurm_cluster.run("scontrol", "show", "job", "-o", j).stdout for j in jobs)
        rows = [parse_scontrol_oneliner(line) for line in out.splitlines() if line.strip()]
        return {(r["ArrayJobId"], r["ArrayTaskId"]): r["JobState"] for r in rows}

    final = e2e.wait_for(
        "every array task finished",
        lambda: (s := states()) and all(v in e2e.FINAL_STATES for v in s.values()) and s,
        timeout_s=120,
    )
    assert {array for array, _ in final} == set(jobs)
    assert set(final.values()) == {"CANCELLED"}, final


@pytest.mark.slurm
def test_real_job_survives_cancel_of_a_damaged_manifest_that_names_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A damaged manifest whose job id would widen scancel (here to a list holding our own
    running job, so a regression could only ever hurt this test's job) cancels nothing."""
    runs = tmp_path / "runs"
    sleeper = command_job(tmp_path, "sleeper", "import time\ntime.sleep(300)\n")
    job = e2e.submit(slurm_cluster, runs, str(sleeper))
    try:
        e2e.wait_state(slurm_cluster, job.job_id, ["RUNNING"], timeout_s=240)
        listed = write_run(runs, "listed", job_id=f"{job.job_id},{job.job_id}")
        ranged = write_run(runs, "ranged", job_id=job.job_id,
                           array_jobs=[job.job_id, f"{job.job_id}_[0-3]"])  # fmt: skip
        for damaged, bad in ((listed, f"{job.job_id},{job.job_id}"),
                             (ranged, f"{job.job_id}_[0-3]")):  # fmt: skip
            done = e2e.hpc(slurm_cluster, "cancel", str(damaged), check=False)
            assert done.returncode == 1, done.stdout
            assert f"{damaged / 'manifest.json'}: job id {bad!r} is not a Slurm job id" in (
                done.stderr
            )
            assert "HINT:" in done.stderr
            assert done.stdout == ""
        assert e2e.job_fields(slurm_cluster, job.job_id)["JobState"] == "RUNNING"
        shown = e2e.hpc(slurm_cluster, "status", "--runs-dir", str(runs), "--json", check=False)
        states = {Path(r["run_dir"]).name: r["state"] for r in json.loads(shown.stdout)["runs"]}
        assert states == {job.run_dir.name: "RUNNING", "listed": "DAMAGED", "ranged": "DAMAGED"}
    finally:
        e2e.hpc(slurm_cluster, "cancel", str(job.run_dir), check=False)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "CANCELLED"


# Point 0 sleeps until cancelled; point 1 waits for a file, then ends well.
TWO_ROLES = """\
import pathlib, sys, time
go = pathlib.Path(sys.argv[2])
while sys.argv[1] == "sleep" or not go.exists():
    time.sleep(0.2)
"""


@pytest.mark.slurm
def test_real_cancel_of_one_sweep_task_by_its_directory(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "roles.py"
    script.write_text(TWO_ROLES)
    go = tmp_path / "go"
    (tmp_path / "job.yaml").write_text(
        f"name: roles\ncommand: [python, {script}, '{{params.role}}', {go}]\n"
        "params: {role: sleep}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text("base: job.yaml\nsweep:\n  grid:\n    params.role: [sleep, wait]\n")
    sub = e2e.sweep(slurm_cluster, tmp_path / "runs", sweep_file)
    [array] = sub["array_jobs"]
    sweep_dir = Path(sub["sweep_dir"])
    try:
        for task in ("0", "1"):
            e2e.wait_state(slurm_cluster, f"{array}_{task}", ["RUNNING"], timeout_s=240)
        done = e2e.hpc(slurm_cluster, "cancel", str(sweep_dir / "tasks" / "0"))
        assert f"cancelled slurm array task {array}_0 ({sweep_dir / 'tasks' / '0'})" in done.stdout
        assert e2e.wait_done(slurm_cluster, f"{array}_0")["JobState"] == "CANCELLED"
        assert e2e.job_fields(slurm_cluster, f"{array}_1")["JobState"] == "RUNNING"
        go.touch()
        assert e2e.wait_done(slurm_cluster, f"{array}_1")["JobState"] == "COMPLETED"
    finally:
        go.touch()
        e2e.hpc(slurm_cluster, "cancel", str(sweep_dir), check=False)


# --- logs ------------------------------------------------------------------------------------


def _logs_run(root: Path, out: str, err: str) -> Path:
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "rank-0.out").write_text(out)
    (root / "logs" / "rank-0.err").write_text(err)
    return root


def test_logs_shows_the_progress_stream_by_default(tmp_path: Path) -> None:
    run_dir = _logs_run(tmp_path / "run", "print line\n", "step 1/9 | loss 2.0\n")
    assert hpc("logs", str(run_dir)).stdout == "step 1/9 | loss 2.0\n"
    assert hpc("logs", str(run_dir), "--err").stdout == "step 1/9 | loss 2.0\n"
    assert hpc("logs", str(run_dir), "--out").stdout == "print line\n"
    both = hpc("logs", str(run_dir), "--both").stdout
    assert both == "==> rank-0.err <==\nstep 1/9 | loss 2.0\n\n==> rank-0.out <==\nprint line\n"
    help_text = hpc("logs", "--help").stdout
    assert "where hpc-ddp writes its progress" in help_text
    assert "--task" in help_text


def test_logs_follow_prints_what_is_appended(tmp_path: Path) -> None:
    run_dir = _logs_run(tmp_path / "run", "", "step 1/9\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "hpc_ddp", "logs", str(run_dir), "-f", "--poll", "0.05",
         "--follow-for", "30"],
        cwd=REPO, env=local_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "step 1/9\n"
        with (run_dir / "logs" / "rank-0.err").open("a") as f:
            f.write("step 2/9\n")
        assert follower.stdout.readline() == "step 2/9\n"  # before --follow-for runs out
    finally:
        follower.kill()
        follower.communicate()  # reaps it and closes the pipe


@pytest.mark.parametrize(("nodes", "tasks", "has"), [(2, 1, "2 ranks: 0-1"), (1, 1, "1 rank: 0")])
def test_logs_of_a_rank_the_run_does_not_have_is_a_usage_error(
    tmp_path: Path, nodes: int, tasks: int, has: str
) -> None:
    """It used to say "no log yet" (exit 1), as if the rank might still write one."""
    from hpc_ddp.config.load import dump_job_config
    from hpc_ddp.config.model import JobConfig, SlurmConfig

    run_dir = _logs_run(tmp_path / "run", "", "step 1/9\n")
    cfg = JobConfig("x", slurm=SlurmConfig(nodes=nodes, tasks_per_node=tasks))
    (run_dir / "config.yaml").write_text(dump_job_config(cfg))
    done = hpc("logs", str(run_dir), "--rank", str(nodes * tasks))
    assert done.returncode == 2, done.stderr
    assert f"--rank {nodes * tasks}: no such rank (the run has {has})" in done.stderr
    assert "HINT:" in done.stderr
    assert "no log yet" not in done.stderr
    assert hpc("logs", str(run_dir), "--rank", "0").stdout == "step 1/9\n"


def test_logs_of_a_sweep_task(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for i in (0, 1, 2, 5):
        _logs_run(sweep / "tasks" / str(i), "", f"task {i} progress\n")
    assert hpc("logs", str(sweep), "--task", "5").stdout == "task 5 progress\n"
    assert hpc("logs", str(sweep), "--task", "1", "-f", "--follow-for", "0").stdout == (
        "task 1 progress\n"
    )
    no_task = hpc("logs", str(sweep))
    assert no_task.returncode == 2
    assert "is a sweep directory with tasks 0-2, 5. HINT: pick one with --task N" in (
        no_task.stderr
    )
    missing = hpc("logs", str(sweep), "--task", "3")
    assert missing.returncode == 2
    assert "--task 3:" in missing.stderr
    assert "has tasks 0-2, 5" in missing.stderr
    not_sweep = hpc("logs", str(sweep / "tasks" / "0"), "--task", "0")
    assert not_sweep.returncode == 2
    assert "is not a sweep directory" in not_sweep.stderr


def test_logs_errors_are_clear(tmp_path: Path) -> None:
    gone = hpc("logs", str(tmp_path / "nope"))
    assert gone.returncode == 2
    assert f"{tmp_path / 'nope'}: no such run directory. HINT:" in gone.stderr
    run_dir = _logs_run(tmp_path / "run", "", "x\n")
    absent = hpc("logs", str(run_dir), "--rank", "3")
    assert absent.returncode == 1
    assert "no rank-3.err log yet. HINT: logs present: rank-0.err, rank-0.out" in absent.stderr


@pytest.mark.parametrize(
    "argv",
    [["--poll", "-1"], ["--poll", "nan"], ["--poll", "inf"], ["--poll", "0"], ["--poll", "x"],
     ["--follow-for", "-1"], ["--follow-for", "nan"], ["--rank", "-1"], ["--rank", "1.5"]],
)  # fmt: skip
def test_logs_option_values_out_of_range_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    run_dir = _logs_run(tmp_path / "run", "", "x\n")
    with pytest.raises(SystemExit) as info:
        main(["logs", str(run_dir), "-f", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[0]}: {argv[1]!r} is not a" in err
    assert "Traceback" not in err


def test_something_else_where_a_log_belongs_is_named_not_a_traceback(tmp_path: Path) -> None:
    run_dir = _logs_run(tmp_path / "run", "", "x\n")
    logs = run_dir / "logs"
    (logs / "rank-0.err").unlink()
    (logs / "rank-0.err").mkdir()
    as_dir = hpc("logs", str(run_dir))
    assert as_dir.returncode == 1
    assert f"{logs / 'rank-0.err'}: is not a regular file, so not a log. HINT:" in as_dir.stderr
    (logs / "rank-0.err").rmdir()
    (logs / "rank-0.err").symlink_to(logs / "gone.err")
    dangling = hpc("logs", str(run_dir))
    assert dangling.returncode == 1
    assert (
        f"{logs / 'rank-0.err'}: a symlink to {logs / 'gone.err'}, which does not exist. HINT:"
    ) in dangling.stderr
    assert "log yet" not in dangling.stderr
    (logs / "batch-7.out").mkdir()
    batch = hpc("logs", str(run_dir), "--batch", "--out")
    assert batch.returncode == 1
    assert "batch-7.out: is not a regular file" in batch.stderr
    assert "Traceback" not in as_dir.stderr + dangling.stderr + batch.stderr


# A rank's output with escape sequences (an OSC title change, a CSI clear screen, an 8-bit CSI),
# a bell, DEL, and bytes that are not UTF-8.
RAW = b"step 1\tok\r\n\x1b]0;owned\x07\x1b[2J\xc2\x9b31m\x7f \xff caf\xc3\xa9\n"
SHOWN = "step 1\tok\r\n^[]0;owned^G^[[2JM-^[31m^? \ufffd caf\u00e9\n"


def test_copy_logs_escapes_control_characters_only_when_asked() -> None:
    assert cmd_logs.visible("a\x1b[1mb\x00\x9b\x85\tc\r\n") == "a^[[1mb^@M-^[M-^E\tc\r\n"
    assert cmd_logs.visible("plain text, \u00e9t\u00e9") == "plain text, \u00e9t\u00e9"


def test_logs_pass_bytes_unchanged_to_a_pipe_and_escape_them_on_a_terminal(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank-0.err").write_bytes(RAW)
    argv = [sys.executable, "-m", "hpc_ddp", "logs", str(run_dir)]
    piped = subprocess.run(argv, cwd=REPO, env=local_env(), capture_output=True, timeout=60,
                           check=False)  # fmt: skip
    assert (piped.returncode, piped.stdout) == (0, RAW)
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(argv, cwd=REPO, env=local_env(), stdout=follower,
                              stderr=subprocess.PIPE, timeout=60, check=False)  # fmt: skip
        os.close(follower)
        shown = b""
        while chunk := _read_pty(leader):
            shown += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stderr
    # The terminal's line discipline turns each \n into \r\n; nothing else may differ.
    assert shown == SHOWN.encode().replace(b"\n", b"\r\n")
    assert b"\x1b" not in shown


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the other end is closed and everything was read
        return b""


# --- logs -f on a job that has not written its log yet ----------------------------------------


class Sleeps:
    """Stands in for ``time.sleep`` while ``logs`` waits: records each sleep and runs ``then``
    (the world changing meanwhile) on the first one."""

    def __init__(self, then: object) -> None:
        self.then = then
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if len(self.calls) == 1 and callable(self.then):
            self.then()


def test_logs_follow_waits_for_the_log_of_a_pending_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = write_run(tmp_path / "runs", "pending", job_id="77")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState.PENDING)
    sleeps = Sleeps(lambda: (run_dir / "logs" / "rank-0.err").write_text("step 1/9\n"))
    monkeypatch.setattr(time, "sleep", sleeps)
    argv = ["logs", str(run_dir), "-f", "--poll", "0.25", "--follow-for", "0"]
    assert main(argv, backends=Registry(slurm.client())) == 0
    captured = capsys.readouterr()
    assert captured.out == "step 1/9\n"
    assert "hpc-ddp logs: job 77 is PENDING; waiting for its log to appear" in captured.err
    assert sleeps.calls == [0.25]
    assert [c.split()[0] for c in slurm.commands()] == ["squeue"]


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.CANCELLED, None])
def test_logs_follow_does_not_wait_for_a_job_that_has_ended(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    state: JobState | None,
) -> None:
    run_dir = write_run(tmp_path / "runs", "ended", job_id="78")
    slurm = FakeSlurm()
    if state is not None:  # None: slurmctld has forgotten the job
        slurm.add_job("78", state=state)
    sleeps = Sleeps(None)
    monkeypatch.setattr(time, "sleep", sleeps)
    assert main(["logs", str(run_dir), "-f"], backends=Registry(slurm.client())) == 1
    assert "no rank-0.err log yet. HINT:" in capsys.readouterr().err
    assert sleeps.calls == []


def test_logs_follow_stops_waiting_when_the_job_ends_without_a_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = write_sweep(tmp_path / "runs")
    slurm = FakeSlurm()
    # Points 1 and 2 wait in array 1001's pending range; point 1 is 1003_1 since a resubmit.
    pending = slurm.add_job("1003", state=JobState.PENDING, array_job_id="1003",
                            array_task_id="1")  # fmt: skip

    def ends() -> None:
        pending.state = JobState.FAILED

    sleeps = Sleeps(ends)
    monkeypatch.setattr(time, "sleep", sleeps)
    monkeypatch.setattr(cmd_logs, "ASK_EVERY_S", 0.0)
    assert main(["logs", str(sweep), "--task", "1", "-f"], backends=Registry(slurm.client())) == 1
    captured = capsys.readouterr()
    assert "job 1003_1 is PENDING; waiting for its log to appear" in captured.err
    assert f"{sweep / 'tasks' / '1' / 'logs'}: no rank-0.err log yet" in captured.err
    assert len(sleeps.calls) == 1
    assert slurm.commands("squeue -h -t all -j 1003 ")  # asked by the array job id


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.FAILED, None])
def test_logs_follow_of_a_finished_job_prints_the_log_and_stops(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    state: JobState | None,
) -> None:
    """It used to follow forever: nothing would ever be appended again."""
    run_dir = write_run(tmp_path / "runs", "done", job_id="79")
    (run_dir / "logs" / "rank-0.err").write_text("step 9/9\n")
    slurm = FakeSlurm()
    if state is not None:  # None: slurmctld has forgotten the job
        slurm.add_job("79", state=state)
    sleeps = Sleeps(None)
    monkeypatch.setattr(time, "sleep", sleeps)
    assert (
        main(["logs", str(run_dir), "-f", "--follow-for", "600"], backends=Registry(slurm.client()))
        == 0
    )
    assert capsys.readouterr().out == "step 9/9\n"
    assert sleeps.calls == []


def test_logs_follow_stops_once_the_job_ends_with_what_it_wrote_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = write_run(tmp_path / "runs", "running", job_id="80")
    log = run_dir / "logs" / "rank-0.err"
    log.write_text("step 1/2\n")
    slurm = FakeSlurm()
    job = slurm.add_job("80", state=JobState.RUNNING)

    def last_words_then_end() -> None:
        with log.open("a") as f:
            f.write("step 2/2\n")
        job.state = JobState.COMPLETED

    sleeps = Sleeps(last_words_then_end)
    monkeypatch.setattr(time, "sleep", sleeps)
    monkeypatch.setattr(cmd_logs, "ASK_EVERY_S", 0.0)
    argv = ["logs", str(run_dir), "-f", "--poll", "0.25", "--follow-for", "600"]
    assert main(argv, backends=Registry(slurm.client())) == 0
    assert capsys.readouterr().out == "step 1/2\nstep 2/2\n"
    assert sleeps.calls == [0.25]  # one wait while it ran; none once it had ended


def test_copy_logs_writes_bytes_with_headers_for_two_streams(tmp_path: Path) -> None:
    (tmp_path / "a.err").write_bytes(b"\x1b[1mA\n")
    (tmp_path / "b.out").write_bytes(b"B\n")
    out = io.BytesIO()
    paths = [tmp_path / "a.err", tmp_path / "b.out"]
    cmd_logs.copy_logs(paths, out, follow=False, poll_s=1.0, deadline=None)
    assert out.getvalue() == b"==> a.err <==\n\x1b[1mA\n\n==> b.out <==\nB\n"


# --- logs: constant memory, --tail, job ids --------------------------------------------------

BIG = 200 << 20
"""A 200 MiB log (sparse: made at once): far more than ``logs`` may hold in memory."""


def _max_rss_mib(*args: str) -> tuple[int, float]:
    """``hpc-ddp ARGS`` with its output thrown away: (exit status, its own peak RSS in MiB),
    from ``wait4`` (the child's own rusage, not that of every child this test run reaped)."""
    proc = subprocess.Popen([sys.executable, "-m", "hpc_ddp", *args], cwd=REPO, env=local_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


@pytest.mark.parametrize("how", [[], ["-f", "--follow-for", "0"], ["--tail", "2"]])
def test_logs_copies_a_huge_log_in_constant_memory(tmp_path: Path, how: list[str]) -> None:
    """A flood of 200 MiB on stderr (then three lines): printing, following and tailing it
    take the memory of a small Python process, not that of the file."""
    run_dir = local_run(tmp_path / "run", "2")  # pid 2 is no run's controller: it has ended
    log = run_dir / "logs" / "rank-0.err"
    log.parent.mkdir(exist_ok=True)
    with log.open("wb") as f:
        f.truncate(BIG)
        f.seek(BIG)
        f.write(b"one\ntwo\nthree\n")
    code, small = _max_rss_mib("logs", str(run_dir / "nope"))  # the same process, no log
    assert code == 2
    code, rss = _max_rss_mib("logs", str(run_dir), *how)
    assert code == 0
    assert rss < small + 40, (rss, small)  # the file is 200 MiB; the chunks are 64 KiB
    if how[:1] == ["--tail"]:
        assert hpc("logs", str(run_dir), *how).stdout == "two\nthree\n"


@pytest.mark.parametrize(
    "text", ["", "\n", "a", "a\n", "a\nb", "a\nb\n", "\n\n\n", "ab\ncd\nef\n", "x\n\ny\n\n"]
)
@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 16])
def test_tail_start_agrees_with_the_last_lines_of_the_text(text: str, chunk: int) -> None:
    data = text.encode()
    for lines in range(5):
        start = cmd_logs.tail_start(io.BytesIO(data), lines, chunk)
        expected = "".join(text.splitlines(keepends=True)[-lines:]) if lines else ""
        assert data[start:].decode() == expected, (text, lines, chunk)


def test_logs_tail_prints_the_last_lines_of_each_stream(tmp_path: Path) -> None:
    run_dir = _logs_run(tmp_path / "run", "p1\np2\np3\n", "s1\ns2\ns3\ns4")
    assert hpc("logs", str(run_dir), "--tail", "2").stdout == "s3\ns4"
    assert hpc("logs", str(run_dir), "--tail", "0").stdout == ""
    assert hpc("logs", str(run_dir), "--tail", "9", "--out").stdout == "p1\np2\np3\n"
    both = hpc("logs", str(run_dir), "--tail", "1", "--both").stdout
    assert both == "==> rank-0.err <==\ns4\n==> rank-0.out <==\np3\n"
    bad = hpc("logs", str(run_dir), "--tail", "-1")
    assert bad.returncode == 2
    assert "'-1' is not a number of lines" in bad.stderr


def test_logs_finds_a_run_by_its_job_id_under_runs_dir(tmp_path: Path) -> None:
    """As ``status`` and ``cancel`` do: a job id is looked up among the runs' manifests."""
    runs = tmp_path / "runs"
    run_dir = write_run(runs, "mine", job_id="4242")
    write_run(runs, "other", job_id="4243")
    (run_dir / "logs" / "rank-0.err").write_text("step 1/9\n")
    done = hpc("logs", "4242", "--runs-dir", str(runs))
    assert (done.returncode, done.stdout) == (0, "step 1/9\n"), done.stderr
    missing = hpc("logs", "4244", "--runs-dir", str(runs))
    assert missing.returncode == 2
    assert f"'4244' is neither a run directory nor a job id found under {runs}" in missing.stderr
    with_task = hpc("logs", "4242", "--task", "1", "--runs-dir", str(runs))
    assert with_task.returncode == 2
    assert "--task 1: 4242 is a job id, not a sweep directory" in with_task.stderr
