"""The run directory's own rules: claiming a fresh directory atomically (threads and processes
racing on the same second), refusing a runs directory that cannot hold runs, reading damaged
manifests and metrics as clear errors or skipped lines, and judging checkpoints without torch.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.errors import RunDirError, RunsDirError
from hpc_ddp.run_id import MAX_RUN_ID_LEN
from hpc_ddp.rundir import (
    Manifest,
    RunPaths,
    check_runs_dir,
    create_run_dir,
    damaged_checkpoint,
    last_metric,
    new_run_dir,
    read_manifest,
    read_run_id,
    write_manifest,
)

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


# --- damaged manifests --------------------------------------------------------------------------


def _manifest() -> Manifest:
    return Manifest("job", "slurm", "42", "2026-01-01T12:00:00+00:00", ["sbatch"], "j.yaml", "r")


def test_manifest_round_trip_and_unknown_keys_from_a_newer_version(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_manifest(paths, _manifest())
    assert read_manifest(tmp_path) == _manifest()
    data = json.loads(paths.manifest.read_text())
    paths.manifest.write_text(json.dumps({**data, "added_later": 1}))
    assert read_manifest(tmp_path).job_id == "42"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "JSONDecodeError"),
        (b'{"name": "job", "backend": "sl', "JSONDecodeError"),
        (b"\xff\xfe\x00garbage", "UnicodeDecodeError"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'"text"', "a JSON str, not an object"),
        (b'{"name": "job"}', "missing"),
        (
            b'{"name": "j", "backend": "slurm", "job_id": 42, "submitted_at": "", "command": [],'
            b' "config_source": "", "run_dir": ""}',
            "job_id is 42, expected str or null",
        ),
        (
            b'{"name": "j", "backend": "slurm", "job_id": "1", "submitted_at": "", "command": [],'
            b' "config_source": "", "run_dir": "", "array_jobs": [7]}',
            "array_jobs is [7], expected a list of strings",
        ),
    ],
)
def test_damaged_manifest_is_a_run_dir_error_naming_why(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(RunDirError) as info:
        read_manifest(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "manifest.json") in message
    assert "damaged manifest" in message
    assert reason in message
    assert "HINT:" in message


def test_manifest_that_is_a_directory_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(RunDirError, match=r"damaged manifest \(IsADirectoryError"):
        read_manifest(tmp_path)


def test_missing_manifest_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"no manifest.json\. HINT: pass a run directory"):
        read_manifest(tmp_path)


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


def test_write_text_atomic_is_still_importable_from_rundir() -> None:
    from hpc_ddp import durable, rundir

    assert rundir.write_text_atomic is durable.write_text_atomic


def test_write_manifest_leaves_no_temp_file(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    manifest = Manifest(
        name="j", backend="slurm", job_id="1", submitted_at="t", command=["sbatch"],
        config_source="job.yaml", run_dir=str(tmp_path),
    )  # fmt: skip
    write_manifest(paths, manifest)
    write_manifest(paths, manifest)
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    assert read_manifest(tmp_path) == manifest


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


def test_damaged_checkpoint_table(tmp_path: Path) -> None:
    whole = _zip(tmp_path / "whole.pt")
    cases = {
        "whole.pt": (whole, None),
        "empty.pt": (b"", "empty file"),
        "text.pt": (b"not a checkpoint at all", "not a torch zip archive"),
        "torn.pt": (whole[: len(whole) // 2], "truncated"),
        "old-pickle.pt": (b"\x80\x02}q\x00.", "not a torch zip archive"),
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


# --- the run id -----------------------------------------------------------------------------------


def test_make_creates_the_run_id_once_and_a_resubmit_keeps_it(tmp_path: Path) -> None:
    paths = RunPaths(create_run_dir(tmp_path, "quickstart", STAMP))
    paths.make()
    run_id = paths.run_id_file.read_text()
    assert re.fullmatch(r"quickstart-[0-9a-f]{8}\n", run_id)
    paths.make()  # hpc-ddp resume and a requeue reuse the directory
    assert read_run_id(paths) == read_run_id(RunPaths(paths.root)) == run_id.strip()
    assert paths.run_id_file.read_text() == run_id
    other = RunPaths(create_run_dir(tmp_path, "quickstart", STAMP))  # quickstart-<stamp>-2
    other.make()
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
