"""FSDP2 wrapping: which blocks are sharded, on one real process (a one-rank gloo group).

The 2-rank training, stop and resume with ``train.strategy: fsdp`` is proved in
tests/checkpoint/test_sharded.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.runtime.sharding import full_state_dict, is_sharded, no_sync, shard_units
from hpc_ddp.sessions.session import Session

pytestmark = pytest.mark.torch


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x).relu()
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.layers = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.layers(self.act(self.stem(x))))
        return out


def test_a_resnet_is_sharded_per_residual_stage() -> None:
    torchvision = pytest.importorskip("torchvision")
    units = shard_units(torchvision.models.resnet18())
    assert [name for name, _ in units] == ["layer1", "layer2", "layer3", "layer4"]


def test_another_model_by_its_children_with_parameters() -> None:
    assert [name for name, _ in shard_units(Net())] == ["stem", "layers", "head"]  # not act


def test_named_blocks_by_class_or_path_innermost_first() -> None:
    net = Net()
    assert [n for n, _ in shard_units(net, ["Block"])] == ["layers.0", "layers.1"]
    assert [n for n, _ in shard_units(net, ["layers", "layers.1.inner"])] == [
        "layers.1.inner",
        "layers",
    ]
    with pytest.raises(ConfigError, match=r"names no submodule of Net.*Block"):
        shard_units(net, ["TransformerBlock"])


@pytest.fixture
def alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Session]:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    cfg = JobConfig(name="t", train=TrainConfig(strategy="fsdp"))
    with Session(tmp_path, cfg, env={}) as s:
        yield s


def test_wrap_follows_train_strategy_and_trains(alone: Session) -> None:
    torch.manual_seed(0)
    model = alone.wrap(Net())
    assert is_sharded(model)
    assert type(dict(model.named_parameters())["stem.weight"]).__name__ == "DTensor"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    with no_sync(model):  # accumulate without reducing
        model(x).sum().backward()
    model(x).sum().backward()
    opt.step()
    full = full_state_dict(model)
    assert set(full) == set(Net().state_dict())
    assert all(type(v) is torch.Tensor for v in full.values())
    with pytest.raises(ConfigError, match="not one of ddp, fsdp"):
        alone.wrap(Net(), strategy="zero")
