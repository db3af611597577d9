"""Where a launch's start-up goes: the session marks each phase and logs them at the first
step (a restart inside the allocation pays all of it again)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpc_ddp.config.model import JobConfig
from hpc_ddp.sessions.session import Session

pytestmark = pytest.mark.torch


@pytest.mark.usefixtures("own_process")
def test_the_start_up_phases_are_marked_in_order_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = TensorDataset(torch.randn(32, 4), torch.zeros(32, dtype=torch.long))
    began = time.time()
    with (
        caplog.at_level(logging.INFO, logger="hpc_ddp"),
        Session(tmp_path, JobConfig(name="t"), env={}) as s,
    ):
        model = s.wrap(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt)
        batches = s.loader(data, batch_size=4).forever()
        for _ in s.steps(3):
            x, y = next(batches)
            nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
    names = [name for name, _ in s.startup]
    assert names == ["process", "session", "process group", "model", "restore", "first step"]
    times = [t for _, t in s.startup]
    assert times[0] < began  # the process started before this test did
    assert not math.isnan(times[0])
    assert times == sorted(times)
    lines = [r.getMessage() for r in caplog.records if "start-up" in r.getMessage()]
    assert len(lines) == 1  # at the first step only
    assert "from process to the end of the first step" in lines[0]
    assert "process group" in lines[0]
