"""What a resume keeps, stated once (pure), and the prose that must agree with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.config.exactness import Exactness, asks_for_gpus, exactness, resume_clause
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import JobConfig, SlurmConfig

REPO = Path(__file__).resolve().parents[2]


def test_bitwise_on_cpu_and_on_deterministic_gpus_only() -> None:
    assert exactness(on_gpu=False, deterministic=False) is Exactness.BITWISE
    assert exactness(on_gpu=False, deterministic=True) is Exactness.BITWISE
    assert exactness(on_gpu=True, deterministic=True) is Exactness.BITWISE_SAME_NODES
    assert exactness(on_gpu=True, deterministic=False) is Exactness.STEP_EXACT


@pytest.mark.parametrize(
    ("slurm", "asks"),
    [
        (SlurmConfig(), False),
        (SlurmConfig(gpus_per_task=1), True),
        (SlurmConfig(gpus_per_node=4), True),
        (SlurmConfig(extra=(("gres", "gpu:a100:2"),)), True),
        (SlurmConfig(extra=(("gres", "nvme:1"),)), False),
        (SlurmConfig(extra=(("gpus", "4"),)), True),
        (SlurmConfig(extra=(("exclusive", None),)), False),
    ],
)
def test_which_jobs_ask_for_gpus(slurm: SlurmConfig, asks: bool) -> None:
    assert asks_for_gpus(slurm) is asks


def job(**sections: Any) -> JobConfig:
    return job_config_from_dict({"name": "j", **sections}, "x")


@pytest.mark.parametrize(
    ("before", "after", "clause"),
    [
        (job(), job(), "bit-identical to an uninterrupted run (CPU)"),
        (
            job(slurm={"gpus_per_node": 1}),
            job(slurm={"gpus_per_node": 1}),
            "step- and sample-exact, not bitwise (GPUs without train.deterministic)",
        ),
        (
            job(slurm={"gpus_per_task": 1}),
            job(slurm={"gpus_per_task": 1}, train={"deterministic": True}),
            "bit-identical on the same nodes and GPU topology (train.deterministic)",
        ),
        (
            job(slurm={"gpus_per_task": 1}, command=["python", "t.py"]),
            job(slurm={"gpus_per_task": 1}, command=["python", "t.py"]),
            "step- and sample-exact, not bitwise on GPUs, unless your program makes them so",
        ),
        (job(), job(slurm={"nodes": 2}), "not exact: 1 -> 2 ranks reshards the data"),
    ],
)
def test_the_resume_clause(before: JobConfig, after: JobConfig, clause: str) -> None:
    assert resume_clause(before, after) == clause


def test_the_readme_and_the_concepts_guide_state_the_same_promise() -> None:
    """No unqualified promise of exactness: each place says where it is bit-identical."""
    readme = (REPO / "README.md").read_text()
    concepts = (REPO / "docs" / "concepts.md").read_text()
    assert "## Exactness: what is bit-identical where" in concepts
    for text in (readme, concepts):
        assert "train.deterministic" in text
        assert "step- and sample-exact" in text
        assert "bit-identical" in text
