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
from hpc_ddp.runtime.ledger import EndCause, read_ledger

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
def test_the_built_in_trainer_collects_from_its_first_step(tmp_path: Path) -> None:
    """Held through start-up (no automatic pass), collecting again while it trains."""
    cfg = JobConfig(
        name="gc",
        train=TrainConfig(
            epochs=None, max_steps=30, batch_size=16, synthetic_samples=256, log_every=10
        ),
    )
    run = _run_dir(tmp_path / "gc", cfg)
    passes: list[tuple[bool, int]] = []

    def on_pass(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append((collector._held, gc.get_freeze_count()))

    collector.hold()
    gc.callbacks.append(on_pass)
    try:
        assert run_job(run, {"PATH": "/usr/bin:/bin"}) == 0
    finally:
        gc.callbacks.remove(on_pass)
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    assert gc.isenabled()
    assert passes, "training made garbage but the collector never ran"
    assert all(not held and frozen > 0 for held, frozen in passes), passes
