"""``hpc-ddp init [--byo] [DIR]``: the files it writes pass a local run as they are, and it never
overwrites a file."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.checkpoint.format import list_checkpoints
from hpc_ddp.cli.cmd_init import job_name
from hpc_ddp.cli.main import main
from hpc_ddp.config.load import load_job_config
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger


def _submit_local(directory: Path, *overrides: str) -> Path:
    """``hpc-ddp submit job.yaml --backend local --wait`` from ``directory``, as a user types
    it; the one run directory it made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "job.yaml", "--backend", "local", "--wait",
         "--runs-dir", "runs", *overrides],
        cwd=directory, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [run] = (directory / "runs").iterdir()
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    return run


@pytest.mark.torch
def test_init_byo_writes_a_job_and_a_script_that_pass_a_local_run(tmp_path: Path) -> None:
    """Two local ranks run the written train.py through the written job.yaml: it ends at its
    last step, with the best checkpoint by val_loss recorded (the job's keep_best)."""
    target = tmp_path / "my proj"
    assert main(["init", "--byo", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["job.yaml", "train.py"]
    assert 'name: "my-proj"\n' in (target / "job.yaml").read_text()
    run = _submit_local(target, "params.steps=60")
    [*_, newest] = list_checkpoints(run)
    assert newest.step == 60
    assert "best val_loss so far" in (run / "logs" / "rank-0.err").read_text()


@pytest.mark.torch
def test_init_writes_a_builtin_trainer_job_that_passes_a_local_run(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]
    run = _submit_local(tmp_path)
    assert list_checkpoints(run)[-1].step == 16  # 1024 samples / (32 x 2 ranks), one epoch


def test_init_never_overwrites_and_writes_nothing_then(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("mine\n")
    assert main(["init", "--byo", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "train.py exists already: nothing was written. HINT:" in err
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no job.yaml either
    assert (tmp_path / "train.py").read_text() == "mine\n"
    assert main(["init", str(tmp_path)]) == 0  # job.yaml alone is free
    assert main(["init", str(tmp_path)]) == 2


# --- a DIR init cannot use: an error with a HINT and exit 2, never a traceback ---------------


def _init_fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["init", *argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == ""
    assert "HINT:" in captured.err
    assert "Traceback" not in captured.err
    return captured.err


def test_init_into_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("mine\n")
    err = _init_fails(capsys, str(tmp_path / "afile"))
    assert f"{tmp_path / 'afile'} is a file, not a directory: nothing was written." in err
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_init_under_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("mine\n")
    err = _init_fails(capsys, "--byo", str(tmp_path / "afile" / "a" / "b"))
    assert f"cannot be made: {tmp_path / 'afile'} is a file, not a directory" in err


@contextlib.contextmanager
def _read_only_tmpfs(where: Path) -> Iterator[Path]:
    """A real read-only file system (root cannot write it either), unmounted afterwards."""
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("sub", ["", "new/dir"])
def test_init_on_a_read_only_file_system_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sub: str
) -> None:
    with _read_only_tmpfs(tmp_path / "ro") as ro:
        err = _init_fails(capsys, "--byo", str(ro / sub))
        assert "cannot be written (it is on a read-only file system): nothing was written" in err
        assert list(ro.iterdir()) == []


def test_init_into_an_immutable_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An immutable directory (``chattr +i``): not even root may add a file to it."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not supported here")
    try:
        err = _init_fails(capsys, str(locked))
        assert f"{locked / 'job.yaml'}: cannot be written (" in err
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert list(locked.iterdir()) == []


def test_a_file_written_before_a_later_one_failed_is_taken_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file system with room for job.yaml only (one page): train.py fails with ENOSPC, and
    job.yaml, written first, is removed again."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(tiny)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        err = _init_fails(capsys, "--byo", str(tiny))
        assert f"{tiny / 'train.py'}: cannot be written (no space is left" in err
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=True)


@pytest.mark.parametrize(
    ("dirname", "expected"),
    [
        ("café été", "cafe-ete"),
        ("日本語", "my-job"),
        ("-x-", "x"),
        ("a" * 200, "a" * 128),
        ("123", "123"),
        ("a.b", "a-b"),
    ],
)
def test_init_writes_a_job_name_its_own_submit_takes(
    tmp_path: Path, dirname: str, expected: str
) -> None:
    target = tmp_path / dirname
    assert main(["init", str(target)]) == 0
    assert job_name(target) == expected
    assert load_job_config(target / "job.yaml").name == expected
