"""Checkpoint format and atomic I/O: kills mid-write, corrupt files, pruning, digests, RNG."""

from __future__ import annotations

import enum
import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint import (
    LATEST,
    CheckpointWriter,
    Progress,
    build_payload,
    capture_rng_state,
    checkpoint_name,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    parse_checkpoint_name,
    prune_plan,
    restore_rng_state,
    snapshot,
    weights_digest,
    write_checkpoint,
)
from hpc_ddp.errors import CheckpointError
from tests.helpers.launch import HELPERS, base_env

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def save(directory: Path, step: int, model: nn.Module | None = None, keep_last: int = 0) -> Path:
    model = model or small_model(step)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()  # momentum buffers: optimizer state with tensors
    payload = build_payload(
        model=snapshot(model.state_dict()),
        optimizer=snapshot(opt.state_dict()),
        progress=Progress(step=step, epoch=step // 10, batch_in_epoch=step % 10, extra={"k": 1}),
        rng=[capture_rng_state(CPU), capture_rng_state(CPU)],
        config={"name": "t", "train": {"lr": 0.1, "extra": [1, 2]}},
    )
    return write_checkpoint(directory, payload, keep_last)


@pytest.mark.parametrize(
    ("name", "step"),
    [("step-00000120.pt", 120), ("step-0.pt", 0), ("step-00000120.pt.tmp", None), (LATEST, None)],
)
def test_parse_checkpoint_name(name: str, step: int | None) -> None:
    assert parse_checkpoint_name(name) == step


def test_checkpoint_name_sorts_like_steps() -> None:
    names = [checkpoint_name(s) for s in (9, 10, 100, 12345678)]
    assert names == sorted(names)


@pytest.mark.parametrize(
    ("steps", "keep", "delete"),
    [([1, 2, 3, 4], 2, [1, 2]), ([4, 1, 3], 3, []), ([1, 2], 0, []), ([5], 1, [])],
)
def test_prune_plan(steps: list[int], keep: int, delete: list[int]) -> None:
    assert prune_plan(steps, keep) == delete


def test_save_load_roundtrip_is_weights_only(tmp_path: Path) -> None:
    model = small_model()
    path = save(tmp_path, 7, model)
    assert path.name == "step-00000007.pt"
    assert (tmp_path / LATEST).read_text().strip() == path.name
    raw = torch.load(path, map_location="cpu", weights_only=True)  # must not need pickle code
    assert raw["progress"] == {"step": 7, "epoch": 0, "batch_in_epoch": 7}
    assert raw["extra"] == {"k": 1}
    assert raw["meta"]["world_size"] == 2
    assert raw["meta"]["weights_digest"] == weights_digest(model.state_dict())
    assert raw["optimizer"]["state"][0]["momentum_buffer"].shape == (16, 8)
    assert list(tmp_path.glob(".tmp-*")) == []


def test_digest_stable_across_save_load_and_layout(tmp_path: Path) -> None:
    model = small_model()
    loaded = load_checkpoint(save(tmp_path, 1, model))  # save() trains one step first
    digest = weights_digest(model.state_dict())
    assert weights_digest(loaded["model"]) == digest
    assert loaded["meta"]["weights_digest"] == digest
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


def test_keep_last_prunes_only_after_new_one_is_durable(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in sorted(tmp_path.glob("step-*.pt"))] == [
        "step-00000030.pt",
        "step-00000040.pt",
    ]
    assert (tmp_path / LATEST).read_text().strip() == "step-00000040.pt"


def test_corrupt_newest_falls_back_to_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn by a bad disk
    (tmp_path / "step-00000030.pt").write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.checkpoint"):
        found = find_latest(tmp_path)
    assert found is not None
    assert found[0].name == "step-00000010.pt"
    assert found[1]["progress"]["step"] == 10
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "step-00000030.pt" in warned
    assert "step-00000020.pt" in warned


def test_find_latest_none_when_empty_error_when_all_bad(tmp_path: Path) -> None:
    assert find_latest(tmp_path / "missing") is None
    assert find_latest(tmp_path) is None
    (tmp_path / "step-00000005.pt").write_bytes(b"\0" * 100)
    with pytest.raises(CheckpointError, match="HINT"):
        find_latest(tmp_path)


def test_foreign_payload_rejected(tmp_path: Path) -> None:
    path = tmp_path / "step-00000001.pt"
    torch.save({"model": {}}, path)
    with pytest.raises(CheckpointError, match="not an hpc-ddp checkpoint"):
        load_checkpoint(path)


def test_list_checkpoints(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    models = {step: small_model(step) for step in (5, 15)}
    for step, model in models.items():
        save(ckpts, step, model)
    (ckpts / "step-00000025.pt").write_bytes(b"garbage")
    infos = list_checkpoints(tmp_path)  # a run directory works as well as checkpoints/
    assert [i.step for i in infos] == [5, 15, 25]
    for info in infos[:2]:
        assert info.error is None
        assert info.weights_digest == weights_digest(models[info.step].state_dict())
        assert info.epoch == info.step // 10
        assert info.size == info.path.stat().st_size
    assert infos[2].error is not None
    assert infos[2].weights_digest is None
    assert [i.step for i in list_checkpoints(ckpts, verify=True) if i.error is None] == [5, 15]


def test_rng_state_roundtrip_through_file(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    state = capture_rng_state(CPU)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    path = tmp_path / "rng.pt"
    torch.save(state, path)
    restore_rng_state(torch.load(path, weights_only=True), CPU)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


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


def test_writer_background_and_error(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt", keep_last=2)
    model = small_model()
    for step in (1, 2, 3):
        writer.submit(
            build_payload(
                model=snapshot(model.state_dict()),
                progress=Progress(step=step),
                rng=[capture_rng_state(CPU)],
            )
        )
    writer.wait()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [
        "step-00000002.pt",
        "step-00000003.pt",
    ]
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = CheckpointWriter(blocked / "ckpt", keep_last=2)  # a directory under a file
    bad.submit(build_payload(model={}, progress=Progress(step=1), rng=[]))
    with pytest.raises(CheckpointError, match="HINT"):
        bad.wait()
    bad.wait()  # the error is reported once


def test_sigkill_during_saves_always_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    """30 SIGKILLs at random moments of a save loop: the newest complete file always loads."""
    kills = 30
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "ckpt_killer.py"), str(tmp_path), str(kills), "1234"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rounds = json.loads(proc.stdout)
    assert len(rounds) == kills
    assert all(r["step"] is not None and r["intact"] for r in rounds), rounds
    steps = [r["step"] for r in rounds]
    assert steps == sorted(steps)  # never went back to an older checkpoint
    assert steps[-1] > kills // 2  # the writers made progress between kills
    assert sum(r["torn"] for r in rounds) >= 5  # many kills did land in the middle of a write
    found = find_latest(tmp_path)
    assert found is not None
    assert found[1]["progress"]["step"] == steps[-1]
    assert torch.load(found[0], weights_only=True)["meta"]["weights_digest"]
