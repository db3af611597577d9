"""FSDP on the real two-node dev cluster: ``train.strategy=fsdp`` trains over 2 nodes, each rank
writing its own shard, and a run stopped by the lead-time signal and requeued ends with the
whole weights bit-identical to the uninterrupted run's (exported from the last shard set)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpc_ddp.checkpoint.format import weights_digest
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

FSDP = ["train.strategy=fsdp", "train.epochs=2", "train.log_every=1"]


def exported_digest(cluster: Cluster, run_dir: Path) -> str:
    """The weights digest of the newest verified shard set, as ``--export`` writes them."""
    out = run_dir / "exported.pt"
    e2e.hpc(cluster, "checkpoints", str(run_dir), "--export", str(out))
    return weights_digest(torch.load(out, weights_only=True))


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    runs = tmp_path_factory.mktemp("fsdp-ref")
    job = e2e.submit(slurm_cluster, runs, "jobs/quickstart.yaml", *FSDP)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    newest = job.run_dir / "checkpoints" / "step-00000064"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "digests.json"} <= {
        p.name for p in newest.iterdir()
    }
    assert "fsdp: 3 block(s) sharded" in (job.run_dir / "logs" / "rank-1.err").read_text()
    return exported_digest(slurm_cluster, job.run_dir)


def test_an_fsdp_run_requeued_mid_run_resumes_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path, reference: str
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", *FSDP)
    e2e.wait_step(job.run_dir, 10)
    slurm_cluster.run("scancel", "--signal=USR2", job.job_id)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    assert exported_digest(slurm_cluster, job.run_dir) == reference
    rank0 = (job.run_dir / "logs" / "rank-0.err").read_text()
    assert "resumed from sharded step-" in rank0
    attempts = e2e.ledger(job.run_dir)
    assert [a.cause.value if a.cause else None for a in attempts] == ["time_limit", "finished"]
