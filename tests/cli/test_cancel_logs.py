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

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_ddp.local.process import identify_started, write_identity
from hpc_ddp.rundir import Manifest, RunPaths, write_manifest
from hpc_ddp.runtime.ledger import EndCause, read_ledger
from hpc_ddp.slurm.client import parse_scontrol_oneliner
from tests import e2e_util as e2e
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
    paths.make()
    write_manifest(
        paths,
        Manifest(
            name="quickstart", backend="local", job_id=job_id,
            submitted_at="2026-11-22T10:00:00+00:00", command=["submitit-local", job_id],
            config_source="jobs/quickstart.yaml", run_dir=str(root),
        ),
    )  # fmt: skip
    return root


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


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
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Positive control: with the right identity recorded, the guard records the SIGTERM."""
    ident = identify_started(sleeper.pid)
    assert ident is not None
    run_dir = local_run(tmp_path / "run", str(sleeper.pid))
    write_identity(run_dir, ident)
    done, calls = guarded(tmp_path, "cancel", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert len(calls) == 1
    assert calls[0][0] == "pidfd_send_signal"
    assert calls[0][2] == "15"
    assert f"cancelled local job {sleeper.pid}" in done.stdout


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
        tasks = _children(pid)
        assert len(tasks) == 2  # the two ranks
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
    assert "is not a directory. HINT:" in gone.stderr
    run_dir = _logs_run(tmp_path / "run", "", "x\n")
    absent = hpc("logs", str(run_dir), "--rank", "3")
    assert absent.returncode == 1
    assert "no rank-3.err log yet. HINT: logs present: rank-0.err, rank-0.out" in absent.stderr
