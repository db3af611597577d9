"""hpc-ddp in a real container: ``env.container.runtime: charliecloud`` on the real two-node dev
cluster, each task started by the real ``ch-run`` in a Charliecloud directory image (Debian,
its own Python 3.11, the CPU build of torch 2.13.0, hpc-ddp installed from this checkout):
nothing of the host's interpreter is bound in.

One run goes through what a run goes through on a cluster, every attempt inside the image:

1. ``scontrol requeue`` from outside: the tasks stop, save and come back from the checkpoint;
2. the time-limit warning (``--signal``, sent here with ``scancel --signal=USR2``): the image
   has no ``scontrol`` (Debian's slurm-client is not in it, as in most images), so the requeue
   request fails: the job ends FAILED, exit 4, the ledger says ``requeue_failed`` and the log
   says what to run instead, as the README promises;
3. ``hpc-ddp resume`` after that, then ``hpc-ddp cancel``, then ``hpc-ddp resume`` again: the
   run finishes.

Its final weights equal those of the same job run once, uninterrupted, on the host (torch
2.14.1): this small MLP on synthetic data needs no torchvision, and the same steps give the
same weights on both builds.

The image is built once into the dev cluster's state directory and cached there, keyed by its
inputs (:mod:`hpc_ddp.devcluster.image`): about two minutes the first time on this machine, a
few seconds when only hpc-ddp's sources changed, nothing when none did.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster import image as devimage
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.exitcodes import REQUEUE_FAILED_EXIT_CODE
from tests import e2e_util as e2e
from tests.conftest import IN_CI, Cluster

# One worker runs both tests: the image is checked (or built) once.
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.xdist_group("charliecloud-image"),
]

STEPS = 40

# The training data, read as if from a slow file system (each sample waits): steps take about
# 0.1 s whatever the load on the cores, so no phase of the run can finish before the test has
# interrupted it. It lives in the directory jobs are submitted from, which every task starts in
# (ch-run --cd), inside the image and on the host alike.
_PACED = """
import time

from hpc_ddp.train.data import SyntheticImages


class _Paced:
    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        time.sleep(0.006)
        return self.inner[index]


def synthetic(cfg, train):
    n = cfg.synthetic_samples if train else max(1, cfg.synthetic_samples // 8)
    return _Paced(SyntheticImages(n, cfg.num_classes, cfg.image_size, cfg.seed, train=train))
"""


@pytest.fixture(scope="module")
def image(slurm_cluster: Cluster) -> Path:
    """The image, built into the developer's dev cluster state dir (about 2 min the first time
    on this machine, then cached: only a changed source file rebuilds its top layer, in
    seconds). One cache for every xdist worker's cluster: the build locks it."""
    try:
        return devimage.build(devcluster.state_dir_from(os.environ), os.environ).path
    except HpcDdpError as exc:
        if IN_CI:
            pytest.fail(f"CI=true and the Charliecloud image cannot be built: {exc}")
        pytest.skip(f"Charliecloud image unavailable: {exc}")


def _config(path: Path, container: str) -> str:
    path.write_text(
        f"name: {path.stem}\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        "env:\n"
        '  vars: {OMP_NUM_THREADS: "1"}\n'
        f"{container}"
        f"train: {{epochs: null, max_steps: {STEPS}, synthetic_samples: 512, batch_size: 16,"
        " dataset: 'paced:synthetic', checkpoint_every: 0, log_every: 1}\n"
    )
    return path.name


def _hpc(cluster: Cluster, cwd: Path, *args: str) -> dict[str, Any]:
    """``hpc-ddp ARGS --json`` from ``cwd``, the directory the jobs are submitted from."""
    done = subprocess.run(
        [*e2e.HPC_DDP, *args, "--json"],
        cwd=cwd, env=cluster.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"hpc-ddp {' '.join(args)}: {done.stdout}{done.stderr}"
    out: Any = json.loads(done.stdout)
    row: dict[str, Any] = out["runs"][0] if "runs" in out else out
    return row


def _torch_version(checkpoint: Path) -> str:
    import torch

    meta = torch.load(checkpoint, map_location="cpu", weights_only=True)["meta"]
    return str(meta["torch_version"])


def _in_image(image: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"USER": "root", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(
        ["ch-run", str(image), "--", *argv], env=env, capture_output=True, text=True, check=False
    )


def _requeue_failed(cluster: Cluster, work: Path, run_dir: Path, job: str) -> int:
    """What a job whose requeue request found no ``scontrol`` leaves: the job FAILED with exit
    4, the ledger's ``requeue_failed``, and what to run instead in rank 0's log and in
    ``status``. Returns the step it stopped at."""
    fields = e2e.wait_done(cluster, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", f"{REQUEUE_FAILED_EXIT_CODE}:0")
    failed = e2e.ledger(run_dir)[-1]
    assert failed.cause is not None
    assert failed.cause.value == "requeue_failed"
    assert failed.requeue_requested is False  # asked, and refused: no scontrol to ask with
    assert failed.steps_done is not None
    rank0 = (run_dir / "logs" / "rank-0.err").read_text()
    assert "'scontrol' is not on PATH" in rank0
    assert f"run `scontrol requeue {job}` where Slurm's commands work" in rank0
    assert f"`hpc-ddp resume {run_dir}` goes on from it" in rank0
    row = _hpc(cluster, work, "status", str(run_dir))
    assert (row["state"], row["causes"]) == ("FAILED", ["unknown", "requeue_failed"]), row
    return failed.steps_done


def test_the_image_has_no_scontrol(image: Path) -> None:
    """What the run below relies on: inside the image, Slurm's commands are missing."""
    found = _in_image(image, "/bin/sh", "-c", "command -v scontrol sbatch; echo done")
    assert found.stdout == "done\n", found


def test_a_two_node_run_in_the_image_survives_requeue_failed_requeue_cancel_and_resume(
    slurm_cluster: Cluster, image: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"  # under /tmp, which ch-run shows by itself: no binds needed
    work.mkdir()
    (work / "paced.py").write_text(_PACED)
    container = (
        f"  container: {{runtime: charliecloud, image: {image}, python: {devimage.IMAGE_PYTHON}}}\n"
    )
    inside = _config(work / "in-image.yaml", container)
    outside = _config(work / "on-host.yaml", "")
    runs = str(tmp_path / "runs")
    job = _hpc(slurm_cluster, work, "submit", inside, "--runs-dir", runs)
    host = _hpc(slurm_cluster, work, "submit", outside, "--runs-dir", runs)
    run_dir, first = Path(job["run_dir"]), str(job["job_id"])
    script = (run_dir / "job.sbatch").read_text()
    assert 'ch-run --cd="$PWD" --unset-env=PYTHONPATH' in script
    # fault.enabled (the default): the supervisor runs on the batch host, outside the image,
    # with the interpreter that submitted (it runs srun, which the image does not have).
    assert f"exec {e2e.HPC_DDP[0]} -m hpc_ddp supervise {run_dir} --" in script

    # 1. Slurm requeues the job: the tasks save, and the next attempt resumes in the image.
    e2e.wait_step(run_dir, 4)
    slurm_cluster.run("scontrol", "requeue", first)
    e2e.wait_attempt(run_dir, 1, release=(slurm_cluster, first))
    resumed = e2e.ledger(run_dir)[-1].resumed_from_step
    assert resumed is not None
    assert resumed >= 4
    e2e.wait_step(run_dir, resumed + 3, release=(slurm_cluster, first))

    # 2. The time-limit warning: no scontrol in the image, so the requeue request fails.
    e2e.signal_job(slurm_cluster, first, "USR2")
    stopped_at = _requeue_failed(slurm_cluster, work, run_dir, first)

    # 3. Resume, cancel, resume: every job of the run starts in the image.
    second = str(_hpc(slurm_cluster, work, "resume", str(run_dir))["job_id"])
    e2e.wait_step(run_dir, stopped_at + 3)
    _hpc(slurm_cluster, work, "cancel", str(run_dir))
    assert e2e.wait_done(slurm_cluster, second)["JobState"] == "CANCELLED"
    third = str(_hpc(slurm_cluster, work, "resume", str(run_dir))["job_id"])
    assert e2e.wait_done(slurm_cluster, third)["JobState"] == "COMPLETED"
    assert e2e.wait_done(slurm_cluster, str(host["job_id"]))["JobState"] == "COMPLETED"

    row = _hpc(slurm_cluster, work, "status", str(run_dir))
    assert (row["state"], row["job_id"]) == ("COMPLETED", third)
    assert (
        "supervisor: launch 0 (2 node(s)); newest committed checkpoint when relaunching: step"
    ) in e2e.batch_log(run_dir, third)
    attempts = e2e.ledger(run_dir)
    assert [a.job_id for a in attempts] == [first, first, second, third]
    assert all(a.world_size == 2 for a in attempts)
    assert attempts[-1].steps_done == STEPS
    newest = run_dir / "checkpoints" / f"step-{STEPS:08d}.pt"
    assert _torch_version(newest) == "2.13.0+cpu"  # the image's torch, not the host's
    host_dir = Path(host["run_dir"])
    assert not _torch_version(host_dir / "checkpoints" / f"step-{STEPS:08d}.pt").startswith("2.13.")
    assert e2e.final_digest(slurm_cluster, run_dir) == e2e.final_digest(slurm_cluster, host_dir)
