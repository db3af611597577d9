"""GPU jobs on a real Slurm whose nodes advertise fake GPUs (GRES ``gpu:2`` per node, backed by
dummy devices): what each task is given, and what hpc-ddp's runtime makes of it.

A dev cluster of its own, beside the default one (``hpc-ddp dev-cluster up --gpus-per-node 2``
in the default state dir's name + ``-gpu``, see ``tests.conftest.state_dir_for``). Slurm sets
``CUDA_VISIBLE_DEVICES`` and its GPU variables per task exactly as on a GPU cluster; no CUDA
runs here, so the runtime's choices are checked with the count of GPUs each task was given (the
pure functions torch's calls feed).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster, bring_up, state_dir_for

# One worker runs them all: one more cluster per run, not one per worker.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("gpu-cluster")]

REPORT = str(REPO / "tests" / "helpers" / "report_gpus.py")


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[Cluster]:
    """Two nodes with two fake GPUs each, in its own state dir, ports and job ids; taken down
    at the end unless it already ran."""
    state_dir = state_dir_for("gpu")
    spec = devcluster.resolve_spec(state_dir, nodes=2, gpus_per_node=2, accounting=False)
    was_running = devcluster.pid_alive(devcluster.layout_for(state_dir, spec).ctld_pid) is not None
    hosts_before = devcluster.HOSTS_FILE.read_text()
    result = bring_up(state_dir, spec)
    env = {
        **os.environ,
        "SLURM_CONF": str(result.conf),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
    }
    cluster = Cluster(state_dir, result.conf, env, hosts_before)
    yield cluster
    cluster.run("scancel", "--user=root", check=False)
    if not was_running:
        devcluster.down(state_dir)


def srun_reports(cluster: Cluster, *options: str) -> list[dict[str, Any]]:
    """Each task's report (``tests/helpers/report_gpus.py``) of ``srun -N1 -n2 OPTIONS``."""
    done = cluster.run(
        "srun", "-N1", "-n2", "--time=1", *options, sys.executable, REPORT, check=False
    )
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    return sorted(reports, key=lambda r: int(r["rank"]))


def test_each_task_computes_on_a_gpu_of_its_own_from_what_slurm_gave_it(
    gpu_cluster: Cluster,
) -> None:
    # --gpus-per-task=1: each task is bound to its own GPU, which it sees as cuda:0 (a bare
    # srun sets no SLURM_GPUS_PER_TASK: the runtime tells from SLURM_GPUS_ON_NODE).
    own = srun_reports(gpu_cluster, "--gpus-per-task=1")
    assert sorted(r["visible"] for r in own) == ["0", "1"]
    assert [(r["asked"], r["own"], r["device"]) for r in own] == [(True, 1, "cuda:0")] * 2
    # --gpus-per-node=2: both tasks see both GPUs and take one each.
    shared = srun_reports(gpu_cluster, "--gpus-per-node=2")
    assert [(r["visible"], r["own"], r["device"]) for r in shared] == [
        ("0,1", None, "cuda:0"),
        ("0,1", None, "cuda:1"),
    ]
    # --gres=gpu:1 for two tasks: one GPU that both see; NCCL would fail with "Duplicate GPU".
    one = srun_reports(gpu_cluster, "--gres=gpu:1")
    for r in one:
        assert r["visible"] == "0"
        assert r["device"].startswith("refused: 2 ranks on this node share 1 visible GPU(s)")
        assert "HINT: one rank per GPU" in r["device"]
    # No GPUs asked on a node that has them: Slurm sets none of its GPU variables, so the
    # runtime knows the job asked for none (and leaves visible GPUs alone).
    none = srun_reports(gpu_cluster)
    assert [(r["slurm"], r["visible"], r["asked"], r["device"]) for r in none] == [
        ({}, None, False, "cpu")
    ] * 2


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("slurm.gpus_per_task=1", [(["0"], "cuda:0"), (["1"], "cuda:0")]),
        ("slurm.gpus_per_node=2", [(["0", "1"], "cuda:0"), (["0", "1"], "cuda:1")]),
    ],
)
def test_a_submitted_gpu_job_gives_each_rank_its_gpus(
    gpu_cluster: Cluster, tmp_path: Path, gpus: str, expected: list[tuple[list[str], str]]
) -> None:
    """The rendered script's srun step keeps sbatch's GPU binding: each rank of a real
    ``hpc-ddp submit`` job sees the GPUs the config asks for."""
    job = e2e.submit(
        gpu_cluster, tmp_path, "jobs/quickstart.yaml", "slurm.nodes=1", "slurm.tasks_per_node=2",
        gpus, "entrypoint=tests.helpers.report_gpus:main",
    )  # fmt: skip
    e2e.wait_done(gpu_cluster, job.job_id)
    seen = []
    for rank in (0, 1):
        path = job.run_dir / f"gpus-rank{rank}.json"
        assert path.is_file(), (job.run_dir / "logs" / f"rank-{rank}.err").read_text()[-2000:]
        r = json.loads(path.read_text())
        seen.append((sorted(r["visible"].split(",")), r["device"]))
    assert sorted(seen) == sorted(expected)


def test_the_trainer_given_gpus_torch_cannot_use_stops_with_a_hint(
    gpu_cluster: Cluster, tmp_path: Path
) -> None:
    """Slurm gave the tasks (fake) GPUs, and torch finds none: the job fails at start with the
    reason, instead of training on the CPU of a GPU allocation."""
    job = e2e.submit(
        gpu_cluster, tmp_path, "jobs/quickstart.yaml", "slurm.nodes=1", "slurm.tasks_per_node=1",
        "slurm.gpus_per_task=1", "train.max_steps=2",
    )  # fmt: skip
    fields = e2e.wait_done(gpu_cluster, job.job_id)
    assert fields["JobState"] == "FAILED"
    err = (job.run_dir / "logs" / "rank-0.err").read_text()
    assert "the job gave this task GPUs (SLURM_" in err
    assert "HINT: " in err
    assert "or leave out slurm.gpus_per_task and slurm.gpus_per_node to train on CPUs" in err
