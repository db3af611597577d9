"""Faults on the real dev cluster: a hung rank, a dead rank, a crash loop, a lost node.

Each run is the built-in trainer on a small MLP whose data loads at a wall-clock pace
(:func:`tests.e2e_util.io_bound_synthetic`), 2 ranks on 2 nodes, a checkpoint every 10 steps,
the fault injected at step 20 of the first launch. The timeouts are short (beat 0.5 s, stale
3 s) to keep the tests quick; the defaults are measured by ``benchmarks/bench_faults.py``.
Every faulted run must end with the weights of an uninterrupted twin (same config, no fault):
on CPU with gloo and an unchanged world size that is bit for bit.

Node loss needs three nodes: it runs on the accounting cluster (n1..n3, ``SlurmdTimeout=5``),
kills the slurmd, step daemons and rank of rank 1's node, and brings the node back afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.backends.local.process import live_ranks
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.exitcodes import NO_PROGRESS_EXIT_CODE
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 60
FAULT_AT = 20
JOB = f"""name: faults
slurm: {{nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:10:00'}}
env: {{vars: {{OMP_NUM_THREADS: "1"}}}}
dist: {{timeout_s: 60}}
train: {{model: mlp, dataset: "tests.e2e_util:io_bound_synthetic", max_steps: {STEPS},
        checkpoint_every: 10, log_every: 5, batch_size: 32, synthetic_samples: 4096,
        eval_every: 0}}
fault: {{beat_s: 0.5, stale_s: 3, startup_timeout_s: 120, step_timeout_s: 10}}
"""


def job_file(directory: Path, extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "faults.yaml"
    path.write_text(JOB + extra)
    return path


@pytest.fixture(scope="module")
def twin(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """(step, weights digest) of the same job never interrupted."""
    tmp = tmp_path_factory.mktemp("twin")
    job = e2e.submit(slurm_cluster, tmp / "runs", str(job_file(tmp)))
    assert e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    return e2e.final_digest(slurm_cluster, job.run_dir)


def _task_pid(job_id: str, rank: int) -> int:
    pids = e2e.wait_for(
        f"rank {rank} of job {job_id}", lambda: e2e.rank_pids(job_id, rank, launch=0)
    )
    return int(pids[-1])


def _inject(cluster: Cluster, job: e2e.Submitted, sig: signal.Signals) -> float:
    """Send ``sig`` to rank 1's process of the first launch once the step-FAULT_AT checkpoint
    is whole (so the next launch resumes from it); when."""
    e2e.wait_checkpoint(job.run_dir, FAULT_AT, timeout_s=120)
    pid = _task_pid(job.job_id, 1)
    sent = time.time()
    os.kill(pid, sig)
    return sent


def _launches(run_dir: Path) -> list[Attempt]:
    return e2e.ledger(run_dir)


def _rescued(faulted: Attempt, again: Attempt) -> None:
    """The survivor (rank 0) saved the last step every rank completed, at or after the periodic
    checkpoint the fault came after, and the next launch went on from exactly that step."""
    assert faulted.rescue is not None, faulted
    assert faulted.rescue.rank == 0, faulted.rescue
    assert faulted.rescue.step is not None, faulted.rescue
    assert faulted.rescue.step >= FAULT_AT, faulted.rescue
    assert faulted.rescue.checkpoint == f"step-{faulted.rescue.step:08d}.pt", faulted.rescue
    assert again.resumed_from_step == faulted.rescue.step


def _batch_logs(run_dir: Path) -> str:
    """The batch scripts' stderr (the supervisors' word on each attempt), for a failure's
    message."""
    logs = sorted((run_dir / "logs").glob("batch-*.err"))
    return "\n".join(f"== {log}\n{log.read_text()[-4000:]}" for log in logs)


def test_a_hung_rank_is_found_in_seconds_named_and_restarted_to_the_twins_weights(
    slurm_cluster: Cluster, tmp_path: Path, twin: tuple[int, str]
) -> None:
    """SIGSTOP of rank 1 (on n2): found within stale_s (not after dist.timeout_s), named as
    rank 1 on n2 (not rank 0, which waited for it), its stacks in its log; the launch ends,
    every rank of it, and a new srun step in the same allocation resumes from the step-20
    checkpoint to the twin's weights."""
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file(tmp_path)))
    stopped = _inject(slurm_cluster, job, signal.SIGSTOP)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields  # no requeue
    hung, again = _launches(job.run_dir)
    assert (hung.cause, hung.launch, hung.next) == (EndCause.HANG, 0, "restart")
    assert hung.blame is not None
    assert (hung.blame.ranks, hung.blame.nodes) == ((1,), ("n2",))
    assert hung.blame.detected_at is not None
    assert 2.0 < hung.blame.detected_at - stopped < 30.0  # stale_s 3 s; gloo would take 60
    assert hung.launch_ended is not None
    assert hung.launch_ended - stopped < 40.0
    assert (again.launch, again.restart) == (1, 0)
    _rescued(hung, again)
    assert again.cause is EndCause.FINISHED
    rank1 = (job.run_dir / "logs" / "rank-1.err").read_text(errors="replace")
    # Its log: where its main thread stood (the program's part), none of hpc-ddp's threads;
    # every thread, the watchdog's too, in hpc-ddp's stacks file of the launch.
    assert "hpc-ddp watchdog: rank 1's main thread when the launch ended (hang)" in rank1
    assert "Thread 0x" not in rank1
    [stacks] = (job.run_dir / "launches").glob("*.0.0/rank-1.stacks")
    assert "watchdog.py" in stacks.read_text(errors="replace")
    assert e2e.final_digest(slurm_cluster, job.run_dir) == twin
    row = json.loads(
        e2e.hpc(slurm_cluster, "status", str(job.run_dir), "--json", "--goodput").stdout
    )["runs"][0]
    assert (row["state"], row["causes"]) == ("COMPLETED", ["hang", "finished"])
    assert row["attempt_list"][0]["blame"].startswith("rank 1 on n2: heartbeat stopped")
    goodput = row["goodput"]
    parts = [goodput[f"{p}_s"] for p in ("productive", "startup", "checkpoint_stall", "redone",
             "hang_undetected", "recovery", "requeue_wait", "other")]  # fmt: skip
    assert sum(parts) == pytest.approx(goodput["wall_s"])
    assert goodput["hang_undetected_s"] > 2.0
    assert goodput["requeue_wait_s"] == 0.0
    assert goodput["redone_steps"] == 0  # the survivor's save: no step trained twice
    assert 0.0 < goodput["ettr"] < 1.0
    # `status --attempts`: one row per launch, the same Slurm attempt (restart 0), launches 0
    # and 1; what followed the hang, and nothing after the finished one.
    table = e2e.hpc(slurm_cluster, "status", str(job.run_dir), "--attempts").stdout
    header, _, hung_row, done_row = table.splitlines()[-4:]
    assert header.split()[:7] == ["attempt", "job", "restart", "launch", "nodes", "ranks", "cause"]
    assert hung_row.split()[2:7] == ["0", "0", "n1,n2", "2", "hang"]
    assert hung_row.split()[9:11] == ["restart", "rank"]  # then, why
    assert "rank 1 on n2: heartbeat stopped" in hung_row
    assert done_row.split()[2:7] == ["0", "1", "n1,n2", "2", "finished"]
    assert done_row.rstrip().endswith(".pt")  # no `then`, no `why`


def test_a_killed_rank_is_named_not_its_survivor_and_restarted_to_the_twins_weights(
    slurm_cluster: Cluster, tmp_path: Path, twin: tuple[int, str]
) -> None:
    """SIGKILL of rank 1: rank 0 dies of "connection reset by peer" a moment later and writes
    the first end in the ledger, but the launch is blamed on rank 1 on n2, killed; it is
    restarted in the allocation, at once."""
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file(tmp_path)))
    killed = _inject(slurm_cluster, job, signal.SIGKILL)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    dead, again = _launches(job.run_dir)
    assert (dead.cause, dead.next) == (EndCause.CRASH, "restart")
    assert dead.blame is not None
    assert (dead.blame.ranks, dead.blame.nodes) == ((1,), ("n2",))
    assert "Killed" in dead.blame.evidence
    assert dead.blame.detected_at is not None
    assert dead.blame.detected_at - killed < 10.0
    assert again.launched_at is not None
    assert again.launched_at - killed < 20.0
    _rescued(dead, again)
    assert e2e.final_digest(slurm_cluster, job.run_dir) == twin


def test_a_crash_loop_stops_with_no_progress_and_submit_wait_names_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 1 raises at the start of step 8 in every launch (a bug, not a node): launch 0's
    survivor saves step 7, the launch from it dies at step 8 again, and the supervisor stops
    with no_progress (exit 6) before spending the rest of fault.max_restarts: the error, the
    step, what to fix, how to go on, in the ledger, in `status` and in what `submit --wait`
    prints."""
    config = e2e.crashy_job(
        tmp_path, 30, 5, 8, on_crash=False, how="early", fault="{max_restarts: 5}"
    )
    done = e2e.hpc(
        slurm_cluster, "submit", str(config), "--runs-dir", str(tmp_path / "runs"), "--wait",
        check=False, timeout_s=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    causes = [(a.launch, a.cause, a.next) for a in e2e.ledger(run_dir)]
    # Launch 0's survivor saved step 7 (progress), launches 1 and 2 saved nothing newer: the
    # limit of 2 is reached.
    assert causes == [
        (0, EndCause.CRASH, "restart"),
        (1, EndCause.CRASH, "restart"),
        (2, EndCause.NO_PROGRESS, "stop"),
    ]
    last = e2e.ledger(run_dir)[-1]
    assert last.message is not None
    assert "2 launches in a row died at step 8 without a checkpoint newer than step 7" in (
        last.message
    )
    assert "rank 1 on n2: RuntimeError: injected crash at step 8" in last.message
    assert f"`hpc-ddp resume {run_dir}` goes on from step 7" in last.message
    reason = f"{run_dir}: failed first: no_progress: rank 1 on n2: RuntimeError: injected crash"
    assert any(line.startswith(reason) for line in done.stderr.splitlines()), done.stderr
    job_id = json.loads((run_dir / "manifest.json").read_text())["job_id"]
    fields = e2e.job_fields(slurm_cluster, job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", f"{NO_PROGRESS_EXIT_CODE}:0")
    assert fields["Restarts"] == "0"  # never requeued


# --- a lost node (3 nodes) --------------------------------------------------------------------


_KILLED: list[str] = []
"""Nodes a test took away, to bring back after it."""


def test_ranks_stuck_before_their_watchdog_are_ended_after_the_startup_timeout(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Ranks that never beat (stuck at interpreter start, before hpc-ddp's watchdog exists:
    here a sitecustomize that sleeps) were waited for until the job's time limit. The supervisor
    ends the launch after fault.startup_timeout_s, names the ranks that never beat, and after
    fault.no_progress_limit such launches stops the crash loop."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('HPC_DDP_LAUNCH') is not None:\n    time.sleep(600)\n"
    )
    config = tmp_path / "stuck.yaml"
    config.write_text(
        f"name: stuck\ncommand: [python3, -c, pass]\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        f"env: {{vars: {{PYTHONPATH: {site}}}}}\n"
        "dist: {timeout_s: 1}\nfault: {beat_s: 0.5, startup_timeout_s: 3}\n"
    )
    began = time.monotonic()
    try:
        done = e2e.hpc(
            slurm_cluster, "submit", str(config), "--runs-dir", str(tmp_path / "runs"), "--wait",
            check=False, timeout_s=240,
        )  # fmt: skip
    finally:  # a job left waiting for its stuck ranks holds two nodes until its time limit
        for run in (tmp_path / "runs").glob("stuck-*"):
            e2e.hpc(slurm_cluster, "cancel", str(run), check=False)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - began < 120  # not the 5-minute time limit
    [run_dir] = (tmp_path / "runs").iterdir()
    launches = e2e.ledger(run_dir)
    assert [(a.launch, a.cause, a.next) for a in launches] == [
        (0, EndCause.HANG, "restart"),
        (1, EndCause.NO_PROGRESS, "stop"),
    ]
    blame = launches[0].blame
    assert blame is not None
    assert blame.ranks == (0, 1)
    assert "never started within fault.startup_timeout_s=3 s" in blame.evidence


@pytest.fixture
def three_nodes(accounting_cluster: Cluster) -> Iterator[Cluster]:
    """The 3-node cluster; a node a test killed is brought back after it, whatever happened.
    A surviving node may be drained meanwhile: the job's step on it, cut off from the lost
    node, did not end in Slurm's time ("Kill task failed", once in the last 8 suite runs, after its
    rank had exited); it is resumed with the revived node, as the next test would resume it."""
    yield accounting_cluster
    while _KILLED:
        node = _KILLED.pop()
        devcluster.revive_node(
            accounting_cluster.state_dir, node, accounting_cluster.env, 120, resume_drained=True
        )


def _lose_rank_1s_node(cluster: Cluster, job: e2e.Submitted) -> tuple[float, str, list[str]]:
    """Kill the node rank 1 runs on once the step-FAULT_AT checkpoint is whole: (when, that
    node, the job's others)."""
    e2e.wait_checkpoint(job.run_dir, FAULT_AT, timeout_s=120)
    nodes = e2e.ledger(job.run_dir)[0].nodelist.split(",")
    node = nodes[1]
    lost = time.time()
    _KILLED.append(node)
    devcluster.kill_node(cluster.state_dir, node)
    others = [n for n in ("n1", "n2", "n3") if n != node]
    return lost, node, others


def test_a_lost_node_is_replaced_by_a_spare_in_the_allocation(
    three_nodes: Cluster, tmp_path: Path, twin: tuple[int, str]
) -> None:
    """slurm.spare_nodes: 1 allocates n1..n3 and trains on n1, n2. n2 dies (its slurmd, step
    daemons and rank): the launch ends as node_fail on n2 within seconds, long before Slurm
    notices the node, and the next launch runs on n1, n3 at the same world size, with the
    twin's weights. No requeue."""
    config = job_file(tmp_path, "")
    config.write_text(config.read_text().replace("nodes: 2,", "nodes: 2, spare_nodes: 1,"))
    job = e2e.submit(three_nodes, tmp_path / "runs", str(config))
    lost, node, others = _lose_rank_1s_node(three_nodes, job)
    fields = e2e.wait_done(three_nodes, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    gone, again = _launches(job.run_dir)
    assert (gone.cause, gone.next) == (EndCause.NODE_FAIL, "restart")
    assert gone.blame is not None
    assert (gone.blame.ranks, gone.blame.nodes, gone.blame.node_level) == ((1,), (node,), True)
    assert gone.blame.detected_at is not None
    assert gone.blame.detected_at - lost < 15.0
    assert again.nodelist == ",".join(others)
    _rescued(gone, again)
    bad = json.loads((job.run_dir / "launches" / "bad_nodes.json").read_text())
    assert list(bad["nodes"]) == [node]
    # Its processes were started on n1 and the spare once the loss was found, while the
    # survivor saved, and called: the restart never waits for a cold start after the save.
    batch = e2e.batch_log(job.run_dir, job.job_id)
    assert "launch 1's processes started now, for the restart" in batch, batch[-3000:]
    assert "launch 1: its standby processes called" in batch, batch[-3000:]
    rank1 = (job.run_dir / "logs" / "rank-1.err").read_text(errors="replace")
    starts = re.findall(r"start-up [\d.]+ s from (\w+) to the end of the first step", rank1)
    assert starts == ["process", "call"], starts
    assert e2e.final_digest(three_nodes, job.run_dir) == twin


def test_a_lost_node_without_spares_requeues_the_job_away_from_it(
    three_nodes: Cluster, tmp_path: Path, twin: tuple[int, str]
) -> None:
    """Without spares, too few healthy nodes are left: the supervisor requeues the job and
    asks Slurm to avoid n2 (ExcNodeList); the next attempt runs on n1, n3."""
    job = e2e.submit(three_nodes, tmp_path / "runs", str(job_file(tmp_path)))
    _, node, others = _lose_rank_1s_node(three_nodes, job)
    fields = e2e.wait_done(three_nodes, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), fields
    assert fields["ExcNodeList"] == node, _batch_logs(job.run_dir)
    gone, again = _launches(job.run_dir)
    assert (gone.cause, gone.next, gone.requeue_requested) == (EndCause.NODE_FAIL, "requeue", True)
    assert again.restart == 1
    assert again.cause is EndCause.FINISHED
    assert sorted(again.nodelist.split(",")) == others
    assert e2e.final_digest(three_nodes, job.run_dir) == twin


# --- the local backend ------------------------------------------------------------------------


def test_a_hung_local_rank_is_restarted_in_its_own_process_tree(
    slurm_cluster: Cluster, tmp_path: Path, twin: tuple[int, str]
) -> None:
    """The same restart without Slurm: the supervisor (the local controller's task) ends the
    frozen launch and starts the ranks again, to the twin's weights."""
    env = {k: v for k, v in slurm_cluster.env.items() if not k.startswith("SLURM")}
    runs = tmp_path / "runs"
    waiting = subprocess.Popen(
        [*e2e.HPC_DDP, "submit", str(job_file(tmp_path)), "--backend", "local", "--wait",
         "--runs-dir", str(runs)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_dir = e2e.wait_for("the run directory", lambda: next(runs.glob("faults-*"), None))
        e2e.wait_checkpoint(run_dir, FAULT_AT, timeout_s=120)
        rank1 = e2e.wait_for("rank 1", lambda: live_ranks(run_dir).get(1))
        os.kill(rank1.pid, signal.SIGSTOP)
        _, err = waiting.communicate(timeout=300)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err[-3000:]
    hung, again = e2e.ledger(run_dir)
    assert (hung.cause, hung.next, again.cause) == (EndCause.HANG, "restart", EndCause.FINISHED)
    assert hung.blame is not None
    assert hung.blame.ranks == (1,)
    assert e2e.final_digest(slurm_cluster, run_dir) == twin
