"""Models for the built-in trainer: ``mlp``, torchvision models by name, or the user's own.

Inputs are ``(3, image_size, image_size)`` images (see :mod:`hpc_ddp.train.data`). torchvision is
imported only for torchvision models, so the default ``mlp`` starts fast.
"""

from __future__ import annotations

import difflib

from torch import nn

from hpc_ddp.config.model import TrainConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.train.data import load_import_string

MLP_HIDDEN = 256
MLP_DROPOUT = 0.1
_SMALL_IMAGE = 64
"""At or below this size, ResNet-style stems lose their stride-2 conv and max-pool."""


def build_mlp(cfg: TrainConfig) -> nn.Module:
    """Two hidden layers with dropout: small and fast on CPU, and it uses the RNG every step."""
    inputs = 3 * cfg.image_size * cfg.image_size
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(inputs, MLP_HIDDEN),
        nn.ReLU(),
        nn.Dropout(MLP_DROPOUT),
        nn.Linear(MLP_HIDDEN, MLP_HIDDEN),
        nn.ReLU(),
        nn.Linear(MLP_HIDDEN, cfg.num_classes),
    )


def adapt_to_small_images(model: nn.Module, image_size: int) -> nn.Module:
    """CIFAR-style stem for ResNets on small images: 3x3 stride-1 first conv, no max-pool.

    ImageNet's 7x7/2 conv plus 3x3/2 pool would shrink a 32x32 image to 8x8 before the first
    block. Models without that stem are returned unchanged.
    """
    conv = getattr(model, "conv1", None)
    if image_size > _SMALL_IMAGE or not isinstance(conv, nn.Conv2d):
        return model
    if not isinstance(getattr(model, "maxpool", None), nn.MaxPool2d):
        return model
    model.conv1 = nn.Conv2d(conv.in_channels, conv.out_channels, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model


def torchvision_model_names() -> list[str]:
    """Every classification model torchvision can build by name."""
    import torchvision  # 1.5 s to import: only when used

    names: list[str] = torchvision.models.list_models(module=torchvision.models)
    return names


def build_model(cfg: TrainConfig) -> nn.Module:
    """The model named by ``cfg.model``, with ``cfg.num_classes`` outputs, randomly initialised.

    Call after seeding: initialisation draws from the global torch RNG.
    """
    name = cfg.model
    if name == "mlp":
        return build_mlp(cfg)
    if ":" in name:
        fn = load_import_string(name, "train.model")
        model = fn(cfg)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"train.model {name!r} returned {type(model).__name__}, not a torch.nn.Module. "
                "HINT: the function must take the TrainConfig and return the model."
            )
        return model
    names = torchvision_model_names()
    if name not in names:
        close = difflib.get_close_matches(name, ["mlp", *names], n=3)
        guess = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ConfigError(
            f"train.model {name!r} is not a known model. HINT: {guess}Use 'mlp', a torchvision "
            "classification model (torchvision.models.list_models()), or an import string "
            "'package.module:function'."
        )
    import torchvision  # 1.5 s to import: only when used

    kwargs: dict[str, object] = {"weights": None, "num_classes": cfg.num_classes}
    if name.startswith("vit_"):
        kwargs["image_size"] = cfg.image_size
    built: nn.Module = torchvision.models.get_model(name, **kwargs)
    return adapt_to_small_images(built, cfg.image_size)
