"""Issue 7 on the real dev cluster: a 6-point sweep runs as one throttled job array (squeue
shows ``%2`` and never more than two tasks running), every task trains, one task is requeued
alone and still finishes, and ``results`` lists all six rows with metrics, sorted. Then a task
made to fail is rerun, alone, by ``--resubmit-failed``. A sweep whose tasks have not started
(held; then cancelled while pending) has no task directory yet, and every reader says so:
pending, cancelled, "has not started yet"; resubmitted, a task writes its config.yaml from the
sweep's task_configs.jsonl.

Each task imports torch and trains the quickstart MLP on two fake nodes: a few minutes in all.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.api.job import Job
from hpc_ddp.api.sweep import Sweep
from hpc_ddp.backends.arrays import parse_index_ranges
from hpc_ddp.errors import RunDirError
from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, where
from tests.conftest import Cluster
from tests.e2e_util import hpc, job_fields

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING", "CONFIGURING",
          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT"}  # fmt: skip


def tasks(cluster: Cluster, job_ids: list[str]) -> list[tuple[str, str]]:
    """(array task ref, state) of every task and pending range of the jobs."""
    # -t all: finished tasks stay listed (for MinJobAge) instead of vanishing from the view.
    out = cluster.run("squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T").stdout
    return [(ref, state) for ref, state in (line.split() for line in out.splitlines())]


def wait_done(
    cluster: Cluster, job_ids: list[str], timeout_s: float = 400.0, watch: Any = None
) -> None:
    """Wait until no task of the jobs is queued or running (finished ones stay listed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = tasks(cluster, job_ids)
        if watch is not None:
            watch(rows)
        if rows and not any(state in ACTIVE for _, state in rows):
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs {job_ids} still active after {timeout_s} s: {rows}")


def submit_lr_sweep(
    cluster: Cluster, tmp_path: Path, sweep_extra: str, *overrides: str
) -> dict[str, Any]:
    """Submit a 3-point sweep over train.lr of the quickstart job (``sweep_extra``: more lines
    of its ``sweep:`` section); ``hpc-ddp sweep --json``'s answer."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: {REPO / 'jobs' / 'quickstart.yaml'}\n"
        f"sweep:\n  grid:\n    train.lr: [0.1, 0.05, 0.02]\n{sweep_extra}"
    )
    argv = ["sweep", str(sweep), *overrides, "--runs-dir", str(tmp_path / "runs"), "--json"]
    answer: dict[str, Any] = json.loads(hpc(cluster, *argv).stdout)
    return answer


def results(cluster: Cluster, sweep_dir: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        hpc(cluster, "results", sweep_dir, "--format", "json").stdout
    )["rows"]
    return rows


def test_sweep_runs_as_one_throttled_array_requeues_one_task_and_ranks_results(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    # One rank per task (its subject is the array: the throttle, one task requeued alone, the
    # results; a task of two nodes is test_requeue_e2e's array test): 64 steps an epoch.
    submitted = json.loads(
        hpc(slurm_cluster, "sweep", "jobs/sweep-lr.yaml", "train.epochs=1", "slurm.nodes=1",
            "train.checkpoint_every=10", "--runs-dir", str(tmp_path), "--json").stdout
    )  # fmt: skip
    sweep_dir, jobs = submitted["sweep_dir"], submitted["array_jobs"]
    assert len(jobs) == 1  # one array, one sbatch
    job = jobs[0]
    seen: dict[str, Any] = {"throttle": False, "max_running": 0, "requeued": False}
    metrics = Path(sweep_dir, "tasks", "1", "metrics.jsonl")

    def watch(rows: list[tuple[str, str]]) -> None:
        running = [ref for ref, state in rows if state == "RUNNING"]
        seen["max_running"] = max(seen["max_running"], len(running))
        seen["throttle"] |= any("%2" in ref for ref, _ in rows)
        # Requeue task 1 alone once it has trained past its first checkpoint.
        if not seen["requeued"] and f"{job}_1" in running and metrics.exists():
            steps = [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines()
                     if line.strip().endswith("}")]  # fmt: skip
            if steps and max(steps) >= 20:
                slurm_cluster.run("scontrol", "requeue", f"{job}_1")
                seen["requeued"] = True

    wait_done(slurm_cluster, [job], watch=watch)
    assert seen["throttle"], "squeue never showed the %2 throttle"
    assert seen["max_running"] == 2
    assert seen["requeued"]

    rows = results(slurm_cluster, sweep_dir)
    assert len(rows) == 6
    assert [r["state"] for r in rows] == ["finished"] * 6, rows
    bests = [r["best"] for r in rows]
    assert all(isinstance(b, float) for b in bests)
    assert bests == sorted(bests)  # val_loss, min: best first
    assert all(r["steps"] == 64 for r in rows)
    attempts = {r["index"]: r["attempts"] for r in rows}
    assert attempts[1] >= 2, attempts
    assert all(n == 1 for i, n in attempts.items() if i != 1), attempts
    table = hpc(slurm_cluster, "results", sweep_dir).stdout
    assert "6 tasks: 6 finished" in table
    status = hpc(slurm_cluster, "status", sweep_dir).stdout
    assert "6 tasks: 6 finished" in status


def test_resubmit_failed_reruns_exactly_the_failed_task(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    one_rank = ("train.epochs=1", "slurm.nodes=1")  # its subject is which task runs again
    submitted = submit_lr_sweep(slurm_cluster, tmp_path, "  max_parallel: 1\n", *one_rank)
    sweep_dir = Path(submitted["sweep_dir"])
    # Task 2 runs last (one at a time): with a broken config of its own (a task writes its
    # config.yaml from task_configs.jsonl only where there is none) it fails when it starts.
    config = sweep_dir / "tasks" / "2" / "config.yaml"
    config.parent.mkdir()
    config.write_text("train: [broken\n")
    wait_done(slurm_cluster, submitted["array_jobs"])
    states = [r["state"] for r in results(slurm_cluster, str(sweep_dir))]
    assert states == ["finished", "finished", "failed"]

    config.unlink()  # the resubmitted task writes it again, from task_configs.jsonl
    again = json.loads(
        hpc(slurm_cluster, "sweep", "--resubmit-failed", str(sweep_dir), "--json").stdout
    )
    assert again["resubmitted"] == [2]
    assert len(again["array_jobs"]) == 1
    [(ref, _)] = tasks(slurm_cluster, again["array_jobs"])  # 189_2, or 189_[2%1] pending
    job, _, task_ids = ref.partition("_")
    assert (job, parse_index_ranges(task_ids)) == (again["array_jobs"][0], [2])
    wait_done(slurm_cluster, again["array_jobs"])
    rows = results(slurm_cluster, str(sweep_dir))
    assert [r["state"] for r in rows] == ["finished"] * 3
    assert [r["job_id"].split("_")[0] for r in rows] == [submitted["array_jobs"][0]] * 2 + [
        again["array_jobs"][0]
    ]
    lines = (sweep_dir / "task_configs.jsonl").read_text().splitlines()
    packed = [json.loads(line)["config"] for line in lines]
    assert config.read_text() == packed[2]


def _states(cluster: Cluster, target: Path) -> list[str]:
    [entry] = json.loads(hpc(cluster, "status", str(target), "--json").stdout)["sweeps"]
    return [task["state"] for task in entry["tasks"]]


def test_tasks_that_have_not_started_read_as_pending_and_cancelled_never_missing(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    submitted = submit_lr_sweep(
        slurm_cluster, tmp_path, "", "slurm.extra.hold=null", "train.max_steps=3"
    )
    sweep_dir = Path(submitted["sweep_dir"])
    [array] = submitted["array_jobs"]
    jobs = [array]
    try:
        task1 = sweep_dir / "tasks" / "1"
        assert list((sweep_dir / "tasks").iterdir()) == []  # held: no task has started
        assert _states(slurm_cluster, sweep_dir) == ["pending"] * 3
        assert _states(slurm_cluster, task1) == ["pending"]  # by a directory not made yet
        rows = results(slurm_cluster, str(sweep_dir))
        assert [(r["state"], r["best"], r["steps"], r["attempts"]) for r in rows] == [
            ("pending", None, None, 0)
        ] * 3
        for args in (["logs", str(sweep_dir), "--task", "1"], ["logs", str(task1)]):
            shown = hpc(slurm_cluster, *args, check=False)
            assert shown.returncode == 1
            assert "sweep task 1 has not started yet" in shown.stderr
            assert "Traceback" not in shown.stderr
        rank = hpc(slurm_cluster, "logs", str(sweep_dir), "--task", "1", "--rank", "2", check=False)
        assert "(the run has 2 ranks: 0-1)" in rank.stderr  # read from task_configs.jsonl
        whole = hpc(slurm_cluster, "logs", str(sweep_dir), check=False)
        assert "is a sweep directory with tasks 0-2. HINT" in whole.stderr
        job = Job.from_run_dir(task1)
        assert (job.job_id, job.index) == (f"{array}_1", 1)
        assert job.status().state == "pending"
        assert job.metrics() == []
        with pytest.raises(RunDirError, match="has not started yet"):
            job.logs()
        assert [t.status().state for t in Sweep.from_dir(sweep_dir).tasks()] == ["pending"] * 3

        # Cancelled while pending: the tasks ended without ever starting.
        cancelled = hpc(slurm_cluster, "cancel", str(sweep_dir / "tasks" / "2"))
        assert f"cancelled slurm array task {array}_2" in cancelled.stdout
        hpc(slurm_cluster, "cancel", str(sweep_dir))
        slurm_cluster.wait_gone(array)
        # squeue keeps no row for a pending task cancelled alone (Slurm 22.05 splits it off
        # its array and drops it): no ledger and no row reads as failed, as it always has.
        assert _states(slurm_cluster, sweep_dir) == ["cancelled", "cancelled", "failed"]
        assert not task1.exists()
        again = json.loads(
            hpc(slurm_cluster, "sweep", "--resubmit-failed", str(sweep_dir), "--json").stdout
        )
        assert again["resubmitted"] == [0, 1, 2]  # configs read from task_configs.jsonl
        [second] = again["array_jobs"]
        jobs.append(second)
        # The configs keep slurm.extra.hold: let task 1 alone run, and write its config.
        slurm_cluster.run("scontrol", "release", f"{second}_1")
        wait_for_task(slurm_cluster, second, 1)
        lines = (sweep_dir / "task_configs.jsonl").read_text().splitlines()
        assert (task1 / "config.yaml").read_text() == json.loads(lines[1])["config"]
        assert _states(slurm_cluster, sweep_dir) == ["pending", "finished", "pending"]
        assert sorted(p.name for p in (sweep_dir / "tasks").iterdir()) == ["1"]
    finally:
        slurm_cluster.run("scancel", *jobs, check=False)


def wait_for_task(cluster: Cluster, job: str, task: int, timeout_s: float = 300.0) -> None:
    """Wait until array task ``task`` of ``job`` has finished (the others may stay pending)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = dict(tasks(cluster, [job]))
        if states.get(f"{job}_{task}") not in (None, *ACTIVE):
            return
        time.sleep(0.5)
    raise AssertionError(f"{job}_{task} not finished after {timeout_s} s: {tasks(cluster, [job])}")


def test_a_sweeps_array_leaves_a_lemon_node_out(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A node an earlier run lost is left out of the sweep's array (``ExcNodeList``), as out of
    a submitted job, while the partition keeps each point's nodes besides it; its task runs on
    the other node."""
    lost = LemonEntry("n1", "lost", "node_fail", "srun: Node failure on n1", "earlier",
                      str(tmp_path / "earlier"), "7", time.time() - 60)  # fmt: skip
    add_entry(where(), lost)  # the test's own record (conftest), read by the sweep
    one_node = ("slurm.nodes=1", "slurm.extra.hold=null", "train.max_steps=3")
    sweep = tmp_path / "sweep.yaml"
    submitted = submit_lr_sweep(slurm_cluster, tmp_path, "", *one_node)
    [array] = submitted["array_jobs"]
    try:
        shown = hpc(slurm_cluster, "sweep", str(sweep), *one_node, "--dry-run").stdout
        assert "# lemon node n1: excluding (lost in run earlier (job 7)" in shown
        fields = job_fields(slurm_cluster, array)
        assert fields["ExcNodeList"] == "n1", fields
        slurm_cluster.run("scontrol", "release", f"{array}_0")
        wait_for_task(slurm_cluster, array, 0)
        out = slurm_cluster.run(
            "squeue", "-h", "-t", "all", "-j", f"{array}_0", "-o", "%T %N"
        ).stdout
        assert out.split() == ["COMPLETED", "n2"]
    finally:
        slurm_cluster.run("scancel", array, check=False)
