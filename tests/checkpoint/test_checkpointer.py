"""The session's side of checkpoints across ranks: rank 0's file I/O never holds a collective
open (the others wait on the rendezvous store, bounded by ``fault.checkpoint_timeout_s``), and
a resume loads to the CPU and leaves placement to ``load_state_dict``.

The slow-I/O tests run real gloo ranks with ``dist.timeout_s: 3`` and a rank 0 whose checkpoint
writes and loads take 6 s: before the hand-off, the others waited in a broadcast, and gloo cut
them off after 3 s ("Timed out waiting 3000ms for recv"; under NCCL the watchdog would have
killed them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.checkpoint.checkpointer import Checkpointer, SavedNote
from hpc_ddp.checkpoint.format import list_checkpoints
from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import HpcDdpError, PeerError
from hpc_ddp.runtime.handoff import Handoff
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.sessions.session import Session
from tests.helpers.launch import HELPERS, run_ranks

pytestmark = pytest.mark.torch

SLOW_IO = str(HELPERS / "slow_io.py")


# --- the hand-off itself, over a real store ----------------------------------------------------


def _ranks(world: int, store: object, timeout_s: float = 5.0) -> list[Handoff]:
    return [Handoff(store, rank=r, world_size=world, timeout_s=timeout_s) for r in range(world)]


def _run_all(work: list[object]) -> list[object]:
    """Run each rank's callable on its own thread; their results (or exceptions)."""
    out: list[object] = [None] * len(work)

    def run(i: int) -> None:
        try:
            out[i] = work[i]()  # type: ignore[operator]
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def test_share_and_meet_carry_rank_0s_word_and_the_first_error() -> None:
    store = dist.HashStore()  # type: ignore[attr-defined]
    ranks = _ranks(3, store)
    shared = _run_all([lambda h=h: h.share("choice", ["step-2.pt", None]) for h in ranks])
    assert shared == [["step-2.pt", None]] * 3
    errors = [None, "disk on fire", None]
    pairs = zip(ranks, errors, strict=True)
    met = _run_all([lambda h=h, e=e: h.meet("reads", e) for h, e in pairs])
    assert met == ["rank 1: disk on fire"] * 3
    assert _run_all([lambda h=h: h.meet("again") for h in ranks]) == [None] * 3


def test_a_rank_that_waits_too_long_says_for_what_and_how_to_fix_it() -> None:
    store = dist.HashStore()  # type: ignore[attr-defined]
    waiting = Handoff(store, rank=1, world_size=2, timeout_s=0.2)
    with pytest.raises(PeerError) as err:
        waiting.share("rank 0's checkpoint write")
    message = str(err.value)
    assert "rank 1 waited for rank 0's checkpoint write and gave up" in message
    assert "HINT:" in message
    assert "fault.checkpoint_timeout_s" in message


def test_one_rank_needs_no_store() -> None:
    alone = Handoff(None, rank=0, world_size=1, timeout_s=1)
    assert alone.share("x", 3) == 3
    assert alone.meet("y", "oops") == "oops"


def test_values_travel_as_json_not_pickles() -> None:
    store = dist.HashStore()  # type: ignore[attr-defined]
    Handoff(store, rank=0, world_size=2, timeout_s=1).share("v", {"a": [1, None]})
    assert store.get("hpc-ddp/handoff/1/v") == b'{"a": [1, null]}'


# --- what a save tells its owner ---------------------------------------------------------------


def test_each_step_saved_is_told_once_when_durable_and_nothing_is_saved_untracked(
    tmp_path: Path,
) -> None:
    """Rank 0 tells ``on_saved`` (the session: the ledger's ``checkpoint`` line) of each step
    saved once, with the time it was asked for and how long training waited; a second save of
    a step tells nothing. Before ``restore`` names what to save, a save is refused."""
    told: list[SavedNote] = []
    ckpt = Checkpointer(
        tmp_path, JobConfig(name="t"), rank=0, world_size=1, device=torch.device("cpu"),
        on_saved=told.append,
    )  # fmt: skip
    with pytest.raises(HpcDdpError, match=r"nothing to checkpoint\. HINT: .*restore"):
        ckpt.save(Progress(step=1))
    assert ckpt.restore(Tracked(nn.Linear(3, 2)), Progress()) is None  # a first run
    asked = time.time()
    for step in (2, 2, 3):
        ckpt.save(Progress(step=step), note=f"n{step}")
    ckpt.wait(together=True)  # the writes, and what was queued after them
    assert [n.step for n in told] == [2, 3]
    assert [n.note for n in told] == ["n2", "n3"]  # as passed with the save that was told
    assert all(n.stall_s >= 0.0 and asked <= n.asked_at <= time.time() for n in told)
    # W runs until the file is durable, past the stall (the write is in the background).
    assert all(n.durable_s >= n.stall_s and n.durable_s > 0 for n in told)
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 3]


# --- real ranks, rank 0's checkpoint I/O slower than dist.timeout_s ----------------------------


def _slow_run(
    run_dir: Path,
    total: int,
    *,
    write_s: float,
    load_s: float,
    io_timeout_s: int = 60,
    late_s: float = 0.0,
    late_at: str = "model",
) -> list[tuple[int, str, str]]:
    argv = [SLOW_IO, str(run_dir), str(total), str(write_s), str(load_s), "3", str(io_timeout_s),
            str(late_s), late_at]  # fmt: skip
    return run_ranks(argv, 2, timeout=180)


def _results(ranks: list[tuple[int, str, str]]) -> list[dict[str, object]]:
    for rank, (code, _, err) in enumerate(ranks):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-3000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in ranks]


def test_slow_checkpoint_writes_and_loads_outlast_the_collective_timeout(tmp_path: Path) -> None:
    """Writes of 6 s (every 2 steps, waited for at the next save and at the end) and a resume
    whose load takes 6 s, with dist.timeout_s 3: the run finishes, every rank with the same
    weights, and equal to an uninterrupted run's."""
    first = _results(_slow_run(tmp_path / "run", 4, write_s=6, load_s=0))
    assert [r["step"] for r in first] == [4, 4]
    assert first[0]["digest"] == first[1]["digest"]
    resumed = _results(_slow_run(tmp_path / "run", 6, write_s=0, load_s=6))
    assert [r["resumed_from"] for r in resumed] == [4, 4]
    assert resumed[0]["digest"] == resumed[1]["digest"]
    whole = _results(_slow_run(tmp_path / "whole", 6, write_s=0, load_s=0))
    assert resumed[0]["digest"] == whole[0]["digest"]
    assert [i.step for i in list_checkpoints(tmp_path / "run", verify=True)] == [2, 4, 6]


def test_a_rank_later_than_dist_timeout_to_its_first_collective_is_waited_for(
    tmp_path: Path,
) -> None:
    """dist.timeout_s 3 bounds the training steps' collectives, not the start-up's: a rank that
    builds its model 6 s after its peer (a busy node) meets it in DDP's first broadcast, under
    fault.startup_timeout_s, and both train to the end."""
    done = _results(_slow_run(tmp_path / "run", 4, write_s=0, load_s=0, late_s=6))
    assert [r["step"] for r in done] == [4, 4]
    assert done[0]["digest"] == done[1]["digest"]
    # Once the first step has ended, dist.timeout_s is the bound again.
    (code, _, err), _ = _slow_run(tmp_path / "late", 4, write_s=0, load_s=0, late_s=6,
                                  late_at="step")  # fmt: skip
    assert code != 0
    assert "Timed out" in err, err[-2000:]


def test_rank_0_io_past_the_checkpoint_timeout_fails_every_rank_and_says_why(
    tmp_path: Path,
) -> None:
    """Rank 1 gives up on the step-2 write at the step-4 save; rank 0 then finds its peer gone
    in the next step's all-reduce. Neither hangs, neither ends as if all went well."""
    ranks = _slow_run(tmp_path / "run", 6, write_s=4, load_s=0, io_timeout_s=1)
    assert all(code != 0 for code, _, _ in ranks), [c for c, _, _ in ranks]
    err = ranks[1][2]
    assert "rank 1 waited for rank 0's checkpoint write and gave up" in err
    assert "raise fault.checkpoint_timeout_s" in err


# --- where a resume puts things ---------------------------------------------------------------


def _optimizer_state_devices(opt: torch.optim.Optimizer) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                found.setdefault(key, set()).add(value.device.type)
    return found


def _adamw_on(device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    return model, torch.optim.AdamW(model.parameters(), foreach=True)


def _one_step(model: nn.Module, opt: torch.optim.Optimizer, device: str) -> None:
    model(torch.randn(5, 8, device=device)).sum().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.usefixtures("own_process")
def test_a_resume_loads_to_the_cpu_and_leaves_placement_to_load_state_dict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: restore loaded with map_location=<the rank's GPU>, so AdamW's step counters
    stayed on the GPU (two .item() syncs per parameter per step, for the rest of the attempt)
    and the GPU briefly held the state twice. 'meta' stands in for 'cuda' here: torch's
    placement code is the same for every device that is not the CPU."""
    with Session(tmp_path, JobConfig(name="t"), env={}) as s:  # a one-rank group, on the CPU
        model, opt = _adamw_on("cpu")
        s.restore(model=model, optimizer=opt)
        _one_step(model, opt, "cpu")
        s.progress.step = 1
        s.checkpoint(wait=True)
        fresh_model, fresh = _adamw_on("meta")
        _one_step(fresh_model, fresh, "meta")
        resumed_model, resumed = _adamw_on("meta")
        reader = Checkpointer(
            s.paths.checkpoints, s.config, rank=0, world_size=1, device=torch.device("meta")
        )
        loads: list[object] = []
        real_load = torch.load

        def spy(*args: object, **kwargs: object) -> object:
            loads.append(kwargs.get("map_location"))
            return real_load(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(torch, "load", spy)
        assert reader.restore(Tracked(resumed_model, resumed), Progress()) is not None
    assert loads == ["cpu"]
    expected = {"step": {"cpu"}, "exp_avg": {"meta"}, "exp_avg_sq": {"meta"}}
    assert _optimizer_state_devices(fresh) == expected
    assert _optimizer_state_devices(resumed) == expected


# --- identity: the run and config a checkpoint belongs to ------------------------------------


def _saved_at(run_dir: Path, steps: list[int], config: JobConfig | None = None) -> str:
    """A one-rank session in ``run_dir`` that saves at ``steps``; its run id."""
    with Session(run_dir, config or JobConfig(name="t"), env={}) as s:
        model = nn.Linear(3, 2)
        s.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        for step in steps:
            s.progress.step = step
            s.checkpoint(wait=True)
        return s.run_id


def _restored(run_dir: Path, config: JobConfig | None = None) -> int:
    with Session(run_dir, config or JobConfig(name="t"), env={}) as s:
        model = nn.Linear(3, 2)
        s.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return s.progress.step


@pytest.mark.usefixtures("own_process")
def test_every_checkpoint_records_its_run_and_config(tmp_path: Path) -> None:
    from hpc_ddp.config.load import job_config_to_dict
    from hpc_ddp.rundir.checkpoint_label import config_digest, read_label

    run_id = _saved_at(tmp_path, [4])
    [info] = list_checkpoints(tmp_path)
    label = read_label(info.path)
    assert (info.run_id, label.run_id, label.step) == (run_id, run_id, 4)
    assert label.config_digest == config_digest(job_config_to_dict(JobConfig(name="t")))


@pytest.mark.usefixtures("own_process")
def test_another_runs_newer_checkpoint_is_never_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = _saved_at(tmp_path / "mine", [10, 20])
    theirs = _saved_at(tmp_path / "theirs", [30])
    name = "step-00000030.pt"
    (tmp_path / "mine/checkpoints" / name).write_bytes(
        (tmp_path / "theirs/checkpoints" / name).read_bytes()
    )
    with caplog.at_level(logging.WARNING, logger="hpc_ddp"):
        assert _restored(tmp_path / "mine") == 20
    assert f"written by run {theirs}, not by this run ({mine})" in caplog.text
    states = {i.step: i.state.value for i in list_checkpoints(tmp_path / "mine", run_id=mine)}
    assert states == {10: "ok", 20: "ok", 30: "stranger"}


@pytest.mark.usefixtures("own_process")
def test_a_resume_with_a_changed_config_says_what_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = JobConfig(name="t")
    _saved_at(tmp_path, [10], before)
    longer = dataclasses.replace(before.train, max_steps=500, keep_last=9)
    with caplog.at_level(logging.WARNING, logger="hpc_ddp"):
        assert _restored(tmp_path, dataclasses.replace(before, train=longer)) == 10
    assert "changed config" not in caplog.text  # how long it runs shapes no state
    faster = dataclasses.replace(before.train, lr=0.3, grad_accum=2)
    with caplog.at_level(logging.WARNING, logger="hpc_ddp"):
        assert _restored(tmp_path, dataclasses.replace(before, train=faster)) == 10
    assert (
        "resuming from step-00000010.pt with a changed config (train.grad_accum: 1 -> 2; "
        "train.lr: 0.05 -> 0.3)" in caplog.text
    )
