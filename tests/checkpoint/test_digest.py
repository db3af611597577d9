"""Digests: independent of device and memory layout, equal before a save and after a load, and
changed by one ulp, a renamed key or another dtype; the walk tells nested shapes apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpc_ddp.checkpoint.digest import canonical_digest, sha256_weights, weights_digest
from hpc_ddp.checkpoint.format import load_checkpoint
from tests.checkpoint.test_format import save, small_model

pytestmark = pytest.mark.torch


def test_digest_stable_across_save_load_and_layout(tmp_path: Path) -> None:
    model = small_model()
    loaded = load_checkpoint(save(tmp_path, 1, model))  # save() trains one step first
    digest = weights_digest(model.state_dict())
    assert weights_digest(loaded["model"]) == digest
    assert loaded["meta"]["digests"]["model"] == digest
    # same values in a non-contiguous tensor: same digest
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["0.weight"] = sd["0.weight"].t().contiguous().t()
    assert not sd["0.weight"].is_contiguous()
    assert weights_digest(sd) == digest
    # one ulp anywhere changes it
    bumped = dict(sd)
    bumped["2.bias"] = torch.nextafter(sd["2.bias"], torch.tensor(1.0))
    assert weights_digest(bumped) != digest
    # so does a renamed key or a dtype change
    assert weights_digest({"x" + k: v for k, v in sd.items()}) != digest
    assert weights_digest({k: v.double() for k, v in sd.items()}) != digest


def test_the_walk_tells_apart_what_flattens_alike() -> None:
    """Type tags and lengths: the same leaves in another nesting, another container or another
    type digest differently."""
    digests = {
        canonical_digest(value)
        for value in ((1, [2]), ([1], 2), [1, 2], (1, 2), {"a": 1}, {"a": 1.0}, {"a": "1"}, None)
    }
    assert len(digests) == 8
    assert canonical_digest({"b": 2, "a": 1}) == canonical_digest({"a": 1, "b": 2})


def test_format_1_weights_digest_is_a_sha256_of_the_tensors_only() -> None:
    w = torch.arange(6.0).reshape(2, 3)
    digest = sha256_weights({"w": w, "step": 3})
    assert len(digest) == 64
    assert sha256_weights({"w": w}) == digest  # plain values are not covered
    assert sha256_weights({"w": w.t().contiguous().t()}) == digest
    assert sha256_weights({"w": w.double()}) != digest
