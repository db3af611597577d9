"""The trainer's step and its loss window: what runs every step, on one CPU process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import pytest
from torch import nn

from hpc_ddp.config.model import TrainConfig

pytestmark = pytest.mark.torch


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        store=dist.HashStore(),  # type: ignore[attr-defined]
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=30),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_float32_on_cpu_has_no_autocast_and_no_scaler(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from hpc_ddp.train.loop import Precision

    plain = Precision.choose(False, torch.device("cpu"))
    assert (plain.enabled, plain.scaler) == (False, None)
    assert isinstance(plain.autocast(torch.device("cpu")), contextlib.nullcontext)
    asked = Precision.choose(True, torch.device("cpu"))
    assert not asked.enabled
    assert "needs a GPU" in caplog.text


@pytest.mark.parametrize(
    ("gpu", "major", "minor", "dtype", "scaled"),
    [
        ("T4", 7, 5, "float16", True),  # creates bf16 tensors, but emulated: fp16 + scaler
        ("V100", 7, 0, "float16", True),
        ("A100", 8, 0, "bfloat16", False),
        ("H100", 9, 0, "bfloat16", False),
    ],
)
def test_amp_uses_bf16_only_where_the_gpu_computes_in_it(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gpu: str,
    major: int,
    minor: int,
    dtype: str,
    scaled: bool,
) -> None:
    """torch's own ``is_bf16_supported`` is asked, with the GPU's properties injected: by
    default it counts emulation, so a T4 said yes and the fp16 + GradScaler path was dead."""
    import types

    import torch

    from hpc_ddp.train.loop import Precision

    props = types.SimpleNamespace(major=major, minor=minor, name=gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    caplog.set_level("INFO", logger="hpc_ddp.train.trainer")
    chosen = Precision.choose(True, torch.device("cuda:0"))
    assert chosen.enabled
    assert chosen.dtype == getattr(torch, dtype)
    assert (chosen.scaler is not None) == scaled
    assert f"train.amp: {dtype} autocast" in caplog.text
    if scaled:
        assert f"(sm_{major}{minor} has no native bfloat16)" in caplog.text


@pytest.mark.usefixtures("one_rank_group")
def test_a_step_accumulates_micro_batches_and_the_window_mean_is_per_batch() -> None:
    import torch
    from torch import nn

    from hpc_ddp.train.loop import Precision, StepRunner

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    cfg = TrainConfig(grad_accum=2)
    device = torch.device("cpu")
    runner = StepRunner(cfg, model, optimizer, scheduler, Precision.choose(False, device), device)
    batches = [(torch.randn(5, 4), torch.randint(3, (5,))) for _ in range(4)]
    with torch.no_grad():
        expected = [float(nn.functional.cross_entropy(model(x), y)) for x, y in batches[:2]]
    before = model.weight.detach().clone()

    runner.step(iter(batches))

    assert not torch.equal(model.weight, before)  # one optimizer step was taken
    assert float(runner.loss_sum) == pytest.approx(sum(expected))
    assert runner.take_mean_loss(steps=1, world_size=1) == pytest.approx(sum(expected) / 2)
    assert float(runner.loss_sum) == 0.0  # the window starts again


@pytest.mark.parametrize(("device", "tuned"), [("cuda", True), ("cpu", False)])
def test_cudnn_autotunes_on_a_gpu_for_the_block_and_is_restored(device: str, tuned: bool) -> None:
    """Choosing the device is all it takes (no CUDA call is made), so a CPU runs this too."""
    import torch

    from hpc_ddp.train.loop import TunedKernels

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        with TunedKernels(torch.device(device)):
            assert torch.backends.cudnn.benchmark is tuned
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before


def test_deterministic_kernels_are_set_for_the_block_and_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from hpc_ddp.train.loop import DeterministicKernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    assert not torch.are_deterministic_algorithms_enabled()
    with DeterministicKernels():
        assert torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # named, never raised
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        x = torch.randn(4, 3, 8, 8, requires_grad=True)  # an ordinary step runs
        loss = nn.functional.adaptive_avg_pool2d(nn.Conv2d(3, 2, 3)(x), 1).sum()
        loss.backward()  # type: ignore[no-untyped-call]
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == before
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own value wins
    with DeterministicKernels():
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_an_op_without_a_deterministic_version_runs_and_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under ``train.deterministic`` an op torch has no deterministic version of (max_unpool,
    on every device) warns instead of failing the run; the log names it once, and the run
    knows it is no longer bitwise. Other warnings pass through untouched."""
    import warnings

    import torch

    from hpc_ddp.train.loop import DeterministicKernels

    x, where = nn.functional.max_pool1d(torch.randn(1, 1, 8), 2, return_indices=True)
    with warnings.catch_warnings(record=True) as others, DeterministicKernels() as kernels:
        warnings.simplefilter("always")
        for _ in range(3):
            nn.functional.max_unpool1d(x, where, [2])
        warnings.warn("something else", UserWarning, stacklevel=1)
    [op] = kernels.fallbacks
    assert op.startswith("max_unpool")
    lines = [r.getMessage() for r in caplog.records if "has no deterministic" in r.getMessage()]
    assert lines == [
        f"train.deterministic: {op} has no deterministic implementation, so this run is step- "
        "and sample-exact, not bitwise"
    ]
    assert [str(w.message) for w in others] == ["something else"]
