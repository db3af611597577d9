"""User-style import strings for the data and model tests (``tests.helpers.user_code:...``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from hpc_ddp.config.model import TrainConfig


def dataset(cfg: TrainConfig, train: bool) -> Dataset[tuple[torch.Tensor, ...]] | None:
    if not train:
        return None
    n = 40
    return TensorDataset(torch.zeros(n, 3, cfg.image_size, cfg.image_size), torch.arange(n) % 2)


def model(cfg: TrainConfig) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * cfg.image_size**2, cfg.num_classes))


def not_a_model(cfg: TrainConfig) -> str:
    return cfg.model
