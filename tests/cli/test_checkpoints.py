"""``hpc-ddp checkpoints``: every damaged or foreign file is listed with its reason, never a
traceback; the table and ``--json`` agree on the exit status (0 when the listing succeeds;
with ``--verify``, 1 when the newest file is not ok); ``--verify`` checks every part's digest
and names the part that changed; a format-1 file is shown with what it restores unverified."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_ddp.checkpoint.format import CheckpointState
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.layout import LATEST_CHECKPOINT, checkpoint_name
from tests import e2e_util as e2e
from tests.checkpoint.test_format import BAD_FILES, DAMAGE, flip_tensor_bytes, save, save_v1
from tests.helpers.launch import REPO, base_env

pytestmark = pytest.mark.torch


def flipped_weights(path: Path) -> None:
    save(path.parent, 30)
    flip_tensor_bytes(path)


# name -> (maker, state, words of the reason, found without --verify)
CASES: dict[str, tuple[Callable[[Path], object], CheckpointState, str, bool]] = {
    name: (make, state, reason, True) for name, (make, state, reason) in BAD_FILES.items()
}
# Found only by --verify: the file loads, its content changed after it was written.
CASES["flipped-weights"] = (
    flipped_weights,
    CheckpointState.DAMAGED,
    "weights (model) does not match its recorded digest",
    False,
)


def flipped_optimizer(path: Path) -> None:
    save(path.parent, 30)
    DAMAGE["optimizer-bytes"][0](path)


CASES["flipped-optimizer-state"] = (
    flipped_optimizer,
    CheckpointState.DAMAGED,
    "optimizer state does not match its recorded digest",
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
        rows = json.loads(out)["checkpoints"]
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
    rows = json.loads(run_cli(capsys, str(tmp_path), "--json")[1])["checkpoints"]
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
    code, out, err = run_cli(capsys, str(tmp_path), "--json", "--verify")
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert (shown["schema"], shown["checkpoints"]) == ("hpc-ddp.checkpoints/1", [])
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
    assert [(r["step"], r["state"]) for r in json.loads(out)["checkpoints"]] == [(10, "ok")]


def test_help_documents_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["checkpoints", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status, the same with and without --json: 0 when the listing succeeds" in text
    assert "with --verify, 1 when the newest file is not ok" in text
    assert "RUN_DIR missing or not a directory: 2 (a usage error)" in text


def test_a_format_1_checkpoint_says_what_it_restores_unverified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unverified = ["optimizer", "scheduler", "scaler", "progress", "extra", "rng", "config"]
    ckpts = tmp_path / "checkpoints"
    save_v1(ckpts, 10)
    code, out, err = run_cli(capsys, str(tmp_path), "--json", "--verify")
    assert code == 0  # resume can use it
    [row] = json.loads(out)["checkpoints"]
    assert (row["state"], row["version"], row["unverified"]) == ("ok", 1, unverified)
    assert "resume would use step-00000010.pt, a format-1 checkpoint: only its weights" in err
    code, table, err = run_cli(capsys, str(tmp_path), "--verify")
    assert f"ok (format 1: {', '.join(unverified)} unverified)" in table
    save(ckpts, 20)  # resume now uses a file with every part digested: nothing to say
    code, out, err = run_cli(capsys, str(tmp_path), "--json", "--verify")
    assert (code, err) == (0, "")
    rows = json.loads(out)["checkpoints"]
    assert [(r["version"], r["unverified"]) for r in rows] == [(1, unverified), (2, [])]


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
    rows = json.loads(as_json.stdout)["checkpoints"]
    assert len(rows) == len(BAD_FILES) + 2
    expected = ["ok", *(state.value for _, state, _ in BAD_FILES.values()), "ok"]
    assert [r["state"] for r in rows] == expected
    assert len(table.stdout.splitlines()) == len(rows) + 2


# --- a real run: damaged optimizer state in the newest checkpoint ----------------------------


def _local(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def _submit_waiting(runs: Path, *overrides: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(runs), *overrides],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def test_damaged_optimizer_state_is_caught_and_the_run_resumes_exactly_from_the_file_before(
    tmp_path: Path,
) -> None:
    """Issue 20: a byte changed in the optimizer state of the newest checkpoint was loaded as
    if whole (the loss went nan, the run ended COMPLETED). Now `checkpoints --verify` names it,
    and the resumed job skips it, goes on from the checkpoint before, and ends with the very
    weights of an uninterrupted twin. Two real local runs, two ranks each, paced steps."""
    paced = ["train.epochs=2", "train.log_every=1", "train.checkpoint_every=5",
             "train.dataset=tests.e2e_util:io_bound_synthetic"]  # fmt: skip
    twin = _submit_waiting(tmp_path / "twin", *paced)
    waiter = _submit_waiting(tmp_path / "runs", *paced)
    try:
        manifest = e2e.wait_for(
            "run dir", lambda: next((tmp_path / "runs").glob("*/manifest.json"), None)
        )
        run_dir = manifest.parent
        e2e.wait_checkpoint(run_dir, 10, timeout_s=180)
        assert _local("cancel", str(run_dir)).returncode == 0
        assert waiter.wait(timeout=120) == 1
        assert twin.wait(timeout=240) == 0
    finally:
        for proc in (waiter, twin):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    *_, before, newest = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    DAMAGE["optimizer-bytes"][0](newest)

    listed = _local("checkpoints", str(run_dir), "--verify", "--json")
    assert listed.returncode == 1
    rows = {Path(r["path"]).name: r for r in json.loads(listed.stdout)["checkpoints"]}
    assert rows[newest.name]["state"] == "damaged"
    assert "optimizer state does not match its recorded digest" in rows[newest.name]["error"]
    assert f"resume would use {before.name}" in listed.stderr

    resumed = _local("resume", str(run_dir), "--wait")
    assert resumed.returncode == 0, resumed.stderr
    _, second = e2e.ledger(run_dir)
    assert second.resumed_from == before.name
    assert second.steps_done == 64
    log = (run_dir / "logs" / "rank-0.err").read_text()
    assert f"skipping checkpoint {newest}" in log
    assert "optimizer state does not match its recorded digest" in log
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in metrics if "loss" in r)  # no nan, as before
    final = json.loads(_local("checkpoints", str(run_dir), "--json").stdout)["checkpoints"][-1]
    [twin_dir] = (tmp_path / "twin").iterdir()
    reference = json.loads(_local("checkpoints", str(twin_dir), "--json").stdout)["checkpoints"][-1]
    assert (final["step"], final["weights_digest"]) == (64, reference["weights_digest"])
    assert reference["step"] == 64
