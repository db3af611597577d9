"""Claiming a fresh run directory atomically (threads and processes racing on the same
second), and refusing a runs directory that cannot hold runs.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.errors import RunsDirError
from hpc_ddp.runsdir import check_runs_dir, create_run_dir, new_run_dir

STAMP = "20260101-120000"


# --- claiming a run directory -------------------------------------------------------------------


def test_create_run_dir_takes_the_next_suffix(tmp_path: Path) -> None:
    assert new_run_dir(tmp_path, "job", STAMP) == tmp_path / f"job-{STAMP}"
    first = create_run_dir(tmp_path, "job", STAMP)
    second = create_run_dir(tmp_path, "job", STAMP)
    assert (first.name, second.name) == (f"job-{STAMP}", f"job-{STAMP}-2")
    assert new_run_dir(tmp_path, "job", STAMP) == tmp_path / f"job-{STAMP}-3"
    assert first.is_dir()
    assert second.is_dir()


def test_create_run_dir_makes_the_runs_dir(tmp_path: Path) -> None:
    base = tmp_path / "a" / "b"
    assert create_run_dir(base, "job", STAMP).parent == base


def test_create_run_dir_never_reuses_a_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / f"job-{STAMP}").symlink_to(tmp_path / "nowhere")
    assert new_run_dir(tmp_path, "job", STAMP).name == f"job-{STAMP}-2"
    assert create_run_dir(tmp_path, "job", STAMP).name == f"job-{STAMP}-2"


def _claim_and_write(base: str, marker: str) -> str:
    """One submit: claim a directory, then write what only this submit would write there."""
    run_dir = create_run_dir(Path(base), "job", STAMP)
    (run_dir / "config.yaml").write_text(marker)
    return str(run_dir)


def test_threads_racing_on_the_same_second_each_get_their_own_dir(tmp_path: Path) -> None:
    markers = [f"submit {i}" for i in range(64)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        dirs = list(pool.map(lambda m: _claim_and_write(str(tmp_path), m), markers))
    assert len(set(dirs)) == len(markers)
    for run_dir, marker in zip(dirs, markers, strict=True):
        assert Path(run_dir, "config.yaml").read_text() == marker  # nothing overwritten


def test_processes_racing_on_the_same_second_each_get_their_own_dir(tmp_path: Path) -> None:
    markers = [f"submit {i}" for i in range(24)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        dirs = pool.starmap(_claim_and_write, [(str(tmp_path), m) for m in markers])
    assert len(set(dirs)) == len(markers)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(d).name for d in dirs)
    for run_dir, marker in zip(dirs, markers, strict=True):
        assert Path(run_dir, "config.yaml").read_text() == marker


# --- a runs directory that cannot hold runs -------------------------------------------------------


def test_runs_dir_that_is_a_file_is_an_exit_2_error(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.write_text("not a directory")
    for call in (
        lambda: check_runs_dir(runs, write=False),
        lambda: new_run_dir(runs, "job", STAMP),
        lambda: create_run_dir(runs, "job", STAMP),
    ):
        with pytest.raises(RunsDirError, match="is a file, not a directory") as info:
            call()
        assert str(runs) in str(info.value)
        assert "HINT: pass an existing, writable directory with --runs-dir" in str(info.value)
        assert info.value.exit_code == 2
    assert runs.read_text() == "not a directory"


def test_runs_dir_under_a_file_is_an_exit_2_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunsDirError, match=r"cannot create --runs-dir .*HINT:") as info:
        create_run_dir(tmp_path / "file" / "runs", "job", STAMP)
    assert info.value.exit_code == 2


def test_unwritable_runs_dir_is_an_exit_2_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root ignores permission bits, so ask the question the code asks and answer it "no".
    runs = tmp_path / "runs"
    runs.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == runs else real_access(p, mode)
    )
    with pytest.raises(RunsDirError, match="is not writable by this user") as info:
        create_run_dir(runs, "job", STAMP)
    assert info.value.exit_code == 2
    with pytest.raises(RunsDirError, match="is not readable by this user"):
        check_runs_dir(runs, write=False)
    assert list(runs.iterdir()) == []


def test_mkdir_refused_is_an_exit_2_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(RunsDirError, match=r"cannot create .*Permission denied.*HINT:"):
        create_run_dir(tmp_path, "job", STAMP)


def test_missing_runs_dir_is_fine_to_read(tmp_path: Path) -> None:
    check_runs_dir(tmp_path / "none", write=False)  # nothing submitted yet: no error
