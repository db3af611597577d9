"""What a checkpoint file says it is, read without torch: never opening what is not a regular
file, never running what its pickle names, and the config digest's idea of what shapes a run."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.config.load import job_config_to_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.rundir.checkpoint_label import (
    Label,
    LabelError,
    config_digest,
    not_regular,
    read_label,
)


def _archive(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return path


class _Runs:
    """Unpickled by a real unpickler, this would run ``touch`` (``os.system``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_label_is_read_without_running_anything_the_pickle_names(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = {
        "progress": {"step": 12},
        "meta": {"run_id": "r-1", "config_digest": "ab" * 16},
        "model": {"w": _Runs(marker)},
    }
    path = _archive(tmp_path / "step-00000012.pt", pickle.dumps(payload, protocol=2))
    assert read_label(path) == Label(12, "r-1", "ab" * 16)
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(_Runs(marker))) == 0  # the payload is real
    assert marker.exists()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (pickle.dumps([1, 2]), "holds a list"),
        (pickle.dumps({"meta": {}}), "no progress or meta"),
        (pickle.dumps({"progress": {"step": -1}, "meta": {}}), "progress.step is '-1'"),
        (pickle.dumps({"progress": {"step": "7"}, "meta": {}}), "progress.step is '7'"),
        (b"\x80\x02}q\x00(X\xff\xff\xff\x7f", "UnpicklingError"),
        (b"", "EOFError"),
    ],
)
def test_an_unreadable_label_is_a_label_error(tmp_path: Path, payload: bytes, reason: str) -> None:
    with pytest.raises(LabelError, match=reason):
        read_label(_archive(tmp_path / "x.pt", payload))


def test_what_is_not_a_regular_file_is_named_without_opening_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert not_regular(tmp_path / "file") is None
    assert not_regular(tmp_path / "to-file") is None
    assert not_regular(tmp_path / "dir") == "not a regular file (a directory)"
    assert not_regular(tmp_path / "fifo") == "not a regular file (a FIFO)"
    assert not_regular(tmp_path / "dangling") == f"dangling symlink to {tmp_path / 'gone'}"
    assert not_regular(tmp_path / "missing") == "missing"


def test_the_config_digest_changes_with_what_shapes_the_state_only() -> None:
    base = job_config_to_dict(JobConfig(name="t"))
    digest = config_digest(base)

    def changed(section: str, key: str, value: Any) -> str:
        data = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
        data[section][key] = value
        return config_digest(data)

    for key, value in [("max_steps", 500), ("keep_last", 9), ("log_every", 1)]:
        assert changed("train", key, value) == digest, key
    elsewhere: list[tuple[str, str, Any]] = [("slurm", "nodes", 4), ("fault", "beat_s", 0.1)]
    for section, key, value in elsewhere:
        assert changed(section, key, value) == digest, key
    shaping: list[tuple[str, Any]] = [
        ("lr", 0.3), ("seed", 1), ("grad_accum", 2), ("model", "resnet18"),
    ]  # fmt: skip
    for key, value in shaping:
        assert changed("train", key, value) != digest, key
    assert changed("params", "width", 64) != digest
