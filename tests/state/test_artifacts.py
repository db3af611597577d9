"""A run's files judged without torch: metrics lines, checkpoint files."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.state.artifacts import damaged_checkpoint, last_metric, shard_set_steps
from hpc_ddp.state.report import newest_checkpoint

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


LABEL = {"progress": {"step": 3}, "meta": {"run_id": "r-1"}, "pad": "x" * 400}


def _zip(path: Path, payload: object = LABEL) -> bytes:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))
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
    assert damaged_checkpoint(tmp_path / "dir.pt") == "not a regular file (a directory)"


@pytest.mark.torch
def test_a_real_torch_checkpoint_looks_whole_and_a_cut_one_does_not(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "step-00000001.pt"
    torch.save({"model": {"w": torch.zeros(64)}, "progress": {"step": 1}, "meta": {}}, path)
    assert damaged_checkpoint(path) is None
    data = path.read_bytes()
    path.write_bytes(data[:-30])
    assert damaged_checkpoint(path) == "truncated: the zip archive has no end"


@pytest.mark.torch
def test_a_checkpoint_hpc_ddp_writes_looks_whole_without_torch(tmp_path: Path) -> None:
    """The writer's own archive (format 2, written through its file sink) passes the login
    side's checks, and a record cut off at the end of the file does not."""
    from tests.checkpoint.test_format import save

    path = save(tmp_path, 7)
    assert damaged_checkpoint(path) is None
    data = path.read_bytes()
    directory = data.rfind(b"PK\x01\x02")  # the first central directory entry is before it
    start = data.find(b"PK\x01\x02")
    assert 0 < start < directory
    path.write_bytes(data[: start - 64] + data[start:])  # 64 bytes of the last record gone
    assert "spliced or torn: record" in (damaged_checkpoint(path) or "")


def test_a_file_named_for_another_step_than_it_holds_is_damaged(tmp_path: Path) -> None:
    _zip(tmp_path / "step-00000003.pt")
    (tmp_path / "step-00000003.pt").rename(tmp_path / "step-00009999.pt")
    assert damaged_checkpoint(tmp_path / "step-00009999.pt") == (
        "named step 9999 but holds step 3 (copied or renamed)"
    )
    _zip(tmp_path / "step-00000003.pt")
    assert damaged_checkpoint(tmp_path / "step-00000003.pt") is None


def test_another_runs_checkpoint_is_named_with_both_runs(tmp_path: Path) -> None:
    path = tmp_path / "step-00000003.pt"
    _zip(path)
    assert damaged_checkpoint(path, "r-2") == "written by run r-1, not by this run (r-2)"
    assert damaged_checkpoint(path, "r-1") is None
    assert damaged_checkpoint(path) is None  # no run to compare with
    # Written before checkpoints recorded their run: unknown, accepted.
    _zip(path, {"progress": {"step": 3}, "meta": {}})
    assert damaged_checkpoint(path, "r-2") is None


def _judged_in_time(path: Path) -> str | None:
    """damaged_checkpoint(path) in a thread: a blocked open() fails the test, not the suite."""
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(damaged_checkpoint(path)), daemon=True)
    worker.start()
    worker.join(10)
    assert got, f"damaged_checkpoint({path.name}) still blocked after 10 s"
    return got[0]


def test_a_fifo_or_socket_named_like_a_checkpoint_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "step-00000130.pt"
    os.mkfifo(fifo)
    assert _judged_in_time(fifo) == "not a regular file (a FIFO)"
    sock = tmp_path / "step-00000140.pt"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert _judged_in_time(sock) == "not a regular file (a socket)"
    link = tmp_path / "step-00000150.pt"
    link.symlink_to(fifo)
    assert _judged_in_time(link) == "not a regular file (a FIFO)"


@pytest.mark.torch
@pytest.mark.parametrize("back", [23, 22, 20, 12, 1])
def test_a_flipped_bit_in_the_zip_trailer_is_damage_not_a_crash(tmp_path: Path, back: int) -> None:
    """Bit 4 of byte size-23 (the zip64 end-of-directory locator) made zipfile.is_zipfile
    raise BadZipFile, which crashed status for every run."""
    from tests.checkpoint.test_format import save

    path = save(tmp_path, 120)
    data = bytearray(path.read_bytes())
    data[-back] ^= 1 << 4
    path.write_bytes(bytes(data))
    damaged_checkpoint(path)  # any answer but an exception


def test_an_fsdp_runs_committed_shard_sets_are_its_checkpoints(tmp_path: Path) -> None:
    """``hpc-ddp status`` shows an FSDP run's newest checkpoint: a step-N/ with its digest
    record; one without (a save cut short) or under its .partial- name is none."""
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    (paths.checkpoints / "step-00000010.pt").write_bytes(b"")  # damaged, and older anyway
    for name in ("step-00000020", "step-00000030", ".partial-step-00000040"):
        (paths.checkpoints / name).mkdir()
        (paths.checkpoints / name / "digests.json").write_text("{}")
    (paths.checkpoints / "step-00000050").mkdir()
    assert shard_set_steps(paths) == [20, 30]
    assert newest_checkpoint(paths) == (30, None)
