"""The run id: created once, kept across resubmits, one id for racing readers."""

from __future__ import annotations

import multiprocessing
import os
import re
from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.run_id import MAX_RUN_ID_LEN, read_run_id
from hpc_ddp.submission.submit import create_run_dir, make_run_dir

STAMP = "20260101-120000"


# --- the run id -----------------------------------------------------------------------------------


def test_make_creates_the_run_id_once_and_a_resubmit_keeps_it(tmp_path: Path) -> None:
    paths = RunPaths(create_run_dir(tmp_path, "quickstart", STAMP))
    make_run_dir(paths)
    run_id = paths.run_id_file.read_text()
    assert re.fullmatch(r"quickstart-[0-9a-f]{8}\n", run_id)
    make_run_dir(paths)  # hpc-ddp resume and a requeue reuse the directory
    assert read_run_id(paths) == read_run_id(RunPaths(paths.root)) == run_id.strip()
    assert paths.run_id_file.read_text() == run_id
    other = RunPaths(create_run_dir(tmp_path, "quickstart", STAMP))  # quickstart-<stamp>-2
    make_run_dir(other)
    assert read_run_id(other) != read_run_id(paths)
    assert read_run_id(other).startswith("quickstart-")


def test_an_old_run_without_an_id_gets_one_on_first_read(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "old-job-20250101-000000-3")
    paths.root.mkdir()
    assert not paths.run_id_file.exists()
    first = read_run_id(paths)
    assert re.fullmatch(r"old-job-[0-9a-f]{8}", first)
    assert read_run_id(paths) == first
    assert [p.name for p in paths.root.iterdir()] == ["run_id"]  # no temp file left behind


def test_each_sweep_task_has_its_own_id(tmp_path: Path) -> None:
    sweep = RunPaths(tmp_path / "sweep-lr-20261122-101500")
    ids = []
    for i in range(3):
        sweep.task(i).root.mkdir(parents=True)
        ids.append(read_run_id(sweep.task(i)))
    assert [i.rsplit("-", 1)[0] for i in ids] == ["sweep-lr-t0", "sweep-lr-t1", "sweep-lr-t2"]
    assert [read_run_id(sweep.task(i)) for i in range(3)] == ids


def test_a_long_or_odd_name_still_gives_a_valid_id(tmp_path: Path) -> None:
    root = tmp_path / ("n" * 120 + "-20261122-101500")
    root.mkdir()
    assert len(read_run_id(RunPaths(root))) == MAX_RUN_ID_LEN
    odd = tmp_path / "a b:c/"
    odd.mkdir()
    assert re.fullmatch(r"a-b-c-[0-9a-f]{8}", read_run_id(RunPaths(odd)))


def _read_id(root: str) -> str:
    return read_run_id(RunPaths(Path(root)))


def test_racing_first_readers_all_get_the_same_id(tmp_path: Path) -> None:
    # Every rank of a sweep task's first attempt may read (and so create) it at once.
    ctx = multiprocessing.get_context("fork")
    for n in range(5):
        root = tmp_path / f"job-{n}"
        root.mkdir()
        with ctx.Pool(8) as pool:
            got = pool.map(_read_id, [str(root)] * 16)
        assert len(set(got)) == 1, got
        assert [p.name for p in root.iterdir()] == ["run_id"]


def test_without_hard_links_the_exclusive_create_still_gives_one_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")  # as on a file system without them

    monkeypatch.setattr(os, "link", no_links)
    paths = RunPaths(tmp_path)
    first = read_run_id(paths)
    assert read_run_id(paths) == first
    assert [p.name for p in tmp_path.iterdir()] == ["run_id"]


def test_a_damaged_run_id_is_an_error_not_a_new_id(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    for content in ("", "has spaces\n", "x" * 65, "../escape"):
        paths.run_id_file.write_text(content)
        with pytest.raises(RunDirError, match=r"damaged run id .*HINT: restore it"):
            read_run_id(paths)
        assert paths.run_id_file.read_text() == content  # left for the user to repair
