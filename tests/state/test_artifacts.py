"""A run's files judged without torch: metrics lines, checkpoint files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.layout import RunPaths
from hpc_ddp.state.artifacts import damaged_checkpoint, last_metric

STAMP = "20260101-120000"


# --- metrics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([b'{"loss": 1.0}', b'{"loss": 0.5}'], 0.5),
        ([b'{"loss": 1.0}', b'{"loss": 0.'], 1.0),  # torn last line
        ([b'{"loss": 1.0}', b"\xff\xfe\x00\x01binary\x80"], 1.0),
        ([b'{"loss": 1.0}', b"3", b"[1, 2]", b'"loss"', b"null", b'{"acc": 2}'], 1.0),
        ([b'"loss"'], None),  # a bare string is not a row, even if it spells the key
        ([b"\x00" * 64], None),
        ([], None),
    ],
)
def test_last_metric_skips_every_line_that_is_not_a_row(
    tmp_path: Path, lines: list[bytes], expected: float | None
) -> None:
    paths = RunPaths(tmp_path)
    paths.metrics.write_bytes(b"\n".join(lines) + b"\n")
    assert last_metric(paths, "loss") == expected


def test_last_metric_skips_a_line_nested_too_deep_to_parse(tmp_path: Path) -> None:
    # json.loads raises RecursionError (not ValueError) on absurd nesting: still just a bad line.
    paths = RunPaths(tmp_path)
    paths.metrics.write_text('{"loss": 2.0}\n' + "[" * 200_000 + "\n")
    assert last_metric(paths, "loss") == 2.0


def test_last_metric_without_a_file_is_none(tmp_path: Path) -> None:
    assert last_metric(RunPaths(tmp_path), "loss") is None


def test_unreadable_metrics_is_a_run_dir_error(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.metrics.mkdir()
    with pytest.raises(RunDirError, match=r"unreadable metrics .*HINT:"):
        last_metric(paths, "loss")


# --- checkpoints without torch ------------------------------------------------------------------


def _zip(path: Path) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 100)
    return path.read_bytes()


def _other_zip(path: Path) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", b"a zip, but not one torch wrote")
    return path.read_bytes()


def test_damaged_checkpoint_table(tmp_path: Path) -> None:
    whole = _zip(tmp_path / "whole.pt")
    cases = {
        "whole.pt": (whole, None),
        "empty.pt": (b"", "empty file"),
        "text.pt": (b"not a checkpoint at all", "not a torch zip archive"),
        "torn.pt": (whole[: len(whole) // 2], "truncated"),
        "old-pickle.pt": (b"\x80\x02}q\x00.", "not a torch zip archive"),
        "spliced.pt": (whole[:10] + whole[60:], "spliced or torn"),
        "other-zip.pt": (_other_zip(tmp_path / "o.zip"), "not a torch archive: no data.pkl"),
    }
    for name, (content, reason) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        got = damaged_checkpoint(path)
        if reason is None:
            assert got is None, name
        else:
            assert got is not None, name
            assert reason in got, (name, got)
    assert damaged_checkpoint(tmp_path / "missing.pt") is not None
    (tmp_path / "dir.pt").mkdir()
    assert "unreadable" in (damaged_checkpoint(tmp_path / "dir.pt") or "")


@pytest.mark.torch
def test_a_real_torch_checkpoint_looks_whole_and_a_cut_one_does_not(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "step-00000001.pt"
    torch.save({"model": {"w": torch.zeros(64)}, "format": "x"}, path)
    assert damaged_checkpoint(path) is None
    data = path.read_bytes()
    path.write_bytes(data[:-30])
    assert damaged_checkpoint(path) == "truncated: the zip archive has no end"


@pytest.mark.torch
def test_a_checkpoint_hpc_ddp_writes_looks_whole_without_torch(tmp_path: Path) -> None:
    """The writer's own archive (format 2, written through its file sink) passes the login
    side's checks, and a record cut off at the end of the file does not."""
    from tests.runtime.test_checkpoint import save

    path = save(tmp_path, 7)
    assert damaged_checkpoint(path) is None
    data = path.read_bytes()
    directory = data.rfind(b"PK\x01\x02")  # the first central directory entry is before it
    start = data.find(b"PK\x01\x02")
    assert 0 < start < directory
    path.write_bytes(data[: start - 64] + data[start:])  # 64 bytes of the last record gone
    assert "spliced or torn: record" in (damaged_checkpoint(path) or "")
