"""The trainer's step and its loss window: what runs every step, on one CPU process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import pytest

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
