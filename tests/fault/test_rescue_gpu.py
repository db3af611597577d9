"""The survivor's save on a real GPU: its copy to host memory waits for the completed step's
kernels, and never for what is queued after them.

Under NCCL, a peer that hangs leaves the survivor's next collective on the GPU forever, and
every kernel queued behind it (the next step's backward, its update) waits with it. The rescue
copies the state on a side stream behind an event recorded as the step ended
(:func:`hpc_ddp.fault.rescue._to_host`); a copy on the training stream, or a device-wide
synchronize, would never return. One GPU cannot hold two NCCL ranks, so the hung collective is
stood in for by a kernel that spins on the training stream (``torch.cuda._sleep``) for longer
than the test allows the save, followed by the next step's update.

Their first run on an H200 (torch 2.11) found the save waiting for the stand-in: a process's
first ``torch.cuda.Stream()`` waits for the device's queued kernels, and so does a copy to
pageable host memory issued behind an event not yet reached. The rescue now makes its stream
when the launch starts and waits on the host, bounded, for the step's event before it copies.

These tests need a CUDA GPU (``bash benchmarks/device_check.sh`` on a lent one; CI has none and
skips them). The CPU path of the same code is ``test_rescue.py``; the whole path on CPU ranks,
``test_faults_e2e.py``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.fault.rescue import GPU_STEP_WAIT_S, Rescue
from hpc_ddp.runtime.progress import Progress
from tests.fault.test_rescue import Writer

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HUNG_S = 12.0
"""How long the stand-in for a hung collective holds the training stream."""
SAVE_LIMIT_S = 3.0
"""The rescue's copy must be done well before that (a few ms are expected)."""


def _rescue(
    momentum: float = 0.0, rank: int = 0
) -> tuple[nn.Module, torch.optim.Optimizer, Writer, Rescue]:
    """A model on the GPU, its optimizer, the rescue of rank ``rank`` of 2 and its writer."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    writer = Writer(model, opt)
    rescue = Rescue(
        Tracked(model=model, optimizer=opt, objects={}),
        writer,
        seed=7,
        rank=rank,
        world=2,
        device=torch.device("cuda"),
        model=model,
    )
    return model, opt, writer, rescue


def _cycles_per_second() -> float:
    """The spin kernel's cycles per second on this GPU (its clock, measured once it is up: an
    idle H200 clocks at 345 MHz, a busy one at ~1980)."""
    rate = 0.0
    for _ in range(2):
        cycles = 1_000_000_000
        start = time.perf_counter()
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        rate = cycles / (time.perf_counter() - start)
    return rate


class Hang:
    """A kernel that holds the current stream for about ``seconds``, as a collective whose peer
    never comes holds it; timed on the GPU itself (:attr:`lasted_s`, once it ended)."""

    def __init__(self, seconds: float, rate: float) -> None:
        self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._start.record()
        torch.cuda._sleep(int(seconds * rate))  # type: ignore[no-untyped-call]
        self._end.record()

    def running(self) -> bool:
        return bool(self._start.query()) and not self._end.query()  # type: ignore[no-untyped-call]

    @property
    def lasted_s(self) -> float:
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / 1000


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.Linear(256, 8)).cuda()


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(32, 64, device="cuda", generator=g)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _on_host(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in state.items()}


def test_the_save_waits_for_the_step_and_not_for_the_hung_collective_behind_it() -> None:
    rate = _cycles_per_second()
    model, opt, writer, rescue = _rescue(momentum=0.9)
    twin = _model()
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    progress = Progress()
    for step in (1, 2):
        progress.step = step
        _step(model, opt, step)
        _step(twin, twin_opt, step)
        rescue.completed(progress)
    # Step 3's own kernels are slow (1 s): the save must wait for them, not take step 2.
    _step(twin, twin_opt, 3)
    expected = _on_host(twin.state_dict())
    torch.cuda.synchronize()
    slow = Hang(1.0, rate)
    progress.step = 3
    _step(model, opt, 3)
    rescue.completed(progress)
    # Step 4: its forward moves BatchNorm's running stats, then its all-reduce hangs, and its
    # update waits behind it.
    model(torch.randn(32, 64, device="cuda"))
    hung = Hang(HUNG_S, rate)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    start = time.perf_counter()
    outcome = rescue.save(blamed=(1,))
    took = time.perf_counter() - start
    still_hung = hung.running()
    print(
        f"rescue copy: {took * 1000:.1f} ms, behind step 3's {slow.lasted_s:.2f} s and before "
        f"the hang's {hung.lasted_s:.2f} s ended (still hung then: {still_hung}; spin "
        f"{rate / 1e9:.2f} GHz)"
    )
    torch.cuda.synchronize()  # let the stand-in end before the test does

    assert (outcome.step, outcome.why) == (3, None)
    assert took < SAVE_LIMIT_S, f"the rescue's copy took {took:.2f} s: it waited for the hang"
    assert still_hung, "the stand-in for the hung collective ended before the save did"
    [(state, saved, _)] = writer.written
    assert saved.step == 3
    for name, value in expected.items():
        got = state["model"][name]
        assert got.device.type == "cpu", name
        torch.testing.assert_close(got, value, rtol=0, atol=1e-6, msg=name)
    momentum = state["optimizer"]["state"][0]["momentum_buffer"]
    assert momentum.device.type == "cpu"
    torch.testing.assert_close(
        momentum, twin_opt.state_dict()["state"][0]["momentum_buffer"].cpu(), rtol=0, atol=1e-6
    )


def test_a_step_whose_work_never_ends_on_the_gpu_is_given_up_not_waited_for() -> None:
    """The host ran a step ahead of a GPU now stuck: the published step's own work waits
    behind the hung collective. The rescue gives it up after GPU_STEP_WAIT_S and says why."""
    rate = _cycles_per_second()
    model, opt, writer, rescue = _rescue()
    progress = Progress()
    progress.step = 1
    _step(model, opt, 1)
    rescue.completed(progress)
    hung = Hang(HUNG_S, rate)  # step 2's all-reduce never ends; its update waits behind it
    progress.step = 2
    _step(model, opt, 2)
    rescue.completed(progress)

    start = time.perf_counter()
    outcome = rescue.save(blamed=(1,))
    took = time.perf_counter() - start
    still_hung = hung.running()
    torch.cuda.synchronize()

    assert outcome.checkpoint is None
    assert outcome.why is not None
    assert "GPU did not end step 2" in outcome.why
    assert writer.written == []
    assert still_hung
    assert GPU_STEP_WAIT_S <= took < GPU_STEP_WAIT_S + 1.0


def test_rank_0_lost_is_told_from_the_buffers_without_waiting_for_the_hang() -> None:
    """Rank 1 writes when rank 0 is lost; whether a step changed rank 0's buffers is read from
    its own copy on the GPU, behind the same event."""
    rate = _cycles_per_second()
    model, opt, _, rescue = _rescue(rank=1)
    progress = Progress()
    progress.step = 1
    _step(model, opt, 1)
    rescue.completed(progress)
    hung = Hang(HUNG_S, rate)

    start = time.perf_counter()
    outcome = rescue.save(blamed=(0,))
    took = time.perf_counter() - start
    still_hung = hung.running()
    print(f"rank 0's loss told in {took * 1000:.1f} ms, the hang {hung.lasted_s:.2f} s")
    torch.cuda.synchronize()
    assert still_hung

    assert outcome.checkpoint is None
    assert outcome.why is not None
    assert "buffers a step changes" in outcome.why
    assert took < SAVE_LIMIT_S, f"telling rank 0's loss took {took:.2f} s"


def test_publishing_a_step_costs_microseconds_and_no_host_read() -> None:
    """``completed`` runs on the training thread every step: an event and a buffer copy
    queued, nothing waited for."""
    rate = _cycles_per_second()
    _, _, _, rescue = _rescue()
    progress = Progress()
    Hang(2.0, rate)  # a host read would wait for this
    start = time.perf_counter()
    for step in range(1, 201):
        progress.step = step
        rescue.completed(progress)
    each = (time.perf_counter() - start) / 200
    torch.cuda.synchronize()
    assert each < 0.005, f"publishing a step took {each * 1e6:.0f} us: it waited on the GPU"
    print(f"publishing a step on the GPU: {each * 1e6:.1f} us")
