"""One job per run directory (issue 20, item 1), whatever the timing and whoever submits.

* The record lock (:func:`hpc_ddp.rundir.manifest.record_lock`): a second holder waits, a waiter
gives
  up after its bound naming the holder, a dead holder's lock is free, tasks share it.
* The login side: a ``resume`` that waited for another one's record finds that job and submits
  nothing (exit 2, naming it); a second ``--resubmit-failed`` finds the first one's array live.
* The node side (:func:`hpc_ddp.job.task.not_current_refusal`): a task whose job is not the one
  the run's record names starts nothing and writes nothing, while a requeued job, a resumed run
  and a resubmitted sweep task all start; a task that starts before its record waits for it.

The same races with real concurrent processes on the dev cluster (2, 3 and 8 resumes, 2 and 3
resubmits, and a job submitted behind the lock's back) are at the end of this file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.arrays import read_arrays
from hpc_ddp.backends.catalog import BackendName
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.config.load import dump_job_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import RunDirError, TargetError
from hpc_ddp.exitcodes import NOT_CURRENT_EXIT_CODE
from hpc_ddp.job.task import not_current_refusal, run_job
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import (
    Manifest,
    read_manifest,
    record_lock,
    write_manifest,
)
from hpc_ddp.submission.resume import plan_resume, resume
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster
from tests.ledgers import record_end, record_start
from tests.sweep.test_submit import fake_slurm, set_queue, submit

pytestmark = pytest.mark.usefixtures("own_process")

HOLD = """
import sys
from pathlib import Path
from hpc_ddp.rundir.manifest import record_lock
with record_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def _release(holder: subprocess.Popen[str]) -> None:
    """Let the holder go (or reap it) and close its pipes."""
    assert holder.stdin is not None
    assert holder.stdout is not None
    holder.stdin.close()
    holder.wait(timeout=10)
    holder.stdout.close()


def _holder(directory: Path) -> subprocess.Popen[str]:
    """Another process that holds ``directory``'s record lock until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc


# --- the lock ------------------------------------------------------------------------------------


def test_a_waiter_gives_up_after_its_bound_naming_the_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path)
    try:
        for shared in (False, True):
            began = time.monotonic()
            with (
                pytest.raises(RunDirError) as info,
                record_lock(tmp_path, shared=shared, timeout_s=0.3),
            ):
                pytest.fail("granted while another process holds it")
            assert time.monotonic() - began >= 0.3
            said = str(info.value)
            assert f"another hpc-ddp (pid {holder.pid} on " in said
            assert "for more than 0 s" in said
            assert "HINT:" in said
    finally:
        _release(holder)
    with record_lock(tmp_path, timeout_s=1) as held:  # released when its holder let go
        assert held


def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    holder = _holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    _release(holder)
    with record_lock(tmp_path, timeout_s=2) as held:
        assert held


def test_tasks_share_the_lock_and_wait_for_no_lock_file(tmp_path: Path) -> None:
    with record_lock(tmp_path, shared=True) as held:
        assert held is False  # a run dir with no lock file (by hand, or an older hpc-ddp)
    assert not (tmp_path / "submit.lock").exists()  # a task creates nothing
    with record_lock(tmp_path):
        pass
    with record_lock(tmp_path, shared=True) as a, record_lock(tmp_path, shared=True) as b:
        assert (a, b) == (True, True)
        with pytest.raises(RunDirError), record_lock(tmp_path, timeout_s=0.1):
            pass  # a submission waits while a task reads the record


# --- the node side -------------------------------------------------------------------------------

SLURM_TASK = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
              "SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1"}  # fmt: skip


def _run_dir(root: Path, job_id: str | None, backend: BackendName = "slurm") -> Path:
    """A run directory (a one-task ``command`` job) whose manifest names ``job_id``."""
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(
        dump_job_config(JobConfig(name="w", command=("python", "-c", "pass")))
    )
    if job_id is not None:
        write_manifest(
            RunPaths(root),
            Manifest(
                "w", backend, job_id, "2026-01-01T00:00:00+00:00", ["sbatch"], "w.yaml", str(root)
            ),
        )
    with record_lock(root):
        pass  # as a submission leaves it: the lock file is there
    return root


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def test_a_job_that_is_not_the_manifests_starts_nothing_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path / "run", "77")
    before = _files(run)
    env = {**SLURM_TASK, "SLURM_JOB_ID": "78", "PATH": os.environ["PATH"]}
    assert run_job(run, env) == NOT_CURRENT_EXIT_CODE == 5
    assert _files(run) == before  # no ledger, metrics, checkpoint or rendezvous file
    err = capsys.readouterr().err
    assert f"hpc-ddp run: refused: job 78 is not the current job of {run}: " in err
    assert f"{run / 'manifest.json'} names job 77" in err
    assert "HINT: submit a run again with `hpc-ddp resume RUN_DIR`" in err


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_ID": "77"},  # the recorded job
        {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"},  # requeued: same id, one restart on
        {},  # no job at all: run by hand, or by torchrun outside Slurm
    ],
)
def test_the_recorded_job_starts_in_every_attempt(tmp_path: Path, env: dict[str, str]) -> None:
    run = _run_dir(tmp_path / "run", "77")
    assert not_current_refusal(run, run, {**SLURM_TASK, **env}) is None


def test_a_resumed_run_starts_under_its_new_job_only(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", "77")
    manifest = read_manifest(run)
    write_manifest(RunPaths(run), Manifest(**{**manifest.__dict__, "job_id": "90",
                                              "previous_jobs": ["77"]}))  # fmt: skip
    assert not_current_refusal(run, run, {**SLURM_TASK, "SLURM_JOB_ID": "90"}) is None
    refusal = not_current_refusal(run, run, {**SLURM_TASK, "SLURM_JOB_ID": "77"})
    assert refusal is not None
    assert "names job 90" in refusal


def test_an_array_over_a_run_is_refused_though_a_task_has_the_manifests_job_id(
    tmp_path: Path,
) -> None:
    """``sbatch --array=0-1 RUN/job.sbatch``: the last task's SLURM_JOB_ID is the array's own
    id, which could be the one the manifest names; the task is ``77_1``, not job 77."""
    run = _run_dir(tmp_path / "run", "77")
    env = {**SLURM_TASK, "SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "77",
           "SLURM_ARRAY_TASK_ID": "1"}  # fmt: skip
    refusal = not_current_refusal(run, run, env)
    assert refusal is not None
    assert refusal.startswith(f"job 77_1 is not the current job of {run}")


def _sweep(root: Path) -> Path:
    """Points 0-4: array 101 ran 0-2, array 102 runs 3-4 (offset 3), array 103 reran 1."""
    for point in range(5):
        _run_dir(root / "tasks" / str(point), None)
    arrays = [("101", "0-2", 0), ("102", "3-4", 3), ("103", "1", 0)]
    (root / "arrays.json").write_text(json.dumps([
        {"job_id": j, "points": p, "offset": o, "array": p, "script": "job.sbatch",
         "submitted_at": "t"} for j, p, o in arrays
    ]))  # fmt: skip
    return root


@pytest.mark.parametrize(
    ("array", "task", "offset", "point", "current"),
    [("101", "0", "", 0, True), ("103", "1", "", 1, True), ("101", "1", "", 1, False),
     ("102", "1", "3", 4, True), ("101", "2", "", 2, True), ("555", "2", "", 2, False)],
)  # fmt: skip
def test_a_sweep_task_runs_only_under_its_points_latest_array(
    tmp_path: Path, array: str, task: str, offset: str, point: int, current: bool
) -> None:
    sweep = _sweep(tmp_path / "sweep")
    # The last task of an array has SLURM_JOB_ID == the array's id: never the key here.
    env = {
        **SLURM_TASK,
        "SLURM_JOB_ID": array,
        "SLURM_ARRAY_JOB_ID": array,
        "SLURM_ARRAY_TASK_ID": task,
        **({"HPC_DDP_ARRAY_OFFSET": offset} if offset else {}),
    }
    refusal = not_current_refusal(sweep, sweep / "tasks" / str(point), env)
    assert (refusal is None) == current, refusal
    if not current:
        assert refusal is not None
        assert f"arrays.json (point {point}) names job " in refusal


def test_a_refused_sweep_task_writes_nothing_not_even_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A point whose task has not started yet has only its packed line; a task of an array
    that is not the point's latest is refused before it writes ``tasks/<i>/config.yaml``."""
    from hpc_ddp.rundir.taskconfig import pack_task_configs

    sweep = _sweep(tmp_path / "sweep")
    config = dump_job_config(JobConfig(name="w", command=("python", "-c", "pass")))
    (sweep / "task_configs.jsonl").write_text(pack_task_configs((i, config) for i in range(6)))
    shutil.rmtree(sweep / "tasks" / "2")  # point 2's task has not started yet
    with record_lock(sweep):
        pass
    before = _files(sweep)
    env = {**SLURM_TASK, "SLURM_JOB_ID": "555", "SLURM_ARRAY_JOB_ID": "555",
           "SLURM_ARRAY_TASK_ID": "2", "PATH": os.environ["PATH"]}  # fmt: skip
    assert run_job(sweep, env) == NOT_CURRENT_EXIT_CODE
    assert _files(sweep) == before
    assert not (sweep / "tasks" / "2").exists()
    assert "refused: job 555_2 is not the current job" in capsys.readouterr().err


def test_a_point_in_no_array_is_refused(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "sweep")
    _run_dir(sweep / "tasks" / "9", None)
    env = {**SLURM_TASK, "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "9"}
    refusal = not_current_refusal(sweep, sweep / "tasks" / "9", env)
    assert refusal is not None
    assert "(point 9) names no job for it" in refusal


def test_a_local_rank_checks_its_controllers_pid(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", "4242", backend="local")
    assert not_current_refusal(run, run, {}, job_id="4242") is None
    refusal = not_current_refusal(run, run, {}, job_id="4343")
    assert refusal is not None
    assert "job 4343 is not the current job" in refusal


def test_a_damaged_record_refuses_rather_than_guess(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", "77")
    (run / "manifest.json").write_bytes(b"\x00{")
    refusal = not_current_refusal(run, run, {**SLURM_TASK, "SLURM_JOB_ID": "77"})
    assert refusal is not None
    assert "cannot confirm that it is the current job" in refusal
    assert "damaged manifest" in refusal


def test_a_task_that_starts_before_its_record_waits_for_it(tmp_path: Path) -> None:
    """The submitter holds the lock from sbatch to the record; a task that starts meanwhile
    reads the record once it is written (job 78), not the one before it (job 77)."""
    run = _run_dir(tmp_path / "run", "77")
    locked = threading.Event()

    def submitter() -> None:
        with record_lock(run):
            locked.set()
            time.sleep(0.5)
            manifest = read_manifest(run)
            write_manifest(RunPaths(run), Manifest(**{**manifest.__dict__, "job_id": "78"}))

    thread = threading.Thread(target=submitter)
    thread.start()
    assert locked.wait(5)
    began = time.monotonic()
    assert not_current_refusal(run, run, {**SLURM_TASK, "SLURM_JOB_ID": "78"}) is None
    assert time.monotonic() - began >= 0.3
    thread.join()


# --- the login side, over FakeSlurm --------------------------------------------------------------


def _cancelled_slurm_run(tmp_path: Path) -> tuple[Path, FakeSlurm]:
    from hpc_ddp.config.load import load_job_config
    from hpc_ddp.submission.submit import materialize, prepare, record

    config = REPO / "jobs" / "quickstart.yaml"
    cfg = load_job_config(config, [], site_profile=None)
    slurm = FakeSlurm()
    prepared = materialize(
        prepare(cfg, backend=Registry().backend("slurm"), config_path=config, runs_dir=tmp_path,
                python=sys.executable, invocation=["hpc-ddp", "submit"])
    )  # fmt: skip
    record(prepared, job_id="77", command=["sbatch", "--parsable"], previous_jobs=["60"])
    slurm.add_job("77", state=JobState.CANCELLED, command=str(prepared.paths.script))
    return prepared.paths.root, slurm


def test_a_resume_that_waited_for_another_ones_record_submits_nothing(tmp_path: Path) -> None:
    """Two resumes planned at once (both saw the run CANCELLED): the one that gets the lock
    second finds the other's job, submits nothing and names it; no job id is lost."""
    run, slurm = _cancelled_slurm_run(tmp_path)
    client = slurm.client()
    first_plan = plan_resume(run, (), Registry(client))
    second_plan = plan_resume(run, (), Registry(client))
    first = resume(first_plan, Registry(client))
    with pytest.raises(TargetError) as info:
        resume(second_plan, Registry(client))
    assert info.value.exit_code == 2
    assert f"job {first.job_id} (PENDING) was submitted into this run directory while this " in (
        str(info.value)
    )
    assert "nothing was submitted" in str(info.value)
    assert len(slurm.commands("sbatch")) == 1
    manifest = read_manifest(run)
    assert (manifest.job_id, manifest.previous_jobs) == (first.job_id, ["60", "77"])


def _failed_sweep(tmp_path: Path) -> tuple[Path, FakeSlurm]:
    fake = fake_slurm()
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": [0, 1, 2]}}, fake)
    for point in range(3):
        ledger = RunPaths(sweep_dir).task(point).ledger
        record_start(ledger, attempt=0, job_id="1", job_ref=f"101_{point}", nodelist="n1",
                     world_size=2, resumed_from_step=None, checkpoint=None, now=1.0)  # fmt: skip
        record_end(ledger, attempt=0, cause=EndCause.CRASH, steps_done=5, checkpoint=None,
                   requeue_requested=False, now=2.0)  # fmt: skip
    set_queue(fake, [])
    return sweep_dir, fake


def test_a_second_resubmit_failed_finds_the_first_ones_array_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir, fake = _failed_sweep(tmp_path)
    argv = ["sweep", "--resubmit-failed", str(sweep_dir)]
    assert main(argv, backends=Registry(fake.client())) == 0
    assert "resubmitted 3 task(s)" in capsys.readouterr().out
    assert main(argv, backends=Registry(fake.client())) == 2
    err = capsys.readouterr().err
    assert f"nothing resubmitted: 3 task(s) of {sweep_dir} (points 0-2) are still queued or " in (
        err
    )
    assert "in array job(s) 102 (102_[0-2])" in err
    assert "HINT:" in err
    assert [(a.job_id, a.points) for a in read_arrays(sweep_dir)] == [
        ("101", "0-2"),
        ("102", "0-2"),
    ]
    assert len(fake.commands("sbatch")) == 2  # the sweep's, and the first resubmit's
    # Once the tasks have left the queue they may be resubmitted again.
    set_queue(fake, [])
    assert main(argv, backends=Registry(fake.client())) == 0


# --- on the dev cluster: real concurrent processes -----------------------------------------------


def _concurrently(
    cluster: Cluster, argvs: list[list[str]]
) -> list[subprocess.CompletedProcess[str]]:
    """Run every ``hpc-ddp ARGV`` at the same time (started together, then waited for)."""
    procs = [
        subprocess.Popen(
            [*e2e.HPC_DDP, *argv],
            cwd=REPO,
            env=cluster.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in argvs
    ]
    done = []
    for argv, proc in zip(argvs, procs, strict=True):
        out, err = proc.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return done


def _one_winner(results: list[subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    """The one result with exit 0 (its JSON); every other one exited 2 naming its job."""
    won = [r for r in results if r.returncode == 0]
    assert len(won) == 1, [(r.returncode, r.stderr[-300:]) for r in results]
    winner: dict[str, Any] = json.loads(won[0].stdout)
    for lost in results:
        if lost is won[0]:
            continue
        assert lost.returncode == 2, lost.stderr
        assert f"job {winner['job_id']}" in lost.stderr or f" {winner['job_id']}_" in lost.stderr
        assert "two jobs must never write one" in lost.stderr
        assert "Traceback" not in lost.stderr
    return winner


def _jobs_running(cluster: Cluster, script: Path) -> list[str]:
    """Every job Slurm holds (any state, for MinJobAge) whose batch script is ``script``."""
    out = cluster.run("squeue", "-h", "-t", "all", "-O", "JobID:0|,Command:0").stdout
    return sorted(
        (job for job, _, command in (line.partition("|") for line in out.splitlines())
         if command.strip() == str(script)),
        key=int,
    )  # fmt: skip


@pytest.mark.slurm
@pytest.mark.torch
def test_real_concurrent_resumes_submit_one_job_each_time(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A cancelled run resumed by 2, then 3, then 8 ``hpc-ddp resume`` at once: each time
    exactly one submits (exit 0) and the others exit 2 naming its job; Slurm holds exactly one
    new job per round. Then a job submitted behind the lock's back (sbatch on the run's own
    script) is refused on its node: it ends FAILED, says why in its batch log and writes
    nothing, while the run's job finishes with every step once."""
    paced = ["slurm.nodes=1", "train.epochs=1", "train.log_every=1", "train.checkpoint_every=8",
             "train.dataset=tests.e2e_util:io_bound_synthetic", e2e.STEADY_THREADS]  # fmt: skip
    job = e2e.submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", *paced)
    script = job.run_dir / "job.sbatch"
    e2e.wait_checkpoint(job.run_dir, 8, timeout_s=180)
    e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))
    e2e.wait_done(slurm_cluster, job.job_id)
    jobs = [job.job_id]
    for racers in (2, 3, 8):
        results = _concurrently(slurm_cluster, [["resume", str(job.run_dir), "--json"]] * racers)
        winner = _one_winner(results)["job_id"]
        jobs.append(winner)
        assert _jobs_running(slurm_cluster, script) == jobs  # one new job, no other
        manifest = read_manifest(job.run_dir)
        assert (manifest.job_id, manifest.previous_jobs) == (winner, jobs[:-1])
        if racers != 8:
            e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))
            e2e.wait_done(slurm_cluster, winner)

    # The last winner trains; a second job of the same script, submitted by hand, may not.
    e2e.wait_state(slurm_cluster, winner, ["RUNNING"], timeout_s=120)
    rogue = slurm_cluster.run("sbatch", "--parsable", str(script)).stdout.strip()
    fields = e2e.wait_done(slurm_cluster, rogue, timeout_s=120)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", f"{NOT_CURRENT_EXIT_CODE}:0")
    # The supervisor refuses it before any rank starts: its word is in the batch script's log.
    said = e2e.batch_log(job.run_dir, rogue)
    assert f"refused: job {rogue} is not the current job of {job.run_dir}" in said
    assert not list((job.run_dir / "launches").glob(f"{rogue}.*"))  # it made no launch
    assert f"manifest.json names job {winner}" in said
    assert e2e.wait_done(slurm_cluster, winner, timeout_s=240)["JobState"] == "COMPLETED"
    attempts = e2e.ledger(job.run_dir)
    assert rogue not in {a.job_id for a in attempts}
    assert {a.job_id for a in attempts} <= set(jobs)
    assert (attempts[0].job_id, attempts[-1].job_id) == (job.job_id, winner)
    assert attempts[-1].cause is EndCause.FINISHED
    steps = [row["step"] for row in e2e.metric_rows(job.run_dir) if "loss" in row]
    assert len(steps) == len(set(steps)) == 64  # every step once: no second writer
    assert read_manifest(job.run_dir).previous_jobs == jobs[:-1]


FAIL_ONCE = """\
import pathlib, sys, time
run = pathlib.Path(sys.argv[1])
first = run / "failed-once"
if not first.exists():
    first.touch()
    sys.exit(1)
while not pathlib.Path(sys.argv[2]).exists():
    time.sleep(0.2)
"""


@pytest.mark.slurm
def test_real_concurrent_resubmit_failed_submit_one_array_each_time(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A sweep whose three tasks failed, resubmitted by 2 and then 3 ``--resubmit-failed`` at
    once: each time exactly one array is submitted (exit 0), the others exit 2 naming it, and
    ``arrays.json`` keeps every array."""
    script = tmp_path / "fail_once.py"
    script.write_text(FAIL_ONCE)
    go = tmp_path / "go"
    (tmp_path / "job.yaml").write_text(
        f"name: once\ncommand: [{sys.executable}, {script}, '{{params.dir}}', {go}]\n"
        "params: {dir: x}\nslurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
        "fault: {max_restarts: 0}\n"  # its failure must end the job, not be restarted in it
    )
    marks = [str(tmp_path / f"p{i}") for i in range(3)]
    for mark in marks:
        Path(mark).mkdir()
    (tmp_path / "sweep.yaml").write_text(
        f"base: job.yaml\nsweep:\n  grid:\n    params.dir: {json.dumps(marks)}\n"
    )
    sub = e2e.sweep(slurm_cluster, tmp_path / "runs", tmp_path / "sweep.yaml")
    sweep_dir = Path(sub["sweep_dir"])
    arrays = list(sub["array_jobs"])
    try:
        e2e.wait_all_done(slurm_cluster, [f"{arrays[0]}_{i}" for i in range(3)])
        for racers in (2, 3):
            argv = ["sweep", "--resubmit-failed", str(sweep_dir), "--json"]
            results = _concurrently(slurm_cluster, [argv] * racers)
            won = [r for r in results if r.returncode == 0]
            assert len(won) == 1, [(r.returncode, r.stderr[-300:]) for r in results]
            [new] = json.loads(won[0].stdout)["array_jobs"]
            for lost in results:
                if lost is not won[0]:
                    assert lost.returncode == 2, lost.stderr
                    assert f"in array job(s) {new} (" in lost.stderr
            arrays.append(new)
            assert [a.job_id for a in read_arrays(sweep_dir)] == arrays
            assert read_manifest(sweep_dir).array_jobs == arrays
            # The new array's tasks wait for `go`: cancel them, so that they failed again.
            if racers == 2:
                e2e.hpc(slurm_cluster, "cancel", str(sweep_dir))
                e2e.wait_all_done(slurm_cluster, [f"{new}_{i}" for i in range(3)])
        go.touch()
        final = e2e.wait_all_done(slurm_cluster, [f"{arrays[-1]}_{i}" for i in range(3)])
        assert {f["JobState"] for f in final} == {"COMPLETED"}
        scripts = {a.script for a in read_arrays(sweep_dir)}
        assert len(scripts) == 3  # one script per array: no two arrays wrote job-1.sbatch
    finally:
        go.touch()
        e2e.hpc(slurm_cluster, "cancel", str(sweep_dir), check=False)
