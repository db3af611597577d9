"""``hpc-ddp checkpoints``: every damaged or foreign file is listed with its reason, never a
traceback; the table and ``--json`` agree on the exit status (0 when the listing succeeds;
with ``--verify``, 1 when the newest file is not ok)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.layout import LATEST_CHECKPOINT, checkpoint_name
from hpc_ddp.runtime.checkpoint import CheckpointState
from tests.helpers.launch import base_env
from tests.runtime.test_checkpoint import BAD_FILES, flip_tensor_bytes, save

pytestmark = pytest.mark.torch


def flipped_weights(path: Path) -> None:
    save(path.parent, 30)
    flip_tensor_bytes(path)


# name -> (maker, state, words of the reason, found without --verify)
CASES: dict[str, tuple[Callable[[Path], object], CheckpointState, str, bool]] = {
    name: (make, state, reason, True) for name, (make, state, reason) in BAD_FILES.items()
}
# Found only by --verify: the file loads, its weights changed after it was written.
CASES["flipped-weights"] = (
    flipped_weights,
    CheckpointState.DAMAGED,
    "weights do not match their recorded digest",
    False,
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["checkpoints", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_dir_with(tmp_path: Path, make: Callable[[Path], object]) -> Path:
    """A run directory with good checkpoints at steps 10 and 20 and ``make``'s file at 30."""
    ckpts = tmp_path / "run" / "checkpoints"
    save(ckpts, 10)
    save(ckpts, 20)
    make(ckpts / checkpoint_name(30))
    return tmp_path / "run"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_newest_file_is_listed_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, state, reason, found_without_verify = CASES[case]
    run_dir = run_dir_with(tmp_path, make)
    for verify in (False, True):
        flags = ["--verify"] if verify else []
        seen = verify or found_without_verify
        expected_state = state.value if seen else "ok"
        expected_code = 1 if verify else 0

        code, out, err = run_cli(capsys, str(run_dir), "--json", *flags)
        rows = json.loads(out)
        assert [(r["step"], r["state"]) for r in rows] == [
            (10, "ok"),
            (20, "ok"),
            (30, expected_state),
        ]
        assert (rows[0]["error"], rows[1]["error"]) == (None, None)
        if seen:
            assert reason in rows[2]["error"]
            assert rows[2]["weights_digest"] is None
        assert code == expected_code

        table_code, table, table_err = run_cli(capsys, str(run_dir), *flags)
        assert table_code == code  # the two modes never disagree
        lines = table.splitlines()
        assert len(lines) == 5  # header, rule, three files
        assert "step-00000010.pt" in lines[2]
        assert lines[2].rstrip().endswith("ok")
        assert "step-00000030.pt" in lines[4]
        if seen:
            assert f"{state.value}: " in lines[4]
            assert reason in lines[4]
        for stderr in (err, table_err):
            assert "Traceback" not in stderr
            assert ("resume would use step-00000020.pt" in stderr) == verify
            assert ("step-00000030.pt" in stderr) == verify


def test_only_the_newest_decides_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An old bad file is listed but resume never reaches it: exit 0, with --verify too."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    BAD_FILES["zero-bytes"][0](ckpts / checkpoint_name(5))
    save(ckpts, 10)
    for argv in ([str(tmp_path), "--verify"], [str(tmp_path), "--verify", "--json"]):
        code, _, err = run_cli(capsys, *argv)
        assert (code, err) == (0, "")
    rows = json.loads(run_cli(capsys, str(tmp_path), "--json")[1])
    assert [r["state"] for r in rows] == ["damaged", "ok"]


def test_no_good_checkpoint_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    BAD_FILES["plain-tensor"][0](ckpts / checkpoint_name(1))
    BAD_FILES["dangling-symlink"][0](ckpts / checkpoint_name(2))
    for json_flag in ([], ["--json"]):
        assert run_cli(capsys, str(tmp_path), *json_flag)[0] == 0
        code, _, err = run_cli(capsys, str(tmp_path), "--verify", *json_flag)
        assert code == 1
        assert "step-00000002.pt is damaged: dangling symlink" in err
        assert "resume would use none" in err


def test_empty_and_missing_run_dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, str(tmp_path), "--json", "--verify") == (0, "[]\n", "")
    code, _, err = run_cli(capsys, str(tmp_path / "nope"), "--json")
    assert code == 2  # a usage error, as for every verb (tests/cli/test_targets.py)
    assert "nope: no such run directory. HINT:" in err


def test_dangling_latest_pointer_lists_fine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpts = tmp_path / "checkpoints"
    save(ckpts, 10)
    (ckpts / LATEST_CHECKPOINT).unlink()
    (ckpts / LATEST_CHECKPOINT).symlink_to(ckpts / "step-00000099.pt")
    code, out, err = run_cli(capsys, str(tmp_path), "--json", "--verify")
    assert (code, err) == (0, "")
    assert [(r["step"], r["state"]) for r in json.loads(out)] == [(10, "ok")]


def test_help_documents_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["checkpoints", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status, the same with and without --json: 0 when the listing succeeds" in text
    assert "with --verify, 1 when the newest file is not ok" in text
    assert "RUN_DIR missing or not a directory: 2 (a usage error)" in text


def test_real_command_on_every_bad_kind_at_once(tmp_path: Path) -> None:
    """The installed entry point, in its own process: no traceback and no warning from torch
    (a raw pickle makes torch.load warn about its protocol) reach the terminal."""
    ckpts = tmp_path / "checkpoints"
    save(ckpts, 1)
    for step, (make, _, _) in enumerate(BAD_FILES.values(), start=2):
        make(ckpts / checkpoint_name(step))
    save(ckpts, 100)
    cmd = [sys.executable, "-m", "hpc_ddp", "checkpoints", str(tmp_path), "--verify"]
    env = base_env()
    table = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    as_json = subprocess.run(
        [*cmd, "--json"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert (table.returncode, table.stderr) == (0, "")
    assert (as_json.returncode, as_json.stderr) == (0, "")
    rows = json.loads(as_json.stdout)
    assert len(rows) == len(BAD_FILES) + 2
    expected = ["ok", *(state.value for _, state, _ in BAD_FILES.values()), "ok"]
    assert [r["state"] for r in rows] == expected
    assert len(table.stdout.splitlines()) == len(rows) + 2
