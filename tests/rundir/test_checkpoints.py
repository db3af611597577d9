"""The checkpoints of a directory, listed and judged without torch: every ``step-*.pt`` name,
why a file cannot be a whole checkpoint (empty, torn, spliced, not a regular file, misnamed,
another run's), and the newest one that looks whole, which every side takes for "the newest
checkpoint" (the supervisor, ``status``, a forced local stop)."""

from __future__ import annotations

import errno
import os
import pickle
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.rundir.checkpoints import (
    checkpoint_files,
    checkpoint_on_disk,
    damaged_checkpoint,
    newest_checkpoint,
    newest_step,
    shard_sets,
)
from hpc_ddp.rundir.layout import Checkpoint
from tests.rundir.test_shard_sets import shard_set

# --- one file: damaged_checkpoint -------------------------------------------------------------


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


# --- a directory: checkpoint_files and newest_step ------------------------------------------------


def _labelled(path: Path, step: int, run_id: str | None = None) -> None:
    """A zip archive whose pickle says ``step`` (and ``run_id``), as a checkpoint's does."""
    payload = {"progress": {"step": step}, "meta": {"run_id": run_id}, "pad": "x" * 400}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def test_checkpoint_files_lists_step_names_newest_first_and_nothing_else(tmp_path: Path) -> None:
    assert checkpoint_files(tmp_path / "none") == []
    for name in ("step-00000010.pt", "step-00000140.pt", "step-00000020.pt"):
        (tmp_path / name).write_text("x")
    for name in (".tmp-step-00000150.pt.123", "step-00000160.pt.part", "latest", "step-1.ckpt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "step-00000170.pt").mkdir()  # listed by name: judging it is the caller's
    assert [(s, p.name) for s, p in checkpoint_files(tmp_path)] == [
        (170, "step-00000170.pt"),
        (140, "step-00000140.pt"),
        (20, "step-00000020.pt"),
        (10, "step-00000010.pt"),
    ]


def test_checkpoint_files_of_a_directory_it_cannot_list_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "No checkpoint" would start the run over: a directory that cannot be listed (a dead
    file system; root reads any directory, so the error is made here) is no empty one. The
    supervisor and a forced stop go on without a newest step; ``status`` shows the error."""
    (tmp_path / "step-00000010.pt").write_text("x")

    def dead(self: Path) -> Iterator[Path]:
        raise OSError(errno.EIO, "Input/output error", str(self))

    monkeypatch.setattr(Path, "iterdir", dead)
    with pytest.raises(OSError, match="Input/output"):
        checkpoint_files(tmp_path)
    assert newest_step(tmp_path) is None
    with pytest.raises(OSError, match="Input/output"):
        newest_step(tmp_path, unlistable_ok=False)


def test_the_newest_step_is_the_newest_file_that_looks_whole(tmp_path: Path) -> None:
    """Issue 31: a copy named step-00009999.pt, a FIFO or a cut file was taken for the newest
    checkpoint (the launch said "from step 9999", and no_progress compared with it)."""
    assert newest_step(tmp_path / "none") is None
    for step in (0, 10, 140):
        _labelled(tmp_path / f"step-{step:08d}.pt", step)
    for name in (".tmp-step-00000150.pt", "latest", "step-00000150.pt.tmp"):
        (tmp_path / name).write_text("x")
    assert newest_step(tmp_path) == 140
    _labelled(tmp_path / "step-00009999.pt", 140)  # a copy under a newer name
    os.mkfifo(tmp_path / "step-00000160.pt")  # never opened
    (tmp_path / "step-00000170.pt").mkdir()  # a directory named like a checkpoint
    (tmp_path / "step-00000150.pt").write_bytes((tmp_path / "step-00000140.pt").read_bytes()[:-9])
    (tmp_path / "step-00000180.pt").write_bytes(b"")  # empty
    _labelled(tmp_path / "step-00000190.pt", 190)
    whole = (tmp_path / "step-00000190.pt").read_bytes()
    (tmp_path / "step-00000190.pt").write_bytes(whole[:10] + whole[60:])  # spliced
    skipped: list[tuple[int, str]] = []
    assert newest_step(tmp_path, on_skip=lambda s, why: skipped.append((s, why))) == 140
    assert [s for s, _ in skipped] == [9999, 190, 180, 170, 160, 150]
    assert skipped[0][1] == "named step 9999 but holds step 140 (copied or renamed)"
    assert "spliced or torn" in skipped[1][1]
    assert skipped[3][1] == "not a regular file (a directory)"
    assert skipped[4][1] == "not a regular file (a FIFO)"
    for path in tmp_path.glob("step-000001*.pt"):
        path.rmdir() if path.is_dir() else path.unlink()
    os.unlink(tmp_path / "step-00009999.pt")
    assert newest_step(tmp_path) == 10
    os.unlink(tmp_path / "step-00000010.pt")
    assert newest_step(tmp_path) == 0  # step 0 is a checkpoint too


def test_the_newest_step_of_a_run_passes_over_another_runs_file(tmp_path: Path) -> None:
    _labelled(tmp_path / "step-00000010.pt", 10, "mine-1")
    _labelled(tmp_path / "step-00000020.pt", 20, None)  # before runs were recorded: accepted
    _labelled(tmp_path / "step-00000030.pt", 30, "theirs-2")
    skipped: list[tuple[int, str]] = []
    assert newest_step(tmp_path, run_id="mine-1", on_skip=lambda *s: skipped.append(s)) == 20
    assert skipped == [(30, "written by run theirs-2, not by this run (mine-1)")]
    assert newest_step(tmp_path) == 30  # no run to compare with
    (tmp_path / "step-00000020.pt").unlink()
    assert newest_step(tmp_path, run_id="mine-1") == 10
    assert newest_step(tmp_path, run_id="other-3") is None


def test_a_committed_shard_set_counts_as_a_checkpoint_a_partial_one_does_not(
    tmp_path: Path,
) -> None:
    """An FSDP run's checkpoints are step-N/ directories (the supervisor's no-progress check and
    status compare them too); one without its digest record, or still under its .partial-
    name, is no checkpoint, and a newer whole file still wins over an older set."""
    assert newest_step(tmp_path / "none") is None
    for step in (20, 30, 40):
        shard_set(tmp_path, step)
    (tmp_path / "step-00000040").rename(tmp_path / ".partial-step-00000040")
    (tmp_path / "step-00000050").mkdir()  # no record: not committed
    assert [s for s, _ in shard_sets(tmp_path)] == [30, 20]
    assert newest_step(tmp_path) == 30
    (tmp_path / "step-00000060.pt").write_bytes(b"")  # damaged: passed over
    skipped: list[int] = []
    assert newest_step(tmp_path, on_skip=lambda s, _: skipped.append(s)) == 30
    assert skipped == [60, 50]  # the set without its record is named, as the ranks name it


def test_the_newest_checkpoint_is_named_as_it_is_listed_a_shard_set_or_a_file(
    tmp_path: Path,
) -> None:
    """What the supervisor and a forced local stop name a launch's checkpoint by: the name it
    has on disk, step-N/ for a committed shard set and step-N.pt for a file, never one rebuilt
    from the step."""
    assert newest_checkpoint(tmp_path / "none") is None
    shard_set(tmp_path, 20)
    (tmp_path / "step-00000030").mkdir()  # no record: not committed
    assert newest_checkpoint(tmp_path) == Checkpoint(20, "step-00000020")
    _labelled(tmp_path / "step-00000040.pt", 40)
    assert newest_checkpoint(tmp_path) == Checkpoint(40, "step-00000040.pt")
    assert newest_step(tmp_path) == 40


@pytest.mark.parametrize(
    ("on_disk", "named", "expected"),
    [
        # a file run: the named save if it is there, else the newest before it
        (["step-00000020.pt", "step-00000040.pt"], "step-00000040.pt", "step-00000040.pt"),
        (["step-00000020.pt", ".step-00000040.pt.tmp.9"], "step-00000040.pt", "step-00000020.pt"),
        (["step-00000020.pt", "step-00000060.pt"], "step-00000040.pt", "step-00000020.pt"),
        (["step-00000060.pt"], "step-00000040.pt", None),
        ([], "step-00000040.pt", None),
        # an FSDP run: step-N/ sets, committed only with their record
        (["step-00000020/", "step-00000040/"], "step-00000040", "step-00000040"),
        (["step-00000020/", ".partial-step-00000040/"], "step-00000040", "step-00000020"),
        (["step-00000020/", "step-00000040/-"], "step-00000040", "step-00000020"),
        (["step-00000060/"], "step-00000040", None),
        # a name of neither kind: the newest there is
        (["step-00000020/", "step-00000010.pt"], "latest", "step-00000020"),
    ],
)
def test_checkpoint_on_disk_names_the_save_if_whole_else_the_newest_before_it(
    tmp_path: Path, on_disk: list[str], named: str, expected: str | None
) -> None:
    """What a failed attempt records: never a save still in flight (a temp file, a set under
    its .partial- name or without its digest record), but the newest one that is whole, of
    either kind."""
    for entry in on_disk:
        if entry.endswith("/-"):  # a set cut short: its directory, no record
            (tmp_path / entry[:-2]).mkdir()
        elif entry.endswith("/"):
            (tmp_path / entry[:-1]).mkdir()
            (tmp_path / entry[:-1] / "digests.json").write_text("{}")
        else:
            (tmp_path / entry).write_bytes(b"x")
    assert checkpoint_on_disk(tmp_path, named) == expected


def test_checkpoint_on_disk_of_a_missing_directory_is_none(tmp_path: Path) -> None:
    assert checkpoint_on_disk(tmp_path / "nowhere", "step-00000040") is None
