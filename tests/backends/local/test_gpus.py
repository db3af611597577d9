"""The local backend gives each rank the GPUs the job asks for, as Slurm would.

submitit's LocalExecutor, left alone, gives every task ``CUDA_VISIBLE_DEVICES=""``: a GPU job
run with ``--backend local`` trained on the CPU. The plan is a pure function; the real runs
start two ranks through the CLI and read back what each was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.backends.local.backend import local_gpu_plan
from hpc_ddp.cli.main import main
from hpc_ddp.config.model import SlurmConfig
from hpc_ddp.errors import ConfigError
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("slurm", "parent", "plan"),
    [
        (SlurmConfig(tasks_per_node=2), "3,5", ["", ""]),  # none asked: none given
        (SlurmConfig(tasks_per_node=2, gpus_per_task=1), "3,5", ["3", "5"]),
        (SlurmConfig(tasks_per_node=2, gpus_per_task=1), None, ["0", "1"]),
        (SlurmConfig(tasks_per_node=2, gpus_per_task=2), "GPU-a,GPU-b,GPU-c,GPU-d",
         ["GPU-a,GPU-b", "GPU-c,GPU-d"]),  # UUIDs (and MIG ids) are passed on verbatim
        (SlurmConfig(tasks_per_node=4, gpus_per_node=4), "4,5,6,7,8", ["4,5,6,7"] * 4),
        (SlurmConfig(nodes=2, tasks_per_node=1, gpus_per_node=1), " 2, 3 ", ["2,3", "2,3"]),
    ],
)  # fmt: skip
def test_the_plan_gives_each_rank_its_gpus_as_slurm_would(
    slurm: SlurmConfig, parent: str | None, plan: list[str]
) -> None:
    assert local_gpu_plan(slurm, parent) == plan


def test_a_plan_needing_more_gpus_than_listed_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        local_gpu_plan(SlurmConfig(tasks_per_node=4, gpus_per_task=1), "0,1")
    message = str(info.value)
    assert "slurm.gpus_per_task asks for 4 GPU(s) in all for 4 local rank(s)" in message
    assert "CUDA_VISIBLE_DEVICES='0,1' lists 2. HINT:" in message
    with pytest.raises(ConfigError, match=r"^slurm.gpus_per_node asks for 3 GPU"):
        local_gpu_plan(SlurmConfig(tasks_per_node=3, gpus_per_node=3), "")


def _env(visible: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "CUDA_VISIBLE_DEVICES": visible}


def test_too_few_gpus_for_a_local_job_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    runs = tmp_path / "runs"
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "--runs-dir", str(runs),
            "slurm.nodes=1", "slurm.tasks_per_node=4", "slurm.gpus_per_task=1",
            "--dry-run"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "slurm.gpus_per_task asks for 4 GPU(s)" in err
    assert "CUDA_VISIBLE_DEVICES='0,1'" in err
    assert not runs.exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert main(argv) == 0
    plan = capsys.readouterr().out
    assert "; CUDA_VISIBLE_DEVICES by rank: 0 | 1 | 2 | 3" in plan


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("slurm.gpus_per_task=1", [("3", "1", "1", "cuda:0"), ("5", "1", "1", "cuda:0")]),
        ("slurm.gpus_per_node=2", [("3,5", "2", None, "cuda:0"), ("3,5", "2", None, "cuda:1")]),
        ("slurm.gpus_per_node=null", [("", "0", None, "cpu"), ("", "0", None, "cpu")]),
    ],
)
def test_real_local_ranks_see_the_gpus_the_job_asks_for(
    tmp_path: Path, gpus: str, expected: list[tuple[str, str, str | None, str]]
) -> None:
    """Two real ranks under submitit, started by ``submit --backend local --wait`` with
    ``CUDA_VISIBLE_DEVICES=3,5``: each records what it was given and the device it would take."""
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path), "slurm.nodes=1", "slurm.tasks_per_node=2", gpus,
         "entrypoint=tests.helpers.report_gpus:main"],
        cwd=REPO, env=_env("3,5"), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # The entry point opens no session, so the run's verdict (which reads the ledger) is not
    # what is tested here: what each rank was given is.
    [run_dir] = tmp_path.iterdir()
    reports = [run_dir / f"gpus-rank{rank}.json" for rank in (0, 1)]
    assert all(r.is_file() for r in reports), done.stderr[-3000:]
    seen = []
    for report in reports:
        r = json.loads(report.read_text())
        seen.append((r["visible"], r["given"], r["per_task"], r["device"]))
    assert seen == expected


def test_a_deterministic_job_has_its_cublas_setting_before_cuda_starts(tmp_path: Path) -> None:
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG once: ``hpc-ddp run`` sets it for
    ``train.deterministic`` before the job's code (or torch's CUDA) runs; a user's own value
    in the environment wins."""
    for deterministic, preset, expected in (("true", None, ":4096:8"), ("false", None, None),
                                            ("true", ":16:8", ":16:8")):  # fmt: skip
        runs = tmp_path / deterministic / str(preset)
        env = _env("")
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if preset is not None:
            env["CUBLAS_WORKSPACE_CONFIG"] = preset
        done = subprocess.run(
            [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend",
             "local", "--wait", "--runs-dir", str(runs), "slurm.nodes=1", "slurm.tasks_per_node=1",
             f"train.deterministic={deterministic}", "entrypoint=tests.helpers.report_gpus:main"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        [run_dir] = runs.iterdir()
        report = run_dir / "gpus-rank0.json"
        assert report.is_file(), done.stderr[-3000:]
        seen = json.loads(report.read_text())
        assert (seen["cublas"], seen["cuda_started"]) == (expected, False)
