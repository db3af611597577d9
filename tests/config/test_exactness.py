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
        # What is saved, logged or how data is loaded: the same path, as exact as before.
        (job(), job(train={"keep_last": 9, "log_every": 1, "num_workers": 2}),
         "bit-identical to an uninterrupted run (CPU)"),
        (job(), job(requeue={"max_requeues": 9}), "bit-identical to an uninterrupted run (CPU)"),
        # The case: `resume R train.epochs=1` claimed bit-identical, printing that the
        # cosine schedule changed.
        (job(), job(train={"epochs": 3}), "not comparable to an uninterrupted run: train.epochs "
         "changed, and it shapes the schedule or the data"),
        (job(), job(train={"lr": 0.3, "seed": 4}), "not comparable to an uninterrupted run: "
         "train.lr, train.seed changed, and they shape the schedule or the data"),
        (job(command=["python", "t.py"], params={"lr": 1}),
         job(command=["python", "t.py"], params={"lr": 2}),
         "not comparable to an uninterrupted run: params changed, and it shapes the schedule "
         "or the data"),
    ],
)  # fmt: skip
def test_the_resume_clause(before: JobConfig, after: JobConfig, clause: str) -> None:
    assert resume_clause(before, after) == clause


def test_an_elastic_resume_rescales_grad_accum_without_leaving_the_path() -> None:
    from hpc_ddp.config.elastic import Resize

    resize = Resize(2, 1, 1, 2)
    after = job(train={"grad_accum": 2})
    assert resume_clause(job(slurm={"nodes": 2}), after, resize).startswith("sample-exact")
    assert "train.lr" in resume_clause(job(), job(train={"grad_accum": 2, "lr": 1.0}), resize)


def test_the_readme_and_the_concepts_guide_state_the_same_promise() -> None:
    """No unqualified promise of exactness: each place says where it is bit-identical."""
    readme = (REPO / "README.md").read_text()
    concepts = (REPO / "docs" / "concepts.md").read_text()
    assert "## Exactness: what is bit-identical where" in concepts
    for text in (readme, concepts):
        assert "train.deterministic" in text
        assert "step- and sample-exact" in text
        assert "bit-identical" in text
