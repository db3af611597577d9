"""The survivor's save on one process: what it writes, when it waits, when it refuses.

The training thread is a real thread running real optimizer steps; the rescue runs on the test's
thread, as it runs on the watchdog's. The whole path (a SIGKILLed or SIGSTOPped rank, the
survivor's checkpoint, the restart at that step) is in ``test_faults_e2e.py`` and
``test_rescue_e2e.py``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.fault.rescue import Rescue, writer_rank
from hpc_ddp.rundir.layout import Checkpoint
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.rng import StepSeeds, step_rng_state

pytestmark = pytest.mark.torch


class Writer:
    """A checkpointer that keeps what it is given (the real one: test_checkpointer)."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, newest: int | None = None):
        self.model, self.opt, self.newest = model, opt, newest
        self.written: list[tuple[dict[str, Any], Progress, list[Any]]] = []

    def newest_saved(self) -> Checkpoint | None:
        return None if self.newest is None else Checkpoint(self.newest, f"step-{self.newest}.pt")

    def live_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": None,
            "scaler": None,
            "objects": {},
        }

    def write_now(self, state: Mapping[str, Any], progress: Progress, rng: list[Any]) -> Path:
        # torch.save would copy; so does this (the live tensors go on changing after).
        copied = {
            "model": {k: v.clone() for k, v in state["model"].items()},
            "optimizer": state["optimizer"],
        }
        self.written.append((copied, progress, rng))
        return Path(f"step-{progress.step:08d}.pt")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=g)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _setup(world: int = 2, rank: int = 0, objects: dict[str, Any] | None = None) -> Any:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    writer = Writer(model, opt)
    tracked = Tracked(model=model, optimizer=opt, objects=objects or {})
    rescue = Rescue(
        tracked, writer, seed=7, rank=rank, world=world, device=torch.device("cpu"), model=model
    )
    return model, opt, writer, rescue


def test_the_last_completed_step_is_written_not_the_next_steps_forward() -> None:
    """Caught blocked in step 4's all-reduce (its forward has changed BatchNorm's running
    stats, nothing else): the checkpoint is step 3's, buffers as step 3 ended."""
    model, opt, writer, rescue = _setup()
    progress = Progress()
    for step in (1, 2, 3):
        progress.step = step
        _step(model, opt, step)
        rescue.completed(progress)
    at_3 = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(16, 4))  # step 4's forward: BatchNorm's running stats move
    assert not torch.equal(model.state_dict()["1.running_mean"], at_3["1.running_mean"])
    outcome = rescue.save(blamed=(1,))
    assert (outcome.step, outcome.why) == (3, None)
    [(state, saved, rng)] = writer.written
    assert saved.step == 3
    assert all(torch.equal(state["model"][k], at_3[k]) for k in at_3)
    assert len(rng) == 2  # every rank's streams, as step 4 begins
    assert torch.equal(rng[1]["torch"], step_rng_state(7, 4, 1)["torch"])


def test_a_rescue_during_an_update_waits_for_the_step_to_end_and_writes_that_step() -> None:
    """The training thread is inside ``optimizer.step()`` of step 4 when the fault is known:
    the rescue waits for step 4 to end, writes step 4, and the thread stays parked."""
    model, opt, writer, rescue = _setup()
    progress = Progress()
    for step in (1, 2, 3):
        progress.step = step
        _step(model, opt, step)
        rescue.completed(progress)
    inside, go_on = threading.Event(), threading.Event()

    def slow(*_: Any) -> None:  # a post-hook of its own: still inside the update
        inside.set()
        go_on.wait(5)

    opt.register_step_post_hook(slow)
    after: dict[str, torch.Tensor] = {}

    def train() -> None:
        progress.step = 4
        _step(model, opt, 4)
        after.update({k: v.clone() for k, v in model.state_dict().items()})
        rescue.completed(progress)
        _step(model, opt, 5)  # never: the rescue owns the state by now

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    assert inside.wait(5)
    threading.Timer(0.2, go_on.set).start()
    outcome = rescue.save(blamed=(1,))
    assert (outcome.step, outcome.why) == (4, None)
    [(state, saved, _)] = writer.written
    assert saved.step == 4
    assert all(torch.equal(state["model"][k], after[k]) for k in after)
    time.sleep(0.1)
    assert thread.is_alive()  # parked at step 4's end, never in step 5's update


def test_a_thread_that_never_ends_its_step_falls_back_with_the_reason() -> None:
    model, opt, writer, rescue = _setup()
    progress = Progress(step=1)
    _step(model, opt, 1)
    rescue.completed(progress)
    _step(model, opt, 2)  # updated, and then blocked before the step's end (a collective)
    outcome = rescue.save(blamed=(1,), wait_s=0.2)
    assert outcome.checkpoint is None
    assert outcome.why is not None
    assert "past the optimizer update of step 2" in outcome.why
    assert writer.written == []


def test_a_step_saved_already_is_not_written_again() -> None:
    _, _, writer, rescue = _setup()
    writer.newest = 1
    rescue.completed(Progress(step=1))
    outcome = rescue.save(blamed=(1,))
    assert (outcome.checkpoint, outcome.why) == ("step-1.pt", "step 1 is saved already")
    assert writer.written == []


def test_only_the_lowest_survivor_writes() -> None:
    assert writer_rank(4, (0, 2)) == 1
    assert writer_rank(2, (0, 1)) is None
    _, _, writer, rescue = _setup(world=3, rank=2)
    rescue.completed(Progress(step=1))
    assert rescue.save(blamed=(1,)).why is None
    assert writer.written == []  # rank 0 writes


def test_without_rank_0_what_only_it_holds_is_the_reason_to_fall_back() -> None:
    model, opt, writer, rescue = _setup(rank=1)
    progress = Progress(step=1)
    _step(model, opt, 1)
    rescue.completed(progress)
    fallback = rescue.save(blamed=(0,))
    why = fallback.why
    assert why is not None
    assert (fallback.step, fallback.checkpoint) == (1, None)  # the step the account redoes
    assert "rank 0 was lost" in why
    assert "1.running_mean" in why
    assert writer.written == []
    plain = nn.Linear(4, 1)
    opt2 = torch.optim.SGD(plain.parameters(), lr=0.1)
    alone = Rescue(Tracked(model=plain, optimizer=opt2), Writer(plain, opt2), seed=0, rank=1,
                   world=2, device=torch.device("cpu"), model=plain)  # fmt: skip
    assert alone.why_not((0,)) is None  # no buffers, no objects: rank 1 has it all
    ema = Rescue(Tracked(model=plain, optimizer=opt2, objects={"ema": plain}),
                 Writer(plain, opt2), seed=0, rank=1, world=2, device=torch.device("cpu"),
                 model=plain)  # fmt: skip
    assert "s.restore (ema)" in (ema.why_not((0,)) or "")
    one = Rescue(Tracked(model=plain), Writer(plain, opt2), seed=0, rank=0, world=1,
                 device=torch.device("cpu"), model=plain)  # fmt: skip
    assert one.why_not((0,)) == "a world of one rank has no survivor"


def test_no_completed_step_means_nothing_to_write() -> None:
    _, _, _writer, rescue = _setup()
    assert rescue.save(blamed=(1,)).why == "no step was completed in this launch"


def test_the_step_streams_are_what_a_rank_would_have_seeded() -> None:
    seeds = StepSeeds(11, 3, torch.device("cpu"))
    seeds.seed_step(42)
    state = step_rng_state(11, 42, 3)
    assert torch.equal(torch.get_rng_state(), state["torch"])
    version, words, gauss = random.getstate()
    assert [version, list(words), gauss] == state["python"]
    keys: Any = np.random.get_state(legacy=True)
    assert keys[1].tolist() == state["numpy"][1]
    other = step_rng_state(11, 42, 2)
    assert not torch.equal(other["torch"], state["torch"])  # each rank its own stream
    g = torch.Generator()
    g.set_state(state["torch"])
    assert torch.equal(torch.rand(3), torch.rand(3, generator=g))  # the draws a rank makes
