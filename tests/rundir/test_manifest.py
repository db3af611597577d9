"""Reading and writing ``manifest.json``: round trips, newer versions, damage as clear errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, read_manifest, record_lock, write_manifest

STAMP = "20260101-120000"


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


def test_provenance_round_trips_and_an_older_manifest_has_none(tmp_path: Path) -> None:
    """The submit directory, git commit, dirty flag and code digest are read back (the dirty
    flag as a bool, the one bool of the manifest); a manifest written before them reads them
    as None; a dirty flag that is not a bool is damage."""
    paths = RunPaths(tmp_path)
    full = dataclasses.replace(
        _manifest(), submit_dir="/home/u/p", git_commit="ab" * 20, git_dirty=True,
        code_file="/home/u/p/train.py", code_digest="sha256:" + "0" * 64,
    )  # fmt: skip
    write_manifest(paths, full)
    assert read_manifest(tmp_path) == full
    data = json.loads(paths.manifest.read_text())
    old = {k: v for k, v in data.items() if k not in ("submit_dir", "git_commit", "git_dirty",
                                                      "code_file", "code_digest")}  # fmt: skip
    paths.manifest.write_text(json.dumps(old))
    assert read_manifest(tmp_path) == _manifest()
    paths.manifest.write_text(json.dumps({**data, "git_dirty": "yes"}))
    with pytest.raises(RunDirError, match="git_dirty is 'yes', expected bool or null"):
        read_manifest(tmp_path)
    paths.manifest.write_text(json.dumps({**data, "code_digest": True}))
    with pytest.raises(RunDirError, match="code_digest is True, expected str or null"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "JSONDecodeError"),
        (b'{"name": "job", "backend": "sl', "JSONDecodeError"),
        (b"\xff\xfe\x00garbage", "UnicodeDecodeError"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'"text"', "a JSON str, not an object"),
        (b'{"name": "job"}', "no 'backend', 'job_id', 'submitted_at', 'command', "),
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


WHOLE = {"name": "j", "backend": "slurm", "job_id": "1", "submitted_at": "", "command": [],
         "config_source": "", "run_dir": ""}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "says"),
    [({"backend": None}, "no 'backend' key"),
     ({"backend": "pbs"}, "backend 'pbs' is not one of slurm, local"),
     ({"backend": ""}, "backend '' is not one of"),
     ({"submitted_at": None}, "no 'submitted_at' key")],
)  # fmt: skip
def test_a_missing_key_or_unknown_backend_is_named_with_a_hint(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    """It leaked ``Manifest.__init__() missing 1 required positional argument``, and
    ``backend: pbs`` was accepted (then read as Slurm by every verb)."""
    data = {k: v for k, v in {**WHOLE, **change}.items() if v is not None}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(RunDirError) as info:
        read_manifest(tmp_path)
    message = str(info.value)
    assert says in message
    assert "__init__" not in message
    assert "positional argument" not in message
    if "backend" in change:
        assert 'HINT: set "backend" to one of slurm, local, whichever ran the run' in message
    else:
        assert "HINT:" in message


def test_manifest_that_is_a_directory_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(RunDirError, match=r"damaged manifest \(IsADirectoryError"):
        read_manifest(tmp_path)


def test_missing_manifest_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"no manifest.json\. HINT: pass a run directory"):
        read_manifest(tmp_path)


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


@pytest.mark.parametrize("what", ["directory", "symlink"])
def test_a_lock_file_that_is_not_a_file_is_named_with_what_to_do(tmp_path: Path, what: str) -> None:
    """It used to be an IsADirectoryError traceback, or "no such run directory" for a run
    directory that exists. A starting task still goes on: no submission can hold it."""
    lock = tmp_path / "submit.lock"
    if what == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(tmp_path / "gone" / "submit.lock")
    with pytest.raises(RunDirError) as caught, record_lock(tmp_path):
        pass
    message = str(caught.value)
    assert message.startswith(f"{lock}: the run directory's lock file is a {what}")
    assert f"HINT: remove it (`rm -r {lock}`" in message
    assert "no such run directory" not in message
    with record_lock(tmp_path, shared=True):
        pass
