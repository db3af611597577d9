"""``params`` on the real dev cluster: a two-point sweep over ``params.lr`` runs a ``command``
job, and each array task's program receives its own point's values, each as one argument."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.e2e_util import hpc, sweep, wait_all_done

if TYPE_CHECKING:
    from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm]

TAG = "a b; echo pwned $(id) `id` '\"{x}"


def test_a_params_sweep_gives_each_task_its_own_lr(slurm_cluster: Cluster, tmp_path: Path) -> None:
    spec = {
        "base": {
            "name": "params-e2e",
            # printf brackets each argument it gets: a value split in two or run as shell
            # would show up as two bracketed lines or as the output of `id`.
            "command": ["printf", "[%s]\\n", "lr={params.lr}", "{params.tag}", "{{params.lr}}"],
            "params": {"tag": TAG},
            "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"},
        },
        "sweep": {"grid": {"params.lr": [0.1, 0.003]}},
    }
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    submitted = sweep(slurm_cluster, tmp_path / "runs", sweep_file)
    [job] = submitted["array_jobs"]
    sweep_dir = Path(submitted["sweep_dir"])

    final = wait_all_done(slurm_cluster, [f"{job}_0", f"{job}_1"], timeout_s=120)
    assert [f["JobState"] for f in final] == ["COMPLETED", "COMPLETED"], final
    for index, lr in ((0, "0.1"), (1, "0.003")):
        out = (sweep_dir / "tasks" / str(index) / "logs" / "rank-0.out").read_text()
        assert out.splitlines() == [f"[lr={lr}]", f"[{TAG}]", "[{params.lr}]"], out
        assert "uid=" not in out  # the tag was printed, never run as shell

    shown = json.loads(hpc(slurm_cluster, "results", str(sweep_dir), "--format", "json").stdout)
    rows = shown["rows"]
    assert [row["values"].get("params.lr") for row in rows] == [0.1, 0.003], rows


@pytest.mark.torch
def test_the_byo_example_sweep_runs_as_the_readme_says(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """``hpc-ddp sweep examples/byo/sweep.yaml`` as documented: three array tasks of two DDP
    ranks each, every one training examples/byo/train.py with its own ``--lr``, then
    ``hpc-ddp results`` ranks them by the loss the script logged."""
    submitted = sweep(slurm_cluster, tmp_path / "runs", "examples/byo/sweep.yaml")
    [job] = submitted["array_jobs"]
    sweep_dir = Path(submitted["sweep_dir"])
    refs = [f"{job}_{i}" for i in range(3)]
    final = wait_all_done(slurm_cluster, refs, timeout_s=240)
    assert [f["JobState"] for f in final] == ["COMPLETED"] * 3, final

    shown = json.loads(hpc(slurm_cluster, "results", str(sweep_dir), "--format", "json").stdout)
    rows = shown["rows"]
    assert sorted(row["values"]["params.lr"] for row in rows) == [0.001, 0.003, 0.01], rows
    best = [row["best"] for row in rows]
    assert best == sorted(best)  # metric: {name: loss, mode: min}: the lowest loss first
    assert len(set(best)) == 3  # three learning rates, three trainings
    assert {row["steps"] for row in rows} == {200}
    for index, lr in enumerate(["0.01", "0.003", "0.001"]):
        config = yaml.safe_load((sweep_dir / "tasks" / str(index) / "config.yaml").read_text())
        assert config["params"] == {"lr": float(lr)}
