"""Datasets and resumable data order: same samples everywhere, exact mid-epoch continuation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.sampler import ResumableLoader, ResumableSampler, mix_seed, remainder_shard
from hpc_ddp.train.data import SyntheticImages, build_dataset

pytestmark = pytest.mark.torch

N = 50
INDEX_DATA = TensorDataset(torch.arange(N))


def loader(progress: Progress, rank: int = 0, world: int = 2, **kw: Any) -> ResumableLoader:
    return ResumableLoader(
        INDEX_DATA, progress, batch_size=4, num_replicas=world, rank=rank, seed=7, **kw
    )


def take(batches: Any, n: int) -> list[list[int]]:
    return [next(batches)[0].tolist() for _ in range(n)]


def test_synthetic_is_deterministic_and_split() -> None:
    a = SyntheticImages(64, 10, 8, seed=1)
    b = SyntheticImages(64, 10, 8, seed=1)
    x, y = a[5]
    assert x.shape == (3, 8, 8)
    assert 0 <= y < 10
    assert torch.equal(x, b[5][0])
    assert y == b[5][1]
    assert not torch.equal(x, SyntheticImages(64, 10, 8, seed=2)[5][0])
    val = SyntheticImages(64, 10, 8, seed=1, train=False)
    assert torch.equal(val.prototypes, a.prototypes)
    assert not torch.equal(val[5][0], x)


def test_synthetic_is_learnable() -> None:
    """The nearest prototype classifies most samples: there is signal to learn."""
    ds = SyntheticImages(200, 10, 8, seed=0, train=False)
    correct = 0
    for i in range(len(ds)):
        x, y = ds[i]
        dist = ((ds.prototypes - x) ** 2).flatten(1).sum(1)
        correct += int(dist.argmin()) == y
    assert correct / len(ds) > 0.9


def test_shards_cover_the_epoch_and_epochs_differ() -> None:
    def epoch_of(rank: int, epoch: int) -> list[int]:
        s = ResumableSampler(INDEX_DATA, num_replicas=2, rank=rank, seed=7)
        s.set_epoch(epoch)
        return list(s)

    e0 = epoch_of(0, 0) + epoch_of(1, 0)
    assert set(e0) == set(range(N))
    assert len(e0) == N  # 50 splits evenly: no padding duplicates
    assert epoch_of(0, 1) != epoch_of(0, 0)


@pytest.mark.parametrize("cut", [1, 3, 6, 7, 8, 13])  # 6 batches/epoch: ends, mid, boundary
@pytest.mark.parametrize("rank", [0, 1])
def test_resume_continues_exactly(cut: int, rank: int) -> None:
    whole = take(loader(Progress(), rank).forever(), 20)
    progress = Progress()
    first = take(loader(progress, rank).forever(), cut)
    saved = Progress(epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch)
    rest = take(loader(saved, rank).forever(), 20 - cut)
    assert first + rest == whole


def test_progress_counts_batches_and_rolls_over() -> None:
    p = Progress()
    lo = loader(p)
    assert len(lo) == 6  # 25 indices per rank // 4
    assert len(list(lo)) == 6
    assert (p.epoch, p.batch_in_epoch) == (1, 0)
    p2 = Progress(epoch=0, batch_in_epoch=6)  # saved right after an epoch's last batch
    assert len(list(loader(p2))) == 6
    assert p2.epoch == 2


def test_multiple_of_trims_the_epoch() -> None:
    assert len(loader(Progress(), multiple_of=4)) == 4


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_the_order_at_the_start_of_an_epoch_is_distributed_samplers(world: int) -> None:
    """The same permutation and deal as torch's DistributedSampler (less its padding, which
    whole steps never reach)."""
    from torch.utils.data import DistributedSampler

    for rank in range(world):
        theirs: DistributedSampler[Any] = DistributedSampler(
            INDEX_DATA, num_replicas=world, rank=rank, seed=7
        )
        theirs.set_epoch(3)
        ours = ResumableSampler(INDEX_DATA, num_replicas=world, rank=rank, seed=7)
        ours.set_epoch(3)
        mine = list(ours)
        assert mine == list(theirs)[: len(mine)]
        assert len(mine) == len(range(rank, N, world))


@pytest.mark.parametrize("start", [0, 8, 24, 48])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_remainder_is_dealt_so_that_each_round_is_the_next_block(
    start: int, world: int
) -> None:
    """Pure: over all ranks, the k-th index of every share is order[start + k*world ...]: a
    step takes the same block of the permutation at any world size."""
    order = [(i * 37) % 101 for i in range(101)]  # any order
    shares = [remainder_shard(order, start=start, world=world, rank=r) for r in range(world)]
    dealt = [share[k] for k in range(len(shares[-1])) for share in shares]
    assert dealt == order[start : start + len(dealt)]
    assert sorted(i for share in shares for i in share) == sorted(order[start:])  # each, once
    capped = remainder_shard(order, start=start, world=world, rank=0, count=2)
    assert capped == shares[0][:2]
    with pytest.raises(ValueError, match=f"rank {world} is not in a world of {world}"):
        remainder_shard(order, start=start, world=world, rank=world)


def _steps(world: int, accum: int, progresses: list[Progress], steps: int) -> list[list[int]]:
    """``steps`` optimizer steps of ``world`` ranks x ``accum`` batches of 4: each step's
    samples (sorted), every rank's loader going on from its own progress."""
    batches = [
        loader(progresses[r], rank=r, world=world, multiple_of=accum).forever()
        for r in range(world)
    ]
    out = []
    for _ in range(steps):
        step = [i for b in batches for _ in range(accum) for i in next(b)[0].tolist()]
        out.append(sorted(step))
    return out


@pytest.mark.parametrize(
    ("before", "after", "cut"),
    [
        ((2, 1), (1, 2), 3),  # 2 ranks x 4 x 1 -> 1 rank x 4 x 2, mid-epoch
        ((2, 1), (1, 2), 6),  # at the epoch's end: the next epoch starts
        ((2, 1), (1, 2), 8),  # in the second epoch
        ((1, 3), (3, 1), 2),  # 1 rank x 4 x 3 -> 3 ranks x 4 x 1
        ((2, 2), (4, 1), 1),
    ],
)
def test_an_elastic_resume_sees_every_sample_of_the_epoch_once_in_the_same_steps(
    before: tuple[int, int], after: tuple[int, int], cut: int
) -> None:
    """The step-by-step samples of a run that changed world size (keeping the global batch)
    at step ``cut`` equal the uninterrupted run's: the same blocks, so the same multiset of
    samples over each epoch and the whole run."""
    (w0, a0), (w1, a1) = before, after
    assert w0 * a0 == w1 * a1
    total = 14  # 50 samples, 8 or 12 per step: two or three epochs and a bit
    whole = _steps(w0, a0, [Progress() for _ in range(w0)], total)
    ranks = [Progress() for _ in range(w0)]
    first = _steps(w0, a0, ranks, cut)
    saved = ranks[0]  # every rank's position is the same: rank 0 saves it
    assert {(p.epoch, p.samples_in_epoch) for p in ranks} == {(saved.epoch, saved.samples_in_epoch)}
    resumed = [Progress(epoch=saved.epoch, batch_in_epoch=saved.batch_in_epoch,
                        samples_in_epoch=saved.samples_in_epoch) for _ in range(w1)]  # fmt: skip
    rest = _steps(w1, a1, resumed, total - cut)
    assert first + rest == whole
    per_epoch = len(INDEX_DATA) // (4 * w0 * a0)
    for e in range(total // per_epoch):
        seen = sorted(i for step in whole[e * per_epoch : (e + 1) * per_epoch] for i in step)
        assert len(seen) == len(set(seen)) == per_epoch * 4 * w0 * a0  # each sample once


def test_a_position_without_a_sample_count_is_read_at_the_world_that_wrote_it() -> None:
    """A checkpoint of an older hpc-ddp has batch_in_epoch only: at its own world size the
    loader goes on as before."""
    p = Progress()
    first = take(loader(p).forever(), 2)
    old = Progress(epoch=p.epoch, batch_in_epoch=p.batch_in_epoch)  # no samples_in_epoch
    assert take(loader(old).forever(), 2) == take(loader(Progress()).forever(), 4)[2:]
    assert first == take(loader(Progress()).forever(), 2)
    assert old.samples_in_epoch == 4 * 4 * 2  # counted from here on


def test_loading_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    take(loader(Progress()).forever(), 10)
    assert torch.equal(torch.get_rng_state(), before)


def test_workers_give_the_same_batches() -> None:
    plain = take(loader(Progress()).forever(), 8)
    assert take(loader(Progress(), num_workers=2).forever(), 8) == plain


def test_mix_seed_is_stable() -> None:
    assert mix_seed(1, 2) == mix_seed(1, 2)
    assert mix_seed(1, 2) != mix_seed(2, 1)
    assert 0 <= mix_seed(2**70, -1) < 2**63


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (TrainConfig(dataset="cifar"), "did you mean 'cifar10'"),
        (TrainConfig(dataset="cifar10"), "data_root is not set"),
        (TrainConfig(dataset="mnist", data_root="/nonexistent"), "download=True"),
        (TrainConfig(dataset="imagefolder", data_root="/nonexistent"), "train/"),
        (TrainConfig(dataset="no_such_module_xyz:fn"), "cannot import"),
        (TrainConfig(dataset="tests.helpers.user_code:nope"), "no attribute 'nope'"),
    ],
)
def test_dataset_errors_say_how_to_fix(cfg: TrainConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_dataset(cfg, train=True)
    assert "HINT" in str(err.value)


def test_user_dataset_from_import_string() -> None:
    cfg = TrainConfig(dataset="tests.helpers.user_code:dataset", image_size=4)
    train = build_dataset(cfg, train=True)
    assert train is not None
    assert train[0][0].shape == (3, 4, 4)
    assert build_dataset(cfg, train=False) is None


def test_imagefolder(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2):
                image.new("RGB", (10, 12), (i * 100, 0, 0)).save(
                    tmp_path / split / cls / f"{i}.png"
                )
    cfg = TrainConfig(dataset="imagefolder", data_root=str(tmp_path), num_classes=2, image_size=8)
    train = build_dataset(cfg, train=True)
    assert train is not None
    x, y = train[0]
    assert x.shape == (3, 8, 8)
    assert y in (0, 1)
    with pytest.raises(ConfigError, match="num_classes: 2"):
        build_dataset(TrainConfig(dataset="imagefolder", data_root=str(tmp_path)), train=True)


seen_roots: list[str | None] = []


def recording_dataset(cfg: TrainConfig, train: bool) -> None:
    """A user dataset function that only records the ``data_root`` it was given."""
    del train
    seen_roots.append(cfg.data_root)


def test_data_root_is_expanded_on_the_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/scratch/$USER/data`` (as jobs/resnet18-cifar10.yaml ships it) and ``~`` are expanded
    with the task's environment, for the built-in datasets and for a user's function."""
    image = pytest.importorskip("PIL.Image")
    for cls in ("cat", "dog"):
        (tmp_path / "alice" / "imgs" / "train" / cls).mkdir(parents=True)
        image.new("RGB", (4, 4)).save(tmp_path / "alice" / "imgs" / "train" / cls / "0.png")
    monkeypatch.setenv("HPC_DDP_TEST_SCRATCH", str(tmp_path))
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", str(tmp_path / "alice"))
    for root in (
        "$HPC_DDP_TEST_SCRATCH/$USER/imgs",
        "${HPC_DDP_TEST_SCRATCH}/alice/imgs",
        "~/imgs",
    ):
        cfg = TrainConfig(dataset="imagefolder", data_root=root, num_classes=2, image_size=4)
        train = build_dataset(cfg, train=True)
        assert train is not None
        assert len(train) == 2  # type: ignore[arg-type]
    seen_roots.clear()
    user = TrainConfig(dataset="tests.train.test_data:recording_dataset", data_root="~/$USER")
    assert build_dataset(user, train=True) is None
    assert seen_roots == [f"{tmp_path}/alice/alice"]


def test_an_unset_variable_in_data_root_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_DDP_TEST_UNSET", raising=False)
    cfg = TrainConfig(dataset="imagefolder", data_root="/d/$HPC_DDP_TEST_UNSET/x")
    with pytest.raises(
        ConfigError, match=r"'/d/\$HPC_DDP_TEST_UNSET/x'.*not set on the task.*HINT"
    ):
        build_dataset(cfg, train=True)


class _WhoLoads(torch.utils.data.Dataset[tuple[int, int]]):
    """Sample ``i`` is (i, the pid of the process that loaded it)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> tuple[int, int]:
        import os

        return index, os.getpid()


def test_forever_keeps_its_workers_across_epochs_in_the_per_epoch_order() -> None:
    """One set of worker processes serves every epoch (none is started at an epoch boundary),
    and the batches are exactly those of iterating epoch by epoch."""
    per_epoch = ResumableLoader(_WhoLoads(), Progress(), batch_size=4, num_replicas=2, rank=1,
                                seed=7, num_workers=0)  # fmt: skip
    expected = [b[0].tolist() for _ in range(3) for b in per_epoch]  # 3 epochs of 6 batches
    progress = Progress()
    endless = ResumableLoader(_WhoLoads(), progress, batch_size=4, num_replicas=2, rank=1,
                              seed=7, num_workers=2).forever()  # fmt: skip
    got = [next(endless) for _ in range(len(expected))]
    assert [b[0].tolist() for b in got] == expected
    pids = {int(p) for b in got for p in b[1]}
    assert len(pids) == 2  # the same two workers from the first epoch to the third
    assert (progress.epoch, progress.batch_in_epoch) == (2, 6)  # counted as handed out


def test_iterating_epoch_by_epoch_keeps_the_workers_too() -> None:
    it = ResumableLoader(_WhoLoads(), Progress(), batch_size=4, num_replicas=2, rank=0, seed=7,
                         num_workers=2)  # fmt: skip
    pids = [{int(p) for b in it for p in b[1]} for _ in range(2)]
    assert pids[0] == pids[1]
    assert len(pids[0]) == 2


def test_the_loader_says_when_this_rank_waits_for_its_next_batch() -> None:
    """The session's heartbeat learns it from here (a rank stuck in its data is to blame), on
    both ways of iterating; a failed fetch still says the wait is over."""
    said: list[bool] = []
    epoch = list(loader(Progress(), on_wait=said.append))
    assert said == [True, False] * len(epoch)
    said.clear()
    endless = loader(Progress(), on_wait=said.append).forever()
    take(endless, 3)
    assert said == [True, False] * 3

    class Broken:
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> Any:
            raise OSError("the file system went away")

    said.clear()
    data = cast("Dataset[Any]", Broken())
    broken = ResumableLoader(data, Progress(), batch_size=4, num_replicas=1, rank=0, seed=7,
                             on_wait=said.append)  # fmt: skip
    with pytest.raises(OSError, match="went away"):
        next(iter(broken))
    assert said == [True, False]
