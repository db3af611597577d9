"""The checkpoint readers fuzzed: single-bit flips spread over a whole file (every byte of the
last 120, the zip trailer with its zip64 locator, and a deterministic sample of the rest) and
truncations at many offsets. Every reader (``hpc-ddp checkpoints --verify``, the node's
:func:`find_latest`, ``status``'s torch-free check) must never raise, and a file
that loads as good must hold exactly what was saved (zero wrong loads).

Deterministic (a fixed seed), and small: an 18 kB checkpoint of a model of a few hundred
parameters, 510 variants (120 trailer flips, 240 flips spread over the rest, 150 cuts), each
read by three readers, in seconds. Before every exception counted as damage, 8 of them crashed
every reader (BadZipFile out of ``zipfile.is_zipfile``).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.checkpoint.format import (
    CheckpointState,
    build_payload,
    capture_rng_state,
    find_latest,
    list_checkpoints,
)
from hpc_ddp.checkpoint.snapshot import snapshot
from hpc_ddp.checkpoint.writer import write_checkpoint
from hpc_ddp.rundir.checkpoints import damaged_checkpoint
from hpc_ddp.runtime.progress import Progress

pytestmark = pytest.mark.torch

SEED = 31
TRAILER = 120
SPREAD = 240
"""Flips at positions drawn over the whole file, besides one per byte of the trailer."""
TRUNCATIONS = 150


def _write(directory: Path, step: int) -> tuple[Path, str]:
    """A real checkpoint (weights, optimizer state, RNG, config) and the digest of all of it."""
    torch.manual_seed(step)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    payload = build_payload(
        model=snapshot(model.state_dict()),
        optimizer=snapshot(opt.state_dict()),
        progress=Progress(step=step, epoch=1, batch_in_epoch=step % 7),
        rng=[capture_rng_state(torch.device("cpu"))],
        config={"name": "fuzz", "train": {"lr": 0.1}},
        run_id="fuzz-0000abcd",
    )
    path = write_checkpoint(directory, payload, keep_last=0)
    return path, _whole(torch.load(path, map_location="cpu", weights_only=True))


def _whole(data: Any) -> str:
    return weights_digest({"payload": data})


def _variants(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    out = []
    for offset in range(len(data) - TRAILER, len(data)):
        bit = rng.randrange(8)
        out.append((f"flip byte {offset} bit {bit}", _flip(data, offset, bit)))
    for offset in sorted(rng.sample(range(len(data) - TRAILER), SPREAD)):
        bit = rng.randrange(8)
        out.append((f"flip byte {offset} bit {bit}", _flip(data, offset, bit)))
    cuts = {len(data) - k for k in range(1, TRAILER + 1)}
    cuts |= set(rng.sample(range(len(data) - TRAILER), TRUNCATIONS - TRAILER))
    out += [(f"truncated to {n} bytes", data[:n]) for n in sorted(cuts)]
    return out


def _flip(data: bytes, offset: int, bit: int) -> bytes:
    changed = bytearray(data)
    changed[offset] ^= 1 << bit
    return bytes(changed)


def test_no_flipped_bit_or_truncation_crashes_a_reader_or_loads_as_good(tmp_path: Path) -> None:
    older, _ = _write(tmp_path / "checkpoints", 10)
    original, whole = _write(tmp_path / "made", 20)
    data = original.read_bytes()
    rng = random.Random(SEED)
    variants = _variants(data, rng)
    assert len(variants) >= 500
    target = tmp_path / "checkpoints" / original.name
    crashes: list[str] = []
    wrong: list[str] = []
    damaged = 0
    for what, content in variants:
        target.write_bytes(content)
        try:
            damaged_checkpoint(target, "fuzz-0000abcd")  # status: any answer, never a raise
            listed = list_checkpoints(target.parent, verify=True)
            found = find_latest(target.parent, run_id="fuzz-0000abcd")
        except Exception as exc:
            crashes.append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        assert [i.step for i in listed] == [10, 20]
        checked = listed[1]
        assert found is not None
        path, loaded = found
        if path == target:
            if checked.state is not CheckpointState.OK or _whole(loaded) != whole:
                wrong.append(f"{what}: loaded as good, state {checked.state}")
        else:
            assert path == older
            assert checked.state is not CheckpointState.OK, what
            damaged += 1
        if what.startswith("truncated") and path == target:
            wrong.append(f"{what}: a truncated file loaded")
    assert crashes == []
    assert wrong == []
    # Most flips land in bytes that matter; the rest (zip header fields torch ignores, the
    # padding before each tensor) change nothing that loads.
    assert damaged > len(variants) // 2
    shutil.rmtree(tmp_path / "made")
