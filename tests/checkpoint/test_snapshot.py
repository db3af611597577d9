"""Snapshots: a copy of the state in host buffers kept from one save to the next, in only the
types a weights-only load reads (anything else fails at save time, not at resume time)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
import torch

from hpc_ddp.checkpoint.format import build_payload
from hpc_ddp.checkpoint.snapshot import SnapshotBuffers, snapshot
from hpc_ddp.errors import CheckpointError
from hpc_ddp.runtime.progress import Progress

pytestmark = pytest.mark.torch


def test_snapshot_is_a_copy() -> None:
    t = torch.zeros(3)
    snap = snapshot({"a": [t, (t, 1)], "b": "x"})
    t.add_(1)
    assert snap["a"][0].sum() == 0
    assert snap["a"][1][0].sum() == 0
    assert snap["a"][1][1] == 1
    assert snap["b"] == "x"


def test_snapshot_makes_values_weights_only_loadable(tmp_path: Path) -> None:
    """Subclasses of plain types (numpy scalars, enums, torch's version string) are saved as
    the plain type; anything else fails at save time, not at resume time."""
    np = pytest.importorskip("numpy")

    class Color(str, enum.Enum):
        RED = "red"

    progress = Progress(step=1, extra={"best": np.float64(0.5), "n": np.int64(3), "c": Color.RED})
    payload = build_payload(model={}, progress=progress, rng=[], config={"v": torch.__version__})
    path = tmp_path / "step-00000001.pt"
    torch.save(payload, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["extra"] == {"best": 0.5, "n": 3, "c": "red"}
    assert type(loaded["extra"]["c"]) is str
    with pytest.raises(CheckpointError, match=r"progress\.extra\['bad'\] holds a .*HINT"):
        build_payload(model={}, progress=Progress(extra={"bad": object()}), rng=[])


def test_snapshot_buffers_are_kept_and_overwritten_by_the_next_snapshot() -> None:
    """The training thread copies into memory it already has: the same buffers each time
    (no fresh pages to fault in), new ones only for tensors that changed shape or dtype."""
    state: dict[str, Any] = {"w": torch.zeros(4, 3), "opt": {"m": [torch.ones(5)]}, "n": 3}
    buffers = SnapshotBuffers()
    first = buffers.snapshot(state)
    assert first["n"] == 3
    assert first["w"].data_ptr() != state["w"].data_ptr()
    state["w"].add_(2)
    second = buffers.snapshot(state)
    assert second["w"].data_ptr() == first["w"].data_ptr()  # the same buffer, refilled
    assert second["opt"]["m"][0].data_ptr() == first["opt"]["m"][0].data_ptr()
    assert bool((second["w"] == 2).all())
    state["w"] = torch.zeros(2, 2, dtype=torch.float64)
    third = buffers.snapshot(state)
    assert third["w"].dtype == torch.float64
    assert third["w"].data_ptr() != first["w"].data_ptr()
    one_off = snapshot(state)  # the function: fresh memory, kept by no one
    assert one_off["w"].data_ptr() != third["w"].data_ptr()
    with pytest.raises(CheckpointError, match=r"checkpoint\['bad'\] holds a builtins.object"):
        buffers.snapshot({"bad": object()})
