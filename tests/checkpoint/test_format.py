"""The checkpoint format: the payload, its RNG states, reading and checking a file; damaged and
foreign files listed with a reason and skipped on resume, the digest of every section (weights,
optimizer, scheduler, scaler, RNG, progress, extra values, config, meta) checked on every load;
format-1 files load with only their weights verified, and say so; another run's file refused.
(Writing: test_writer.py; snapshots: test_snapshot.py; digests: test_digest.py.)"""

from __future__ import annotations

import hashlib
import logging
import pickle
import random
import struct
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.checkpoint.format import (
    SECTIONS,
    V1_UNVERIFIED,
    CheckpointState,
    build_payload,
    capture_rng_state,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    state_digests,
)
from hpc_ddp.checkpoint.snapshot import snapshot
from hpc_ddp.checkpoint.writer import write_checkpoint
from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.layout import LATEST_CHECKPOINT, checkpoint_name, parse_checkpoint_name
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.sessions.session import Session

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def save(
    directory: Path,
    step: int,
    model: nn.Module | None = None,
    keep_last: int = 0,
    *,
    ranks: int = 2,
) -> Path:
    model = model or small_model(step)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()  # momentum buffers: optimizer state with tensors
    first = capture_rng_state(CPU)
    torch.rand(1)  # the other rank's stream is somewhere else
    payload = build_payload(
        model=snapshot(model.state_dict()),
        optimizer=snapshot(opt.state_dict()),
        progress=Progress(step=step, epoch=step // 10, batch_in_epoch=step % 10, extra={"k": 1}),
        rng=[first, capture_rng_state(CPU)][:ranks],
        config={"name": "t", "train": {"lr": 0.1, "extra": [1, 2]}},
        # Named objects (Session.restore's **objects): an EMA model, a user's own state.
        objects={"ema": snapshot(small_model(step + 100).state_dict()), "curriculum": {"level": 3}},
    )
    return write_checkpoint(directory, payload, keep_last)


def test_checkpoint_name_sorts_like_steps() -> None:
    names = [checkpoint_name(s) for s in (9, 10, 100, 12345678)]
    assert names == sorted(names)


def test_save_load_roundtrip_is_weights_only(tmp_path: Path) -> None:
    model = small_model()
    path = save(tmp_path, 7, model)
    assert path.name == "step-00000007.pt"
    assert (tmp_path / LATEST_CHECKPOINT).read_text().strip() == path.name
    raw = torch.load(path, map_location="cpu", weights_only=True)  # must not need pickle code
    assert raw["progress"] == {"step": 7, "epoch": 0, "batch_in_epoch": 7}
    assert raw["extra"] == {"k": 1}
    assert raw["meta"]["world_size"] == 2
    assert raw["version"] == 2
    assert set(raw["meta"]["digests"]) == {*SECTIONS, "objects.ema", "objects.curriculum", "meta"}
    assert raw["meta"]["digests"] == state_digests(raw)
    assert raw["objects"]["curriculum"] == {"level": 3}
    assert raw["meta"]["digests"]["model"] == weights_digest(model.state_dict())
    assert raw["optimizer"]["state"][0]["momentum_buffer"].shape == (16, 8)
    assert list(tmp_path.glob(".tmp-*")) == []


def test_corrupt_newest_falls_back_to_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn by a bad disk
    (tmp_path / "step-00000030.pt").write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.checkpoint.format"):
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


# --- damaged and foreign files: listed with a reason, skipped on resume ---------------------

OK, DAMAGED, FOREIGN = CheckpointState.OK, CheckpointState.DAMAGED, CheckpointState.FOREIGN


def flip_tensor_bytes(path: Path) -> None:
    """Flip the low bit of 4 bytes in the middle of the first model tensor's stored data.

    The zip and the pickle stay intact, so ``torch.load`` still succeeds: only the weights
    change, as with bit rot on disk or a bad copy.
    """
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    assert info.compress_type == zipfile.ZIP_STORED
    raw = bytearray(path.read_bytes())
    header = info.header_offset
    name_len, extra_len = struct.unpack("<HH", raw[header + 26 : header + 30])
    middle = header + 30 + name_len + extra_len + info.file_size // 2
    for i in range(middle, middle + 4):
        raw[i] ^= 0x01
    path.write_bytes(bytes(raw))


def real_payload(step: int) -> dict[str, Any]:
    """A complete payload as the writer stores it (digests filled in)."""
    model = small_model(step)
    payload = build_payload(
        model=snapshot(model.state_dict()),
        progress=Progress(step=step, epoch=1),
        rng=[capture_rng_state(CPU)],
    )
    payload["meta"]["digests"] = state_digests(payload)
    return payload


def edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A maker that saves a real payload after ``edit`` changed it in place."""

    def make(path: Path) -> None:
        payload = real_payload(parse_checkpoint_name(path.name) or 0)
        edit(payload)
        torch.save(payload, path)

    return make


def _edit_file(source: Path, path: Path) -> None:
    """``source``'s payload, less its digest of the named object ``ema``, saved as ``path``."""
    payload = torch.load(source, weights_only=True)
    payload["meta"]["digests"].pop("objects.ema")
    torch.save(payload, path)


def torn(path: Path) -> None:
    save(path.parent / "scratch", 30)
    whole = (path.parent / "scratch" / checkpoint_name(30)).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


class Opaque:
    """Someone else's class: a weights-only load refuses to import it."""


def _set(keys: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(payload: dict[str, Any]) -> None:
        target: Any = payload
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value

    return edit


# name -> (maker of the bad file, state, words its reason must contain)
BAD_FILES: dict[str, tuple[Callable[[Path], object], CheckpointState, str]] = {
    "plain-tensor": (lambda p: torch.save(torch.zeros(3), p), FOREIGN, "holds a torch.Tensor"),
    "dict-without-keys": (
        lambda p: torch.save({"weights": {"w": torch.zeros(2)}}, p),
        FOREIGN,
        "{weights} with no hpc-ddp format marker",
    ),
    "other-trainer": (
        lambda p: torch.save({"state_dict": small_model().state_dict(), "epoch": 3}, p),
        FOREIGN,
        "{epoch, state_dict} with no hpc-ddp format marker",
    ),
    "custom-class": (
        lambda p: torch.save({"model": Opaque()}, p),
        FOREIGN,
        "holds a tests.checkpoint.test_format.Opaque",
    ),
    "raw-pickle": (
        lambda p: p.write_bytes(pickle.dumps({"model": {}})),
        FOREIGN,
        "not a torch zip file",
    ),
    "text-file": (lambda p: p.write_text("step 30\n"), FOREIGN, "not a torch zip file"),
    "legacy-torch-format": (
        lambda p: torch.save({"model": {}}, p, _use_new_zipfile_serialization=False),
        FOREIGN,
        "not a torch zip file",
    ),
    "newer-format-version": (edited(_set(("version",), 3)), FOREIGN, "format version 3"),
    "zero-bytes": (lambda p: p.write_bytes(b""), DAMAGED, "empty file (0 bytes)"),
    "zero-filled": (lambda p: p.write_bytes(b"\0" * 4096), DAMAGED, "zero bytes"),
    "torn": (torn, DAMAGED, "torn: the zip archive has no end"),
    "dangling-symlink": (
        lambda p: p.symlink_to(p.parent / "gone.pt"),
        DAMAGED,
        "dangling symlink to",
    ),
    "directory": (lambda p: p.mkdir(), DAMAGED, "not a regular file"),
    "lacks-rng": (edited(lambda d: d.pop("rng")), DAMAGED, "checkpoint lacks rng"),
    "step-not-int": (edited(_set(("progress", "step"), "30")), DAMAGED, "progress.step is '30'"),
    "model-not-dict": (edited(_set(("model",), torch.zeros(2))), DAMAGED, "model is a Tensor"),
    "no-digest": (edited(_set(("meta", "digests"), None)), DAMAGED, "meta.digests is None"),
    "a-digest-missing": (
        edited(lambda d: d["meta"]["digests"].pop("optimizer")),
        DAMAGED,
        "meta.digests is a dict of 8, expected a hex digest for every section and meta",
    ),
    "a-named-objects-digest-missing": (
        lambda p: _edit_file(save(p.parent / "scratch", 30), p),
        DAMAGED,
        "meta.digests is a dict of 10, expected a hex digest for every section and meta",
    ),
    "named-objects-not-a-dict": (
        edited(_set(("objects",), [{}])),
        DAMAGED,
        "objects is a list of 1, expected a dict of state dicts by name, or absent",
    ),
    "other-digest-algorithm": (
        edited(_set(("meta", "digest"), "sha1")),
        DAMAGED,
        "meta.digest is 'sha1', expected 'xxh3-128'",
    ),
    "rng-entry-wrong": (edited(_set(("rng",), [{}])), DAMAGED, "rng is a list of 1, expected"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_newest_is_listed_with_reason_and_skipped_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    make, state, reason = BAD_FILES[case]
    save(tmp_path, 10)
    good = save(tmp_path, 20)
    bad = tmp_path / checkpoint_name(30)
    make(bad)
    for verify in (False, True):
        infos = list_checkpoints(tmp_path, verify=verify)
        assert [(i.step, i.state) for i in infos] == [(10, OK), (20, OK), (30, state)]
        assert infos[-1].error is not None
        assert reason in infos[-1].error
        assert "\n" not in infos[-1].error
        assert "\x1b" not in infos[-1].error  # torch's messages carry terminal escapes
        assert (infos[-1].epoch, infos[-1].time, infos[-1].weights_digest) == (None, None, None)
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.checkpoint.format"):
        found = find_latest(tmp_path)
    assert found is not None
    assert found[0] == good
    assert found[1]["progress"]["step"] == 20
    [warning] = [r.getMessage() for r in caplog.records]
    assert str(bad) in warning
    assert reason in warning
    with pytest.raises(CheckpointError, match=rf"^{bad}: {state.value} checkpoint: .*HINT: "):
        load_checkpoint(bad)


def test_only_bad_files_is_an_error_naming_the_newest(tmp_path: Path) -> None:
    for case, step in (("zero-bytes", 1), ("plain-tensor", 2)):
        BAD_FILES[case][0](tmp_path / checkpoint_name(step))
    with pytest.raises(CheckpointError, match=r"none of 2 checkpoints loads \(newest: step-0+2"):
        find_latest(tmp_path)
    assert [i.state for i in list_checkpoints(tmp_path)] == [DAMAGED, FOREIGN]


def damage_tensor(*keys: str | int) -> Callable[[Path], None]:
    """A maker of damage: flip the low bit of 4 bytes in the middle of the stored data of the
    tensor at ``keys`` (found in the file by its bytes), as bit rot or a bad copy would. The zip
    and the pickle stay intact, so ``torch.load`` still succeeds."""

    def damage(path: Path) -> None:
        tensor: Any = torch.load(path, weights_only=True)
        for key in keys:
            tensor = tensor[key]
        data = tensor.contiguous().view(torch.uint8).flatten().numpy().tobytes()
        raw = bytearray(path.read_bytes())
        at = raw.find(data)
        assert at >= 0, "the tensor's bytes are not in the file"
        assert raw.find(data, at + 1) < 0, "the tensor's bytes are in the file twice"
        middle = at + len(data) // 2
        for i in range(middle, middle + 4):
            raw[i] ^= 0x01
        path.write_bytes(bytes(raw))

    return damage


def stale(edit: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    """A maker of damage: the file's payload changed by ``edit`` and saved again with the
    digests it recorded before (what a changed byte in its pickle would amount to)."""

    def damage(path: Path) -> None:
        data = torch.load(path, weights_only=True)
        edit(data)
        torch.save(data, path)

    return damage


def all_of(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        for one in damages:
            one(path)

    return damage


def optimizer_bytes(param: int) -> Callable[[Path], None]:
    return damage_tensor("optimizer", "state", param, "momentum_buffer")


# name -> (damage to a good checkpoint, how the reason names what changed)
DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "weights-bytes": (damage_tensor("model", "0.weight"), "weights (model) does not match its"),
    "optimizer-bytes": (optimizer_bytes(0), "optimizer state does not match its"),
    "rng-bytes": (damage_tensor("rng", 1, "torch"), "RNG states does not match its"),
    "optimizer-lr": (
        stale(_set(("optimizer", "param_groups", 0, "lr"), 0.2)),
        "optimizer state does not match its",
    ),
    "scheduler": (stale(_set(("scheduler",), {"last_epoch": 3})), "scheduler state does not"),
    "scaler": (stale(_set(("scaler",), {"scale": 2.0})), "grad scaler state does not match"),
    "progress": (
        stale(_set(("progress", "batch_in_epoch"), 9)),
        "progress (step, epoch, batch) does not match its",
    ),
    "extra": (stale(_set(("extra", "k"), 2)), "extra values does not match its"),
    "config": (stale(_set(("config", "train", "lr"), 0.2)), "config does not match its"),
    "named-object-bytes": (
        damage_tensor("objects", "ema", "0.weight"),
        "state of 'ema' does not match its",
    ),
    "named-object-value": (
        stale(_set(("objects", "curriculum", "level"), 4)),
        "state of 'curriculum' does not match its",
    ),
    "meta": (stale(_set(("meta", "time"), 0.0)), "meta (world size, time, versions) does not"),
    "two-sections": (
        all_of(optimizer_bytes(1), damage_tensor("rng", 0, "torch")),
        "optimizer state, RNG states do not match their recorded digest",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_change_in_any_section_is_named_and_resume_takes_the_previous_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """Issue 20: flipped bytes in the optimizer state loaded as if whole, and the run went on
    with nan. Every section a resume restores now has its digest, checked on every load."""
    damage, words = DAMAGE[case]
    paths = [save(tmp_path, step) for step in (10, 20, 30)]
    newest = paths[-1]
    damage(newest)
    load_checkpoint(newest, verify=False)  # the damage is invisible to torch.load
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.checkpoint.format"):
        found = find_latest(tmp_path)
    assert found is not None
    assert found[0] == paths[1]
    assert found[1]["progress"]["step"] == 20
    [warning] = [r.getMessage() for r in caplog.records]
    assert str(newest) in warning
    assert words in warning
    assert "recorded digest" in warning
    with pytest.raises(CheckpointError, match=r"damaged checkpoint: .*recorded digest.*HINT"):
        load_checkpoint(newest)
    # listing without --verify does not hash the content; with it, the same check as resume
    assert [i.state for i in list_checkpoints(tmp_path)] == [OK, OK, OK]
    verified = list_checkpoints(tmp_path, verify=True)
    assert [i.state for i in verified] == [OK, OK, DAMAGED]
    assert words in (verified[-1].error or "")


def test_flipped_weights_found_by_their_digest(tmp_path: Path) -> None:
    """The weights' own digest is what ``hpc-ddp checkpoints`` shows for the file."""
    newest = save(tmp_path, 30)
    recorded = torch.load(newest, weights_only=True)["meta"]["digests"]["model"]
    flip_tensor_bytes(newest)
    raw = load_checkpoint(newest, verify=False)
    assert raw["meta"]["digests"]["model"] == recorded
    assert weights_digest(raw["model"]) != recorded
    [info] = list_checkpoints(tmp_path)
    assert info.weights_digest == recorded


# --- format 1: loads, with only its weights verified ------------------------------------------


def _v1_weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """Format 1's digest, written out here as hpc-ddp 0.1 computed it."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key].detach().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def save_v1(directory: Path, step: int, *, ranks: int = 2) -> Path:
    """A checkpoint as hpc-ddp wrote it before format 2: only the weights digested."""
    path = save(directory, step, ranks=ranks)
    data = torch.load(path, weights_only=True)
    data["version"] = 1
    del data["meta"]["digest"], data["meta"]["digests"]
    data["meta"]["weights_digest"] = _v1_weights_digest(data["model"])
    torch.save(data, path)
    return path


def test_a_format_1_file_loads_with_only_its_weights_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The decision for old files: a run survives an upgrade of hpc-ddp between attempts, and
    nobody is told that unverified state was verified."""
    old = save_v1(tmp_path, 10)
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0] == old
    [info] = list_checkpoints(tmp_path, verify=True)
    assert (info.state, info.version, info.unverified) == (OK, 1, V1_UNVERIFIED)
    assert info.weights_digest == torch.load(old, weights_only=True)["meta"]["weights_digest"]
    damage_tensor("optimizer", "state", 0, "momentum_buffer")(old)
    [info] = list_checkpoints(tmp_path, verify=True)
    assert info.state is OK  # what format 1 cannot see; it says so instead
    assert "optimizer" in info.unverified
    damage_tensor("model", "0.weight")(old)
    [info] = list_checkpoints(tmp_path, verify=True)
    assert info.state is DAMAGED
    assert "weights (model) does not match its recorded digest" in (info.error or "")
    save(tmp_path, 20)  # a format-2 file written by this version
    assert [(i.version, i.unverified) for i in list_checkpoints(tmp_path, verify=True)] == [
        (None, ()),
        (2, ()),
    ]


@pytest.mark.usefixtures("own_process")
def test_resuming_from_a_format_1_file_warns_what_is_unverified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = save_v1(tmp_path / "checkpoints", 10, ranks=1)  # this session's world size
    config = JobConfig(name="t")
    with caplog.at_level(logging.WARNING, logger="hpc_ddp"), Session(tmp_path, config, env={}) as s:
        model = s.wrap(small_model(0))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        s.restore(model=model, optimizer=opt)
        assert s.progress.step == 10
    warned = [r.getMessage() for r in caplog.records if old.name in r.getMessage()]
    assert any(
        "format-1 checkpoint: only its weights have a digest; its optimizer, scheduler, "
        "scaler, progress, extra, rng, config were restored unverified" in w
        for w in warned
    ), warned


def test_dangling_latest_pointer_is_harmless_and_replaced(tmp_path: Path) -> None:
    save(tmp_path, 10)
    (tmp_path / LATEST_CHECKPOINT).unlink()
    (tmp_path / LATEST_CHECKPOINT).symlink_to(tmp_path / "step-00000099.pt")
    assert [(i.step, i.state) for i in list_checkpoints(tmp_path, verify=True)] == [(10, OK)]
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0].name == "step-00000010.pt"
    save(tmp_path, 20)
    assert not (tmp_path / LATEST_CHECKPOINT).is_symlink()
    assert (tmp_path / LATEST_CHECKPOINT).read_text().strip() == "step-00000020.pt"


def test_symlinked_checkpoint_that_resolves_is_good(tmp_path: Path) -> None:
    target = save(tmp_path / "elsewhere", 10)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / target.name).symlink_to(target)
    [info] = list_checkpoints(tmp_path / "ckpt", verify=True)
    assert (info.state, info.size) == (OK, target.stat().st_size)
    found = find_latest(tmp_path / "ckpt")
    assert found is not None
    assert found[1]["progress"]["step"] == 10


@pytest.mark.parametrize(
    "name", [".tmp-step-00000030.pt.99999", "step-00000030.pt.tmp", "step-00000030.pt.part"]
)
def test_half_written_files_are_never_taken_for_checkpoints(tmp_path: Path, name: str) -> None:
    """A killed writer leaves ``.tmp-step-N.pt.PID``, whole or torn; copy tools leave
    ``.tmp``/``.part`` files. None of them is newer than the last renamed checkpoint."""
    good = save(tmp_path, 20)
    complete = tmp_path / name  # whole payload, but the rename that publishes it never ran
    torch.save(real_payload(30), complete)
    torn_tmp = tmp_path / f"{name}.torn"
    torn_tmp.write_bytes(complete.read_bytes()[:1000])
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0] == good
    assert [i.step for i in list_checkpoints(tmp_path, verify=True)] == [20]
    if name.startswith(".tmp-"):  # the next save sweeps a dead writer's temp files
        save(tmp_path, 21)
        assert not complete.exists()


def train_in_session(run_dir: Path, total: int) -> tuple[int, str]:
    """A single-process session run to ``total`` steps, checkpointing every step; the step it
    resumed from and the digest of the weights it resumed with."""
    with Session(run_dir, JobConfig(name="t", train=TrainConfig(keep_last=10)), env={}) as s:
        model = s.wrap(small_model(0))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        s.restore(model=model, optimizer=opt)
        resumed = (s.progress.step, weights_digest(unwrap(model).state_dict()))
        x = torch.linspace(-1, 1, 32).reshape(4, 8)
        for _ in s.steps(total, checkpoint_every=1):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        s.checkpoint(wait=True)
    return resumed


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("case", ["weights-bytes", "optimizer-bytes"])
def test_session_restore_skips_a_damaged_file_and_retrains_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    assert train_in_session(tmp_path, 3)[0] == 0
    before = {i.step: i.weights_digest for i in list_checkpoints(tmp_path, verify=True)}
    assert sorted(before) == [1, 2, 3]
    newest = tmp_path / "checkpoints" / checkpoint_name(3)
    damage, words = DAMAGE[case]
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.checkpoint.format"):
        resumed_step, resumed_digest = train_in_session(tmp_path, 4)
    assert (resumed_step, resumed_digest) == (2, before[2])
    assert any(str(newest) in r.getMessage() and words in r.getMessage() for r in caplog.records)
    after = list_checkpoints(tmp_path, verify=True)
    assert [(i.step, i.state) for i in after] == [(1, OK), (2, OK), (3, OK), (4, OK)]
    assert after[2].weights_digest == before[3]  # step 3 trained again, bit for bit


def test_verified_load_overhead_is_small(tmp_path: Path) -> None:
    """The digest check on load stays cheap next to the load (about 30 ms per 47 MB)."""
    payload = build_payload(
        model={f"w{i}": torch.randn(1024, 1024) for i in range(20)},  # 80 MiB of weights
        progress=Progress(step=1),
        rng=[capture_rng_state(CPU)],
    )
    path = write_checkpoint(tmp_path, payload, keep_last=0)

    def best(verify: bool) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            load_checkpoint(path, verify=verify)
            times.append(time.perf_counter() - start)
        return min(times)

    plain, verified = best(False), best(True)
    assert verified - plain < max(1.0, 3 * plain), (plain, verified)


# --- identity: a file's name, run and config -------------------------------------------------


def test_a_copy_under_a_newer_steps_name_is_damaged_and_never_resumed_from(
    tmp_path: Path,
) -> None:
    """Issue 31: `cp step-00000100.pt step-00009999.pt` was listed ok and resumed from, so the
    newer step 120 was skipped."""
    save(tmp_path, 100)
    save(tmp_path, 120)
    copy = tmp_path / "step-00009999.pt"
    copy.write_bytes((tmp_path / "step-00000100.pt").read_bytes())
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0].name == "step-00000120.pt"
    for verify in (False, True):
        [info] = [i for i in list_checkpoints(tmp_path, verify=verify) if i.step == 9999]
        assert info.state is CheckpointState.DAMAGED
        assert info.error == "named step 9999 but holds step 100 (copied or renamed)"
    with pytest.raises(CheckpointError, match="named step 9999 but holds step 100"):
        load_checkpoint(copy)


def test_another_runs_file_is_a_stranger_and_an_old_one_without_a_run_is_accepted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def write(step: int, run_id: str | None) -> Path:
        payload = build_payload(
            model={"w": torch.ones(2)}, progress=Progress(step=step), rng=[], run_id=run_id
        )
        return write_checkpoint(tmp_path, payload, 0)

    write(10, None)  # an hpc-ddp before checkpoints recorded their run
    write(20, "mine-00000001")
    stranger = write(30, "theirs-0000002")
    with caplog.at_level(logging.WARNING):
        found = find_latest(tmp_path, run_id="mine-00000001")
    assert found is not None
    assert found[0].name == "step-00000020.pt"
    why = "written by run theirs-0000002, not by this run (mine-00000001)"
    assert why in caplog.text
    with pytest.raises(CheckpointError, match=r"stranger checkpoint: written by run theirs"):
        load_checkpoint(stranger, run_id="mine-00000001")
    infos = list_checkpoints(tmp_path, verify=True, run_id="mine-00000001")
    assert [(i.step, i.state, i.run_id) for i in infos] == [
        (10, CheckpointState.OK, None),
        (20, CheckpointState.OK, "mine-00000001"),
        (30, CheckpointState.STRANGER, None),
    ]
    assert infos[2].error == why
    (tmp_path / "step-00000020.pt").unlink()
    found = find_latest(tmp_path, run_id="mine-00000001")
    assert found is not None
    assert found[0].name == "step-00000010.pt"  # unknown identity: loads
    assert load_checkpoint(stranger)["meta"]["run_id"] == "theirs-0000002"  # no run: any


def test_a_run_id_changed_on_disk_fails_the_meta_digest(tmp_path: Path) -> None:
    payload = build_payload(
        model={"w": torch.ones(2)}, progress=Progress(step=3), rng=[], run_id="aaaa-00000001"
    )
    path = write_checkpoint(tmp_path, payload, 0)
    data = path.read_bytes()
    assert data.count(b"aaaa-00000001") == 1
    path.write_bytes(data.replace(b"aaaa-00000001", b"bbbb-00000001"))
    with pytest.raises(CheckpointError, match=r"meta .* does not match its recorded digest"):
        load_checkpoint(path, run_id="bbbb-00000001")


@pytest.mark.parametrize("back", [23, 22, 20, 12, 1])
def test_a_flipped_bit_in_the_zip_trailer_falls_back_to_the_older_checkpoint(
    tmp_path: Path, back: int
) -> None:
    """Issue 31: bit 4 of byte size-23 (the zip64 end-of-directory locator) made
    zipfile.is_zipfile raise BadZipFile out of find_latest, `checkpoints` and `--verify`."""
    save(tmp_path, 100)
    newest = save(tmp_path, 120)
    data = bytearray(newest.read_bytes())
    data[-back] ^= 1 << 4
    newest.write_bytes(bytes(data))
    found = find_latest(tmp_path)
    assert found is not None
    if found[0] == newest:  # a byte nothing reads: what loads is what was saved
        assert found[1]["progress"]["step"] == 120
    else:
        assert found[0].name == "step-00000100.pt"
    [info] = [i for i in list_checkpoints(tmp_path, verify=True) if i.step == 120]
    assert (info.state is CheckpointState.OK) == (found[0] == newest)


@pytest.mark.parametrize(
    "exc",
    [
        struct.error("unpack requires a buffer of 4 bytes"),
        OverflowError("Python int too large to convert to C ssize_t"),
        MemoryError(),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        zipfile.BadZipFile("Bad magic number for file header"),
        EOFError("Ran out of input"),
        pickle.UnpicklingError("invalid load key, '\\x00'."),
    ],
    ids=lambda e: type(e).__name__,
)
def test_any_exception_a_reader_raises_makes_the_file_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    """Whatever zipfile raises on a damaged archive (it lets more than BadZipFile out of
    is_zipfile) is damage, never a crash, and resume takes the older file."""
    save(tmp_path, 100)
    save(tmp_path, 120)
    real = zipfile.is_zipfile

    def is_zipfile(f: Any) -> bool:
        if Path(getattr(f, "name", f)).name == "step-00000120.pt":
            raise exc
        return real(f)

    monkeypatch.setattr(zipfile, "is_zipfile", is_zipfile)
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0].name == "step-00000100.pt"
    [info] = [i for i in list_checkpoints(tmp_path, verify=True) if i.step == 120]
    assert info.state is CheckpointState.DAMAGED
    assert info.error is not None
    assert info.error.startswith(f"damaged zip archive ({type(exc).__name__}")
