"""Model building: mlp, torchvision by name (small-image stem), import strings, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.train.models import build_model

pytestmark = pytest.mark.torch


def test_mlp_shape_and_determinism() -> None:
    cfg = TrainConfig(image_size=8, num_classes=5)
    torch.manual_seed(0)
    a = build_model(cfg)
    torch.manual_seed(0)
    b = build_model(cfg)
    assert a(torch.randn(2, 3, 8, 8)).shape == (2, 5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert any(isinstance(m, nn.Dropout) for m in a.modules())


def test_resnet18_gets_a_small_image_stem() -> None:
    model = build_model(TrainConfig(model="resnet18", image_size=32, num_classes=10))
    conv1 = model.conv1
    assert isinstance(conv1, nn.Conv2d)
    assert (conv1.kernel_size, conv1.stride) == ((3, 3), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_large_images_keep_the_imagenet_stem() -> None:
    model = build_model(TrainConfig(model="resnet18", image_size=224, num_classes=3))
    conv1 = model.conv1
    assert isinstance(conv1, nn.Conv2d)
    assert conv1.kernel_size == (7, 7)
    assert isinstance(model.maxpool, nn.MaxPool2d)


def test_import_string_model() -> None:
    cfg = TrainConfig(model="tests.helpers.user_code:model", image_size=4, num_classes=3)
    assert build_model(cfg)(torch.randn(1, 3, 4, 4)).shape == (1, 3)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("resnet181", "did you mean 'resnet18'"),
        ("mpl", "'mlp'"),
        ("tests.helpers.user_code:not_a_model", "not a torch.nn.Module"),
        ("nope_pkg_xyz:fn", "cannot import"),
    ],
)
def test_bad_model_names(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_model(TrainConfig(model=name))
    assert "HINT" in str(err.value)
