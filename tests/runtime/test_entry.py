"""The on-node runtime: finding the task's run dir, entry points, and a single-process run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.config.load import dump_job_config
from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.errors import ConfigError, RunDirError
from hpc_ddp.runtime.entry import resolve_entrypoint, run_job, task_run_dir
from hpc_ddp.runtime.ledger import EndCause, read_ledger


@pytest.fixture(autouse=True)
def _own_environ() -> Iterator[None]:
    """run_job writes RANK, MASTER_PORT, OMP_NUM_THREADS, ... into os.environ, as on a node;
    here they must not leak into later tests (an srun they start would inherit RANK=0)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_dir(root: Path, cfg: JobConfig) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(dump_job_config(cfg))
    return root


def test_plain_run_dir(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "r", JobConfig(name="x"))
    assert task_run_dir(run, {}) == run


@pytest.mark.parametrize(
    ("index", "offset", "expected"), [("0", None, 0), ("2", None, 2), ("1", "1000", 1001)]
)
def test_array_task_finds_its_own_dir(
    tmp_path: Path, index: str, offset: str | None, expected: int
) -> None:
    sweep = tmp_path / "sweep"
    _run_dir(sweep / "tasks" / str(expected), JobConfig(name="x"))
    env = {"SLURM_ARRAY_TASK_ID": index}
    if offset:
        env["HPC_DDP_ARRAY_OFFSET"] = offset
    assert task_run_dir(sweep, env) == sweep / "tasks" / str(expected)


def test_missing_config_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="HINT"):
        task_run_dir(tmp_path, {})
    (tmp_path / "tasks").mkdir()
    with pytest.raises(RunDirError, match="array task 3"):
        task_run_dir(tmp_path, {"SLURM_ARRAY_TASK_ID": "3"})


def test_bad_entrypoint_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        resolve_entrypoint("no_such_module_xyz:main")
    with pytest.raises(ConfigError, match="HINT"):
        resolve_entrypoint("json:no_such_function")
    assert resolve_entrypoint("json:dumps") is json.dumps


@pytest.mark.torch
def test_single_process_run_trains_and_records_the_attempt(tmp_path: Path) -> None:
    """No launcher at all: the built-in trainer runs as rank 0 of 1 and finishes."""
    cfg = JobConfig(
        name="solo",
        train=TrainConfig(
            epochs=None,
            max_steps=12,
            batch_size=16,
            synthetic_samples=256,
            checkpoint_every=5,
            log_every=4,
        ),
    )
    run = _run_dir(tmp_path / "solo", cfg)
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    assert attempt.steps_done == 12
    assert (run / "checkpoints" / "step-00000012.pt").exists()
    assert (run / "checkpoints" / "step-00000010.pt").exists()
