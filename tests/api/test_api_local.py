"""The Python API with the local backend: two real DDP processes over gloo, no Slurm.

``Job.wait`` polls the same verdict ``status`` gives a local run (running while its controller
or any rank runs) and collects the controller this process started, so none is left a zombie.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpc_ddp
from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.torch]


def test_a_local_run_submitted_waited_on_and_read_back(tmp_path: Path) -> None:
    job = hpc_ddp.submit(REPO / "jobs" / "quickstart.yaml",
                         {"train.max_steps": 10, "env.vars": {"OMP_NUM_THREADS": "1"}},
                         backend="local", runs_dir=tmp_path)  # fmt: skip
    assert job.backend == "local"
    assert job.launched is not None
    assert job.status().state in ("RUNNING", "COMPLETED")
    status = job.wait(timeout=300)
    assert (status.state, status.ckpt_step, status.causes) == ("COMPLETED", 10, ("finished",))
    _, out = run_cli("status", str(job.run_dir), "--json")
    assert [status.to_dict()] == json.loads(out)["runs"]
    assert [r["step"] for r in job.metrics() if "val_loss" in r] == [10]
    assert "step 10/10" in job.logs()  # rank 0's progress, on its stderr
    stat = Path(f"/proc/{job.job_id}/stat")
    assert not stat.exists() or stat.read_text().split()[2] != "Z"  # the controller was reaped
    assert job.cancel().outcome == "already_finished"
