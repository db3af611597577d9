"""hpc-ddp in a real container: a Charliecloud directory image (Debian, its own Python 3.11, the
CPU build of torch 2.13.0, hpc-ddp installed from this checkout), started once per task by
``srun ... ch-run IMAGE -- python -m hpc_ddp run RUN_DIR`` on the real two-node dev cluster.

The config has no ``charliecloud`` runtime yet, so the job goes through ``env.container``'s
apptainer runtime with an ``apptainer`` on its PATH that turns ``apptainer exec [--bind B]
IMAGE CMD...`` into :func:`~hpc_ddp.devcluster.image.ch_run_prefix` + ``CMD...``: everything
after that is real (ch-run, the image's interpreter and torch, gloo across both nodes).

The same job on the host (torch 2.14.1) ends with the same weights: this small MLP job needs no
twin inside the image, and no torchvision (the synthetic dataset and the MLP do not import it).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from hpc_ddp.devcluster import image as devimage
from hpc_ddp.errors import HpcDdpError
from tests import e2e_util as e2e
from tests.conftest import IN_CI, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

STEPS = 12


@pytest.fixture(scope="module")
def image(slurm_cluster: Cluster) -> Path:
    """The image, built into the dev cluster's state dir (about 2.5 min the first time on this
    machine, then cached: only a changed source file rebuilds, in seconds)."""
    try:
        return devimage.build(slurm_cluster.state_dir, os.environ).path
    except HpcDdpError as exc:
        if IN_CI:
            pytest.fail(f"CI=true and the Charliecloud image cannot be built: {exc}")
        pytest.skip(f"Charliecloud image unavailable: {exc}")


def _apptainer_to_ch_run(image: Path) -> str:
    prefix = " ".join(shlex.quote(a) for a in devimage.ch_run_prefix(image)[:-2])
    return f"""#!/bin/sh
# apptainer exec [--bind B]... IMAGE CMD...  ->  ch-run -b B... OPTIONS IMAGE -- CMD...
[ "$1" = exec ] && shift
binds=""
while [ $# -gt 0 ]; do
    case "$1" in --bind) binds="$binds -b $2"; shift 2 ;; -*) shift ;; *) shift; break ;; esac
done
exec {prefix} $binds {shlex.quote(str(image))} -- "$@"
"""


def _config(path: Path, container: str, setup: list[str]) -> str:
    path.write_text(
        f"name: {path.stem}\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        f"env:\n  setup: {setup}\n"
        '  vars: {OMP_NUM_THREADS: "1"}\n'
        f"{container}"
        f"train: {{epochs: null, max_steps: {STEPS}, synthetic_samples: 256, batch_size: 16,"
        " checkpoint_every: 6, log_every: 1}\n"
    )
    return str(path)


def _torch_version(checkpoint: Path) -> str:
    import torch

    meta = torch.load(checkpoint, map_location="cpu", weights_only=True)["meta"]
    return str(meta["torch_version"])


def test_a_two_rank_job_trains_in_the_image_as_on_the_host(
    slurm_cluster: Cluster, image: Path, tmp_path: Path
) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "apptainer").write_text(_apptainer_to_ch_run(image))
    (stubs / "apptainer").chmod(0o755)
    # ch-run will not start without $USER, which a job's environment may lack.
    setup = [f"export PATH={stubs}:$PATH", "export USER=${USER:-$(id -un)}"]
    inside = _config(
        tmp_path / "in-image.yaml",
        f"  container: {{runtime: apptainer, image: {image}, python: {devimage.IMAGE_PYTHON}}}\n",
        setup,
    )
    outside = _config(tmp_path / "on-host.yaml", "", setup)
    runs = tmp_path / "runs"  # under /tmp, which ch-run binds by itself
    jobs = [e2e.submit(slurm_cluster, runs, cfg) for cfg in (inside, outside)]
    for job in jobs:
        fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
        assert fields["JobState"] == "COMPLETED", (fields, job.run_dir)
    in_image, on_host = jobs

    [attempt] = e2e.ledger(in_image.run_dir)
    assert (attempt.steps_done, attempt.world_size) == (STEPS, 2)
    newest = in_image.run_dir / "checkpoints" / f"step-{STEPS:08d}.pt"
    assert _torch_version(newest) == "2.13.0+cpu"  # the image's torch, not the host's
    host_torch = _torch_version(on_host.run_dir / "checkpoints" / f"step-{STEPS:08d}.pt")
    assert not host_torch.startswith("2.13.")
    assert e2e.final_digest(slurm_cluster, in_image.run_dir) == e2e.final_digest(
        slurm_cluster, on_host.run_dir
    )
