"""Datasets for the built-in trainer: synthetic, torchvision's, or the user's own.

``synthetic`` (the default) needs no files and no network: class prototypes plus Gaussian
noise, generated from the seed, learnable in a few dozen steps. ``cifar10``, ``mnist`` and
``imagefolder`` read a pre-staged ``data_root`` and never download (compute nodes usually have
no internet). ``pkg.mod:fn`` calls ``fn(cfg: TrainConfig, train: bool) -> Dataset`` (return None
for ``train=False`` to skip evaluation).

Every built-in dataset yields ``(image, label)`` with images of shape
``(3, image_size, image_size)``, so any model from :mod:`hpc_ddp.train.models` fits any dataset.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hpc_ddp.config.loginnode import expand_path
from hpc_ddp.config.model import TrainConfig
from hpc_ddp.config.preflight import BUILTIN_DATASETS
from hpc_ddp.errors import ConfigError

BUILTIN = BUILTIN_DATASETS
"""The datasets built here by name; submit checks names against the same list."""
_NOISE = 1.0
_SIGNAL = 4.0
"""Prototype norm over the noise's per-pixel std: learnable in a few dozen steps at any image
size, yet not at once (about 80% validation accuracy after 100 default steps)."""
_VAL_FRACTION = 8  # synthetic validation set: 1/8 of the training samples


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """``num_samples`` noisy copies of ``num_classes`` random prototype images.

    Sample ``i`` is generated on demand from ``(seed, split, i)`` alone, so the dataset costs no
    memory, any worker can produce any sample, and two processes always agree on it. Train and
    validation splits share the prototypes and differ in labels and noise.
    """

    def __init__(
        self,
        num_samples: int,
        num_classes: int,
        image_size: int,
        seed: int,
        *,
        train: bool = True,
    ) -> None:
        self.shape = (3, image_size, image_size)
        self.seed = seed
        self.split = 0 if train else 1
        g = torch.Generator().manual_seed(seed)
        scale = _SIGNAL / math.sqrt(math.prod(self.shape))
        self.prototypes = torch.randn((num_classes, *self.shape), generator=g) * scale
        g.manual_seed(seed * 2 + 1 + self.split)
        self.labels = torch.randint(num_classes, (num_samples,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = int(self.labels[index])
        g = torch.Generator().manual_seed((self.seed * 2 + self.split) * 1_000_003 + index)
        noise = torch.randn(self.shape, generator=g) * _NOISE
        return self.prototypes[label] + noise, label


def load_import_string(spec: str, what: str) -> Any:
    """The object named by ``pkg.mod:attr`` (``what`` names the config key in errors)."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{what}: cannot import module {module_name!r} ({exc}). HINT: make sure it is "
            "installed in the job's environment or on PYTHONPATH."
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(
            f"{what}: module {module_name!r} has no attribute {attr!r}. "
            "HINT: write it as 'package.module:function'."
        ) from None


def _transform(cfg: TrainConfig, gray: bool = False) -> Any:
    from torchvision import transforms as T  # 1.5 s to import: only when used

    steps: list[Any] = [T.Resize((cfg.image_size, cfg.image_size)), T.ToTensor()]
    if gray:
        steps.append(T.Lambda(_to_rgb))
    steps.append(T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    return T.Compose(steps)


def _to_rgb(x: torch.Tensor) -> torch.Tensor:
    return x.expand(3, -1, -1)


def _staging_hint(name: str, root: str) -> str:
    cls = {"cifar10": "CIFAR10", "mnist": "MNIST"}[name]
    return (
        f'HINT: on a machine with internet run `python -c "import torchvision; '
        f"torchvision.datasets.{cls}('{root}', download=True)\"`, then copy {root} to the "
        "cluster and set train.data_root to it."
    )


def data_root(cfg: TrainConfig) -> str:
    """``train.data_root`` as this task sees it: ``~`` and ``$VARS`` expanded from its
    environment (``/scratch/$USER/data`` is a path on the nodes, not a literal ``$USER``)."""
    assert cfg.data_root is not None
    return expand_path(cfg.data_root, os.environ)


def _unexpanded_hint(root: str) -> str:
    """A hint for a root that still holds a ``$VAR`` the task's environment does not set."""
    if "$" not in root:
        return ""
    return (
        f" (a variable in {root!r} is not set on the task: set it in env.vars or env.setup, "
        "or write the path out)"
    )


def _torchvision_dataset(cfg: TrainConfig, train: bool) -> Dataset[Any] | None:
    name = cfg.dataset
    if cfg.data_root is None:
        raise ConfigError(
            f"train.dataset is {name!r} but train.data_root is not set. "
            "HINT: set train.data_root to the directory holding the staged dataset."
        )
    root = data_root(cfg)
    from torchvision import datasets  # 1.5 s to import: only when used

    if name == "imagefolder":
        split = Path(root) / ("train" if train else "val")
        if not split.is_dir():
            if not train:
                return None
            raise ConfigError(
                f"train.data_root {root!r} has no train/ directory{_unexpanded_hint(root)}. "
                "HINT: lay the images out as DATA_ROOT/train/<class>/<image> (and "
                "DATA_ROOT/val/<class>/<image> to evaluate)."
            )
        ds: Any = datasets.ImageFolder(str(split), transform=_transform(cfg))
        found = len(ds.classes)
    else:
        cls = {"cifar10": datasets.CIFAR10, "mnist": datasets.MNIST}[name]
        try:
            ds = cls(
                root, train=train, download=False, transform=_transform(cfg, gray=name == "mnist")
            )
        except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted. ..."
            raise ConfigError(
                f"dataset {name!r} not found under {root!r} ({exc}){_unexpanded_hint(root)}. "
                f"{_staging_hint(name, root)}"
            ) from exc
        found = 10
    if found != cfg.num_classes:
        raise ConfigError(
            f"dataset {name!r} has {found} classes but train.num_classes is {cfg.num_classes}. "
            f"HINT: set train.num_classes: {found}."
        )
    dataset: Dataset[Any] = ds
    return dataset


def build_dataset(cfg: TrainConfig, *, train: bool) -> Dataset[Any] | None:
    """The training (``train=True``) or validation dataset named by ``cfg.dataset``.

    Validation may be None (an imagefolder without ``val/``, a user function returning None).
    """
    name = cfg.dataset
    if name == "synthetic":
        n = cfg.synthetic_samples if train else max(1, cfg.synthetic_samples // _VAL_FRACTION)
        return SyntheticImages(n, cfg.num_classes, cfg.image_size, cfg.seed, train=train)
    if name in ("cifar10", "mnist", "imagefolder"):
        return _torchvision_dataset(cfg, train)
    if ":" in name:
        fn = load_import_string(name, "train.dataset")
        if cfg.data_root is not None:  # the user's function gets the path the task sees
            cfg = dataclasses.replace(cfg, data_root=data_root(cfg))
        out: Dataset[Any] | None = fn(cfg, train)
        return out
    close = difflib.get_close_matches(name, BUILTIN, n=3)
    guess = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise ConfigError(
        f"train.dataset {name!r} is not a known dataset. HINT: {guess}Use one of "
        f"{', '.join(BUILTIN)}, or an import string 'package.module:function'."
    )
