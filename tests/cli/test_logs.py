"""``hpc-ddp logs SWEEP_DIR --task N`` on a real Slurm job array: each task's own rank logs
(progress on stderr, the batch script's log), and exit 2 with a HINT for a task that is not
there or a run directory that is no sweep. Synthetic directories are covered in
``test_cancel_logs.py``; here Slurm itself wrote the files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.config.load import load_resolved_config
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.mark.slow
def test_logs_of_each_task_of_a_real_sweep(slurm_cluster: Cluster, tmp_path: Path) -> None:
    sweep_file = tmp_path / "sweep.yaml"
    # Different step counts per task: each task's log shows its own total.
    sweep_file.write_text(
        f"base: {REPO / 'jobs' / 'quickstart.yaml'}\nsweep:\n  grid:\n    train.max_steps: [3, 4]\n"
    )
    result = e2e.sweep(
        slurm_cluster, tmp_path / "runs", sweep_file, "train.log_every=1", e2e.STEADY_THREADS
    )
    sweep_dir = Path(result["sweep_dir"])
    [array] = result["array_jobs"]
    final = e2e.wait_all_done(slurm_cluster, [f"{array}_0", f"{array}_1"], timeout_s=240)
    assert [f["JobState"] for f in final] == ["COMPLETED", "COMPLETED"]

    for task, steps, other in ((0, 3, 4), (1, 4, 3)):
        task_dir = sweep_dir / "tasks" / str(task)
        assert load_resolved_config(task_dir / "config.yaml").train.max_steps == steps
        shown = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), "--task", str(task)).stdout
        assert f"step {steps}/{steps} |" in shown  # this task's progress...
        assert f"/{other} |" not in shown  # ...and not the other task's
        rank1 = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), "--task", str(task), "--rank", "1")
        assert rank1.returncode == 0
        batch = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), "--task", str(task), "--batch")
        assert batch.returncode == 0
        # The batch logs are in the sweep's logs/ (Slurm opened them there), the task's own
        # logs/ (made by the script) holds the rank logs only.
        assert (sweep_dir / "logs" / f"batch-{array}_{task}.out").is_file()
        assert sorted(p.name for p in (task_dir / "logs").iterdir()) == [
            "rank-0.err", "rank-0.out", "rank-1.err", "rank-1.out"
        ]  # fmt: skip

    out_of_range = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), "--task", "2", check=False)
    assert out_of_range.returncode == 2
    assert f"--task 2: {sweep_dir} has tasks 0-1. HINT:" in out_of_range.stderr
    negative = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), "--task", "-1", check=False)
    assert negative.returncode == 2
    assert "has tasks 0-1. HINT:" in negative.stderr
    no_task = e2e.hpc(slurm_cluster, "logs", str(sweep_dir), check=False)
    assert no_task.returncode == 2
    assert "is a sweep directory with tasks 0-1. HINT: pick one with --task N" in no_task.stderr
    not_sweep = e2e.hpc(
        slurm_cluster, "logs", str(sweep_dir / "tasks" / "0"), "--task", "0", check=False
    )
    assert not_sweep.returncode == 2
    assert "is not a sweep directory (no tasks/). HINT:" in not_sweep.stderr
