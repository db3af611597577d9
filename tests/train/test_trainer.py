"""The built-in trainer: exact resume across a stop, on 2 real gloo ranks; schedules; learning.

The central promise: a run stopped after step k and restarted from its checkpoint ends with
weights bit-identical to an uninterrupted run with the same seed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.config.elastic import Resize
from hpc_ddp.config.exactness import Exactness
from hpc_ddp.config.model import TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.train.trainer import (
    exactness_line,
    fixed_buckets,
    lr_factor,
    plan_total_steps,
    resolve_num_workers,
    task_cpus,
)
from tests.helpers.launch import run_ranks
from tests.helpers.train_ranks import SMALL_RUN, STEPS_PER_EPOCH, train_argv, train_ranks

pytestmark = pytest.mark.torch


def metric_steps(run_dir: Path, key: str) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if key in r]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    ranks = [result for result, _ in train_ranks(run_dir, SMALL_RUN)]
    assert ranks[0] == ranks[1]  # every rank returns the same result (same weights)
    return run_dir, ranks[0]


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param((5, 1, "SIGUSR2", {}), id="mid-epoch"),
        pytest.param((12, 1, "SIGUSR2", {}), id="right-after-a-checkpoint"),
        pytest.param(
            (STEPS_PER_EPOCH, 0, "SIGTERM", {"num_workers": 2}), id="epoch-boundary-term-workers"
        ),
        # Workers prefetch ahead of the loop: a stop mid-epoch must not lose or repeat a batch.
        pytest.param((5, 0, "SIGUSR2", {"num_workers": 2}), id="mid-epoch-workers"),
        # Deterministic kernels change nothing on CPU, which is bit-identical without them.
        pytest.param((5, 1, "SIGUSR2", {"deterministic": True}), id="mid-epoch-deterministic"),
    ],
)  # fmt: skip
def test_stop_and_resume_is_bit_identical(
    tmp_path: Path,
    uninterrupted: tuple[Path, dict[str, Any]],
    stop: tuple[int, int, str, dict[str, Any]],
) -> None:
    """Stop after step ``stop_at`` (signal ``sig`` to ``rank``), resume, compare weights with
    the uninterrupted run (no workers, default kernels)."""
    stop_at, rank, sig, changes = stop
    full_dir, full = uninterrupted
    cfg = {**SMALL_RUN, **changes}  # workers change nothing in the data order
    stopped = [result for result, _ in train_ranks(tmp_path, cfg, str(stop_at), str(rank), sig)]
    # Only one rank was signalled; both stopped after the same step, cleanly.
    expected_stop = {"stopped": stop_at, "signal": int(signal.Signals[sig]), "code": 0}
    assert stopped == [expected_stop, expected_stop]
    assert (tmp_path / "checkpoints" / f"step-{stop_at:08d}.pt").is_file()

    [(resumed, _), _] = train_ranks(tmp_path, cfg)
    assert resumed["step"] == SMALL_RUN["max_steps"]
    assert resumed["weights_digest"] == full["weights_digest"]
    assert resumed["val_acc"] == full["val_acc"]
    # Logged and evaluated at the same steps as the uninterrupted run: none repeated or skipped.
    for key in ("loss", "val_loss"):
        assert metric_steps(tmp_path, key) == metric_steps(full_dir, key)


@pytest.mark.slow
def test_three_ranks_resume_is_bit_identical(tmp_path: Path) -> None:
    """With 3+ ranks the all-reduce's addition order depends on DDP's bucket layout, which the
    session fixes up front; without that the first step after a resume drifts by ulps."""
    cfg = {**SMALL_RUN, "synthetic_samples": 192, "max_steps": 12, "checkpoint_every": 4}
    [(full, _), *_] = train_ranks(tmp_path / "full", cfg, world=3)
    stopped = train_ranks(tmp_path / "cut", cfg, "5", "2", world=3)
    assert {r["stopped"] for r, _ in stopped} == {5}
    [(resumed, _), *_] = train_ranks(tmp_path / "cut", cfg, world=3)
    assert resumed["weights_digest"] == full["weights_digest"]


def test_loss_decreases_on_synthetic_data(uninterrupted: tuple[Path, dict[str, Any]]) -> None:
    run_dir, result = uninterrupted
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[0] > math.log(10) * 0.9  # starts near chance
    assert losses[-1] < losses[0] * 0.6
    assert result["val_acc"] > 0.5  # chance is 0.1
    assert {"lr", "samples_per_s", "epoch", "time"} <= rows[0].keys()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*.pt")) == [
        "step-00000012.pt",
        "step-00000018.pt",
        "step-00000020.pt",
    ]  # every 6 steps and the end, keep_last=3


@pytest.mark.parametrize(
    ("step", "schedule", "warmup", "expected"),
    [
        (0, "constant", 0, 1.0),
        (0, "constant", 4, 0.2),
        (3, "constant", 4, 0.8),
        (4, "constant", 4, 1.0),
        (0, "cosine", 0, 1.0),
        (50, "cosine", 0, 0.5),
        (100, "cosine", 0, 0.0),
        (10, "cosine", 10, 1.0),
        (55, "cosine", 10, 0.5),
        (49, "step", 0, 1.0),
        (50, "step", 0, 0.1),
        (75, "step", 0, 0.01),
    ],
)
def test_lr_factor(step: int, schedule: str, warmup: int, expected: float) -> None:
    got = lr_factor(step, total=100, schedule=schedule, warmup=warmup)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("setting", "device", "cpus", "workers"),
    [
        ("auto", "cpu", 8, 0),  # the model computes on every core the rank has
        ("auto", "cuda", 8, 7),  # one core runs the loop, the rest decode
        ("auto", "cuda", 1, 1),  # still overlap the GPU's work
        ("auto", "cuda", 2, 1),
        ("auto", "cuda", 64, 8),
        (0, "cuda", 8, 0),  # a number is used as given
        (3, "cpu", 8, 3),
    ],
)
def test_auto_data_loader_workers_per_device(
    setting: int | str, device: str, cpus: int, workers: int
) -> None:
    assert resolve_num_workers(setting, device, cpus) == workers


def test_a_rank_counts_slurms_cpus_else_its_share_of_its_affinity() -> None:
    import os

    assert task_cpus({"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "6"}, 4) == 6
    mine = len(os.sched_getaffinity(0))
    assert task_cpus({}, 1) == mine
    assert task_cpus({"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": ""}, 1_000_000) == 1
    assert task_cpus({"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "0"}, 1) == mine


@pytest.mark.parametrize(
    ("world", "kept", "fixed"),
    [
        (3, Exactness.BITWISE, True),  # CPU: bit-identical with 3+ ranks needs it
        (3, Exactness.BITWISE_SAME_NODES, True),  # deterministic GPU kernels: so does it
        (3, Exactness.STEP_EXACT, False),  # default GPU: it would buy nothing, cost overlap
        (2, Exactness.BITWISE, False),  # a + b == b + a in any layout
    ],
)
def test_the_bucket_layout_is_fixed_only_where_it_buys_bitwise_resume(
    world: int, kept: Exactness, fixed: bool
) -> None:
    assert fixed_buckets(world, kept) is fixed


def test_lr_factor_unknown_schedule() -> None:
    with pytest.raises(ConfigError, match="HINT"):
        lr_factor(0, total=10, schedule="linear", warmup=0)


@pytest.mark.parametrize(
    ("max_steps", "epochs", "expected"), [(None, 3, 30), (7, 3, 7), (25, None, 25)]
)
def test_plan_total_steps(max_steps: int | None, epochs: int | None, expected: int) -> None:
    cfg = TrainConfig(max_steps=max_steps, epochs=epochs)
    assert plan_total_steps(cfg, steps_per_epoch=10) == expected


def test_plan_total_steps_needs_a_limit() -> None:
    with pytest.raises(ConfigError, match="HINT"):
        plan_total_steps(TrainConfig(max_steps=None, epochs=None), steps_per_epoch=10)


def test_a_resume_whose_total_is_below_the_checkpoint_is_refused(tmp_path: Path) -> None:
    """`resume R train.epochs=1` on a run at step 12 (8 steps per epoch) used to log
    "steps 13..8" and finish at once; every rank now refuses, naming both numbers."""
    cfg = {**SMALL_RUN, "max_steps": 12, "eval_every": 0}
    train_ranks(tmp_path, cfg)
    shorter = {**cfg, "max_steps": None, "epochs": 1}
    for code, _, err in run_ranks(train_argv(tmp_path, shorter), 2, timeout=120):
        assert code != 0
        assert (
            "ConfigError: train.epochs=1 (8 steps each) makes the run 8 steps long, but its "
            "checkpoint is at step 12" in err
        )
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.pt"))[-1] == (
        "step-00000012.pt"
    )  # nothing saved past it, nothing rewound


def test_compile_trains_a_compiled_model_with_its_warm_up_covered(tmp_path: Path) -> None:
    """``train.compile: true`` on 2 CPU ranks: torch.compile runs (Inductor writes its
    kernels into the cache directory), the run trains to its end and its loss falls."""
    if shutil.which(os.environ.get("CC", "cc")) is None:  # Inductor builds C++ kernels on CPU
        message = "torch.compile on CPU needs a C compiler, and this machine has none"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: install gcc in .ci/run")
        pytest.skip(message)
    cache = tmp_path / "inductor"
    cfg = {**SMALL_RUN, "compile": True, "max_steps": 8, "eval_every": 0, "checkpoint_every": 4}
    argv = train_argv(tmp_path / "run", cfg)
    ranks = run_ranks(argv, 2, {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, timeout=600)
    for rank, (code, _, err) in enumerate(ranks):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-4000:]}"
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in ranks]
    assert results[0] == results[1]
    assert results[0]["step"] == 8
    assert math.isfinite(results[0]["loss"])
    assert "train.compile: torch.compile of the model" in ranks[0][2]
    assert any(cache.rglob("*.py")), "Inductor compiled nothing"
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl")
              .read_text().splitlines() if "loss" in json.loads(line)]  # fmt: skip
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(
    ("kept", "resumed", "resize", "min_nodes", "words"),
    [
        (Exactness.BITWISE, False, None, False,
         "exactness: a resume of this run is bit-identical to an uninterrupted run"),
        (Exactness.STEP_EXACT, False, None, True,
         "exactness: a resume of this run is step- and sample-exact, not bitwise (at another "
         "world size: sample-exact, not bit-exact)"),
        (Exactness.BITWISE, True, None, True,
         "exactness: this resume (at its checkpoint's world size) is bit-identical to an "
         "uninterrupted run"),
        (Exactness.BITWISE, True, Resize(2, 1, 1, 2), False,
         "exactness: this resume (2 -> 1 ranks, the same global batch) is sample-exact, not "
         "bit-exact"),
    ],
)  # fmt: skip
def test_the_exactness_line_names_one_exactness_for_the_resume_that_happened(
    kept: Exactness, resumed: bool, resize: Resize | None, min_nodes: bool, words: str
) -> None:
    """An elastic resume is sample-exact only, a same-size one only ``kept``: the line used
    to say "bit-identical" before the restore, and the checkpointer "sample-exact" after."""
    assert exactness_line(kept, resumed=resumed, resize=resize, min_nodes=min_nodes) == words


def test_an_elastic_resume_logs_sample_exact_and_never_bit_identical(tmp_path: Path) -> None:
    """2 ranks x accumulation 2 stopped mid-epoch, resumed on 1 rank x 4 (the same global
    batch): its log says sample-exact only; a same-size resume says bit-identical only."""
    cfg = {**SMALL_RUN, "max_steps": 6, "eval_every": 0, "checkpoint_every": 0}
    train_ranks(tmp_path, cfg, "3", "0")
    [(code, _, err)] = run_ranks(train_argv(tmp_path, {**cfg, "grad_accum": 4}), 1, timeout=120)
    assert code == 0, err[-4000:]
    assert "elastic resume from step-00000003.pt" in err
    assert "exactness: this resume (2 -> 1 ranks, the same global batch) is sample-exact" in err
    assert "bit-identical" not in err

    same = tmp_path / "same"
    train_ranks(same, cfg, "3", "0")
    ranks = run_ranks(train_argv(same, cfg), 2, timeout=120)
    assert [code for code, _, _ in ranks] == [0, 0], ranks[0][2][-4000:]
    err = ranks[0][2]  # rank 0 logs for the run
    assert "exactness: this resume (at its checkpoint's world size) is bit-identical" in err
    assert "sample-exact" not in err
