"""The durable-write helpers: whole files or nothing, no temp files left, whole appended lines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp import durable
from hpc_ddp.durable import (
    append_line,
    create_atomic,
    fsync_dir,
    temp_path,
    write_atomic,
    write_bytes_atomic,
    write_text_atomic,
)


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_write_text_atomic_writes_the_content(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_text_atomic(path, "héllo\n")
    assert path.read_bytes() == "héllo\n".encode()
    write_text_atomic(path, "second\n")
    assert path.read_text() == "second\n"
    assert _leftovers(tmp_path, {"a.json"}) == []


def test_write_bytes_atomic_writes_the_content(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    write_bytes_atomic(path, b"\x00\xffdata")
    assert path.read_bytes() == b"\x00\xffdata"
    assert _leftovers(tmp_path, {"blob"}) == []


def test_the_temp_file_is_hidden_in_the_same_directory(tmp_path: Path) -> None:
    tmp = temp_path(tmp_path / "x.txt")
    assert tmp.parent == tmp_path
    assert tmp.name.startswith(".x.txt.tmp.")
    assert str(os.getpid()) in tmp.name


def test_a_failed_rename_keeps_the_old_content_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "manifest.json"
    write_text_atomic(path, "old\n")

    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert _leftovers(tmp_path, {"manifest.json"}) == []


def test_a_writer_failing_midway_keeps_the_old_content(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    write_bytes_atomic(path, b"old")

    def half(f: Any) -> None:
        f.write(b"half of the new")
        raise KeyboardInterrupt  # BaseException too: a signal mid-write

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, half)
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path, {"ckpt"}) == []


def test_a_custom_temp_name_is_used_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "latest"
    write_text_atomic(path, "step-1\n", tmp=tmp_path / ".tmp-latest.1")
    assert path.read_text() == "step-1\n"
    assert _leftovers(tmp_path, {"latest"}) == []


def test_the_directory_is_fsynced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    monkeypatch.setattr(durable, "fsync_dir", lambda p: synced.append(str(p)))
    write_text_atomic(tmp_path / "f", "x")
    assert synced == [str(tmp_path)]


def test_fsync_dir_accepts_a_directory(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    fsync_dir(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")


def test_append_line_appends_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    append_line(path, '{"a": 1}')
    append_line(path, '{"b": 2}\n')
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'


def test_append_line_ends_a_torn_line_first(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a": 1}\n{"torn')
    append_line(path, '{"b": 2}')
    assert path.read_text().splitlines() == ['{"a": 1}', '{"torn', '{"b": 2}']


def test_append_line_is_one_write_per_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    real = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", spy)
    path = tmp_path / "log"
    path.write_text("partial")
    append_line(path, "line")
    assert writes == [b"\nline\n"]


def test_create_atomic_creates_once_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "run_id"
    assert create_atomic(path, b"first\n") is True
    assert create_atomic(path, b"second\n") is False
    assert path.read_bytes() == b"first\n"
    assert _leftovers(tmp_path, {"run_id"}) == []


def test_create_atomic_racing_processes_agree_on_one_winner(tmp_path: Path) -> None:
    """Forked creators race for one name: exactly one wins, and the file holds its whole data."""
    path = tmp_path / "claim"
    pids = []
    for i in range(8):
        pid = os.fork()
        if pid == 0:  # child: report through the exit status whether it won
            won = create_atomic(path, f"creator {i}\n".encode() * 1000)
            os._exit(0 if won else 1)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes.count(0) == 1
    winner = codes.index(0)
    assert path.read_bytes() == f"creator {winner}\n".encode() * 1000
    assert _leftovers(tmp_path, {"claim"}) == []


def test_create_atomic_without_hard_links_falls_back_to_o_excl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise PermissionError(1, "Operation not permitted")  # what some FUSE mounts answer

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "run_id"
    assert create_atomic(path, b"x\n") is True
    assert create_atomic(path, b"y\n") is False
    assert path.read_bytes() == b"x\n"
    assert _leftovers(tmp_path, {"run_id"}) == []
