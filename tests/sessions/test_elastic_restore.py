"""A session restoring a checkpoint of another world size (one real process, gloo): only a loop
that says it adapts (``elastic=True``), only with the accumulation that keeps the global
batch; then the RNG is reseeded from (seed, step, rank) and the ledger's start says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint.format import build_payload, capture_rng_state
from hpc_ddp.checkpoint.snapshot import snapshot
from hpc_ddp.checkpoint.writer import write_checkpoint
from hpc_ddp.config.elastic import Resize
from hpc_ddp.config.model import JobConfig, SlurmConfig, TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.sampler import reseed_rng
from hpc_ddp.sessions.session import Session

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("own_process")]

CPU = torch.device("cpu")
SEED = 11


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def two_rank_checkpoint(directory: Path, *, grad_accum: int | None = 1, batch: int = 3) -> None:
    """What 2 ranks accumulating ``grad_accum`` wrote at step 7, mid-epoch."""
    rng = capture_rng_state(CPU)
    progress = Progress(step=7, epoch=1, batch_in_epoch=batch, samples_in_epoch=batch * 2 * 8)
    payload = build_payload(
        model=snapshot(model().state_dict()),
        progress=progress,
        rng=[rng, rng],
        grad_accum=grad_accum,
    )
    write_checkpoint(directory / "checkpoints", payload, 0)


def session(tmp_path: Path, grad_accum: int) -> Session:
    cfg = JobConfig(name="t", train=TrainConfig(grad_accum=grad_accum, seed=SEED))
    return Session(tmp_path, cfg, env={})


def test_a_loop_that_does_not_say_it_adapts_is_refused_another_world_size(tmp_path: Path) -> None:
    two_rank_checkpoint(tmp_path)
    with pytest.raises(ConfigError) as err, session(tmp_path, 2) as s:
        s.restore(model=s.wrap(model()))
    said = str(err.value)
    assert "step-00000007.pt was written by 2 ranks and this run has 1" in said
    assert "HINT: run `s.grad_accum` micro-batches per optimizer step" in said
    assert "pass `elastic=True` to `s.restore(...)`" in said


def test_an_accumulation_that_would_change_the_global_batch_is_refused(tmp_path: Path) -> None:
    two_rank_checkpoint(tmp_path)
    with pytest.raises(ConfigError) as err, session(tmp_path, 1) as s:
        s.restore(model=s.wrap(model()), elastic=True)
    said = str(err.value)
    assert "global batch of 2 ranks x accumulation 1, which needs accumulation 2 at 1 ranks" in said
    assert "but this run accumulates 1" in said
    assert "HINT: resume with `hpc-ddp resume RUN_DIR slurm.nodes=N --elastic`" in said


def test_an_older_checkpoint_mid_epoch_cannot_be_dealt_out_anew(tmp_path: Path) -> None:
    """A position counted in batches of 2 ranks (no samples_in_epoch, an hpc-ddp before it)."""
    rng = capture_rng_state(CPU)
    old = Progress(step=7, epoch=1, batch_in_epoch=3)
    payload = build_payload(model=snapshot(model().state_dict()), progress=old, rng=[rng, rng])
    write_checkpoint(tmp_path / "checkpoints", payload, 0)
    batches = "counted the data position in batches of 2 ranks"
    with pytest.raises(ConfigError, match=batches), session(tmp_path, 2) as s:
        s.restore(model=s.wrap(model()), elastic=True)


def test_an_elastic_restore_keeps_the_position_reseeds_and_records_the_resize(
    tmp_path: Path,
) -> None:
    two_rank_checkpoint(tmp_path)
    with session(tmp_path, 2) as s:
        assert s.grad_accum == 2  # the config's: `resume --elastic` set it
        restored = s.restore(model=s.wrap(model()), elastic=True)
        assert restored is not None
        assert (s.progress.step, s.progress.epoch, s.progress.samples_in_epoch) == (7, 1, 48)
        assert s.resize == Resize(2, 1, 1, 2)
        drawn = torch.rand(3)
        reseed_rng(SEED, 7, 0)
        assert torch.equal(drawn, torch.rand(3))  # reseeded from (seed, step, rank)
        s.progress.step += 1  # a step trained at the new size
        s.checkpoint(wait=True)
    [start] = read_ledger(tmp_path / "ledger.jsonl")
    assert (start.world_size, start.grad_accum, start.resize) == (1, 2, Resize(2, 1, 1, 2))
    saved = torch.load(tmp_path / "checkpoints" / "step-00000008.pt", weights_only=True)
    # The next resize starts from this run's shape.
    assert (saved["meta"]["world_size"], saved["meta"]["grad_accum"]) == (1, 2)


def test_a_min_nodes_run_that_got_fewer_ranks_accumulates_more(tmp_path: Path) -> None:
    """No checkpoint: 1 rank of the 2 that slurm.nodes x tasks_per_node ask for."""
    cfg = JobConfig(
        name="t", slurm=SlurmConfig(nodes=2, min_nodes=1), train=TrainConfig(grad_accum=3)
    )
    with Session(tmp_path, cfg, env={}) as s:
        assert s.grad_accum == 6
        with pytest.raises(ConfigError, match="each rank must accumulate 6 micro-batches"):
            s.restore(model=s.wrap(model()))
        assert s.restore(model=s.wrap(model()), elastic=True) is None
        assert s.loader(list(range(100)), batch_size=4).epoch_samples == 96  # whole steps of 24
