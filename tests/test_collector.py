"""The garbage collector held off while a command starts, and given back when it is over."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp import collector
from hpc_ddp.cli.main import main
from hpc_ddp.config.load import dump_job_config
from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.job.task import run_job
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger

_seen: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """Every test here leaves the suite's collector running and nothing frozen."""
    yield
    collector._held = False
    gc.unfreeze()
    gc.enable()


def test_hold_then_release_freezes_what_is_alive_and_collects_again() -> None:
    collector.hold()
    assert not gc.isenabled()
    kept = [object() for _ in range(10)]
    collector.release()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    frozen = gc.get_freeze_count()
    collector.release()  # a second word that start-up is over changes nothing
    assert gc.get_freeze_count() == frozen


def test_release_without_hold_leaves_the_collector_alone() -> None:
    collector.release()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    gc.disable()  # someone else's choice: hold() does not take it over, release() keeps it
    collector.hold()
    collector.release()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_freeze_for_exit_turns_the_collector_back_on() -> None:
    collector.hold()
    collector.freeze_for_exit()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def test_a_verb_runs_with_the_collector_once_its_handler_is_loaded(tmp_path: Path) -> None:
    collector.hold()
    assert main(["status", "--runs-dir", str(tmp_path)]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def _record_collector() -> int:
    """An entry point job: what the collector was doing when the job's own code ran."""
    _seen["enabled"] = gc.isenabled()
    return 0


def _run_dir(root: Path, cfg: JobConfig) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(dump_job_config(cfg))
    return root


def test_an_entry_point_runs_with_the_collector(tmp_path: Path) -> None:
    run = _run_dir(
        tmp_path / "entry", JobConfig(name="entry", entrypoint=f"{__name__}:_record_collector")
    )
    collector.hold()  # as `hpc-ddp run` has it when the job starts
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    assert _seen["enabled"] is True


@pytest.mark.torch
def test_the_built_in_trainer_collects_from_its_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held while the model is built, collecting (start-up frozen) from the first step on.

    Seen from inside the trainer: whether a pass happens in a few steps depends on what the
    process made before (a warm process may allocate too little to reach the threshold).
    """
    from hpc_ddp.train import trainer
    from hpc_ddp.train.models import build_model

    seen: dict[str, tuple[bool, int]] = {}
    train_loop = trainer._train_loop

    def building(*args: Any, **kwargs: Any) -> Any:
        seen["building"] = (gc.isenabled(), gc.get_freeze_count())
        return build_model(*args, **kwargs)

    def training(*args: Any, **kwargs: Any) -> Any:
        seen["training"] = (gc.isenabled(), gc.get_freeze_count())
        return train_loop(*args, **kwargs)

    monkeypatch.setattr(trainer, "build_model", building)
    monkeypatch.setattr(trainer, "_train_loop", training)
    cfg = JobConfig(
        name="gc",
        train=TrainConfig(
            epochs=None, max_steps=10, batch_size=16, synthetic_samples=256, log_every=10
        ),
    )
    run = _run_dir(tmp_path / "gc", cfg)
    collector.hold()
    assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    assert seen["building"] == (False, 0)
    enabled, frozen = seen["training"]
    assert enabled
    assert frozen > 100_000  # torch, its modules and the model, out of every later pass
