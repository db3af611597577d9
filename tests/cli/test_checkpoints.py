"""``hpc-ddp checkpoints``: every damaged or foreign file is listed with its reason, never a
traceback; the table and ``--json`` agree on the exit status (0 when the listing succeeds;
with ``--verify``, 1 when the newest file is not ok); ``--verify`` checks every part's digest
and names the part that changed; a format-1 file is shown with what it restores unverified."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.checkpoint.format import CheckpointState, list_checkpoints
from hpc_ddp.checkpoint.sharded import check_complete
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.layout import LATEST_CHECKPOINT, checkpoint_name
from tests import e2e_util as e2e
from tests.checkpoint.test_format import BAD_FILES, DAMAGE, flip_tensor_bytes, save, save_v1
from tests.helpers.launch import REPO, base_env, run_ranks
from tests.rundir.test_shard_sets import shard_set

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


# --- shard sets: a FIFO is never opened ---------------------------------------------------------


def test_a_shard_sets_fifo_digest_record_is_listed_damaged_not_waited_on(tmp_path: Path) -> None:
    """`hpc-ddp checkpoints` read digests.json with open(): a FIFO there blocked it for ever."""
    checkpoints = tmp_path / "run" / "checkpoints"
    save(checkpoints, 10)
    step_dir = shard_set(checkpoints, 20, run_id=None)
    (step_dir / "digests.json").unlink()
    os.mkfifo(step_dir / "digests.json")
    cmd = [sys.executable, "-m", "hpc_ddp", "checkpoints", str(tmp_path / "run")]
    env = base_env()
    for flags in ([], ["--json"], ["--verify", "--json"]):
        done = subprocess.run([*cmd, *flags], env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert "Traceback" not in done.stderr
        assert "digests.json is not a regular file (a FIFO)" in done.stdout, done.stderr
    rows = json.loads(done.stdout)["checkpoints"]
    assert [(r["step"], r["state"]) for r in rows] == [(10, "ok"), (20, "damaged")]


# --- --export -----------------------------------------------------------------------------------

FSDP_SCRIPT = str(REPO / "tests" / "helpers" / "fsdp_script.py")


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-rank run of a script that shards its model: shard sets at steps 3 and 4."""
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    [(code, _, err)] = run_ranks([FSDP_SCRIPT, str(run_dir), "4", "0", "1"], 1, timeout=240)
    assert code == 0, err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        "step-00000003",
        "step-00000004",
    ]
    return run_dir


@pytest.fixture
def fsdp_copy(fsdp_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(fsdp_run, tmp_path / "run")
    return tmp_path / "run"


def _no_traceback(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert "HINT:" in err


@pytest.mark.parametrize(
    ("target", "words"),
    [
        pytest.param(
            "missing/dir/model.pt",
            "does not exist. HINT: create the directory",
            id="into-a-missing-directory",
        ),
        pytest.param(".", "is a directory. HINT: name the file to write in it", id="a-directory"),
        pytest.param("afile/model.pt", "is not a directory. HINT:", id="under-a-file"),
    ],
)
def test_export_to_a_path_it_cannot_write_is_a_clear_error(
    fsdp_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, words: str
) -> None:
    (tmp_path / "afile").write_text("")
    out = tmp_path / target
    code, stdout, err = run_cli(capsys, str(fsdp_copy), "--export", str(out), "--json")
    _no_traceback(code, err)
    assert words in err
    failure = json.loads(stdout)  # --json: the error object, never an export's
    assert (failure["schema"], failure["exit_code"]) == ("hpc-ddp.error/1", 2)


def test_export_never_replaces_a_file_without_force_nor_writes_into_the_checkpoints(
    fsdp_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It overwrote whatever FILE named, the run's own step-N/common.pt included: the newest
    checkpoint was gone."""
    newest = fsdp_copy / "checkpoints" / "step-00000004"
    common = newest / "common.pt"
    before = common.read_bytes()
    link = tmp_path / "link.pt"
    link.symlink_to(common)
    for target in (common, newest / "model.pt", fsdp_copy / "checkpoints" / "model.pt", link):
        for force in ([], ["--force"]):
            code, _, err = run_cli(capsys, str(fsdp_copy), "--export", str(target), *force)
            _no_traceback(code, err)
            assert "inside the run's checkpoints directory" in err
    assert common.read_bytes() == before
    assert not (newest / "model.pt").exists()
    check_complete(newest)

    mine = tmp_path / "mine.pt"
    mine.write_bytes(b"my own file")
    code, _, err = run_cli(capsys, str(fsdp_copy), "--export", str(mine))
    _no_traceback(code, err)
    assert "exists. HINT: pass --force to replace it" in err
    assert mine.read_bytes() == b"my own file"
    code, _, err = run_cli(capsys, str(fsdp_copy), "--export", str(mine), "--force")
    assert code == 0, err
    assert set(torch.load(mine, weights_only=True)) >= {"0.linear.weight", "2.bias"}


def test_export_json_prints_its_documented_object(
    fsdp_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.pt"
    code, stdout, err = run_cli(capsys, str(fsdp_copy), "--export", str(out), "--json")
    assert code == 0, err
    shown = json.loads(stdout)
    assert shown == {
        "schema": "hpc-ddp.checkpoints-export/1",
        "run_dir": str(fsdp_copy),
        "checkpoint": str(fsdp_copy / "checkpoints" / "step-00000004"),
        "step": 4,
        "sharded": True,
        "exported_to": str(out),
        "size_bytes": out.stat().st_size,
    }


def test_export_of_a_ddp_run_writes_the_weights_of_its_newest_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = run_dir_with(tmp_path, lambda p: p.write_bytes(b"torn"))  # 10, 20 good; 30 not
    out = tmp_path / "model.pt"
    code, stdout, err = run_cli(capsys, str(run_dir), "--export", str(out), "--json")
    assert code == 0, err
    shown = json.loads(stdout)
    assert (shown["step"], shown["sharded"]) == (20, False)
    [info] = [i for i in list_checkpoints(run_dir) if i.step == 20]
    assert weights_digest(torch.load(out, weights_only=True)) == info.weights_digest
