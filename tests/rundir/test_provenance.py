"""Which code a run runs: the code file of a job found without importing it, its digest, the
git state of the submit directory, and the ledger's ``code`` events that ``status`` compares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.rundir.ledger_events import code_event
from hpc_ddp.rundir.provenance import (
    Code,
    CodeRun,
    Provenance,
    code_change,
    code_file,
    code_of,
    file_digest,
    gather,
    git_state,
    read_code_runs,
    record_code,
)
from hpc_ddp.state.report import describe_code_change


def _job(**keys: object) -> JobConfig:
    return job_config_from_dict({"name": "p", **keys}, "test")


def test_a_python_command_names_its_script_relative_to_the_base(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    cfg = _job(command=["python", "-u", "-W", "ignore", "train.py", "--lr", "0.1"])
    assert code_file(cfg, tmp_path, []) == tmp_path / "train.py"
    assert code_file(cfg, tmp_path / "elsewhere", []) is None  # not there: no digest


def test_a_program_path_is_its_own_code_and_a_program_on_path_has_none(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    assert code_file(_job(command=["./run.sh", "x"]), tmp_path, []) == tmp_path / "run.sh"
    assert code_file(_job(command=["bash", "train.sh"]), tmp_path, []) is None
    assert code_file(_job(command=["python", "-c", "print(1)"]), tmp_path, []) is None


@pytest.mark.parametrize(
    "command",
    [
        ["torchrun", "--nproc-per-node=2", "train.py", "--lr", "0.1"],
        ["/opt/bin/torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--standalone", "train.py"],
        ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=0", "train.py", "7"],
        ["python3", "-u", "-m", "torch.distributed.launch", "--use-env", "train.py"],
    ],
)  # fmt: skip
def test_a_torchrun_command_names_the_script_its_workers_run(
    tmp_path: Path, command: list[str]
) -> None:
    """Issue 39 (Low): a `torchrun` command recorded no code identity (a program on PATH), and
    `python -m torch.distributed.run` recorded torchrun's own file."""
    (tmp_path / "train.py").write_text("print(1)\n")
    search = [str(tmp_path), *sys.path]  # torch's own run.py is findable here
    assert code_file(_job(command=command), tmp_path, search) == tmp_path / "train.py"


def test_torchruns_module_and_no_python_programs_and_hpc_ddps_own_torchrun(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("")
    search = [str(tmp_path)]
    module = _job(command=["torchrun", "--nproc-per-node", "2", "-m", "mypkg.train"])
    assert code_file(module, tmp_path, search) == pkg / "train.py"
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    assert code_file(_job(command=["torchrun", "--no-python", "./run.sh"]), tmp_path, []) == (
        tmp_path / "run.sh"
    )
    assert code_file(_job(command=["torchrun", "--no_python", "nvidia-smi"]), tmp_path, []) is None
    # dist.launcher: torchrun runs a bare script under the task's interpreter.
    (tmp_path / "train.py").write_text("print(1)\n")
    launched = _job(command=["train.py", "--lr", "0.1"], dist={"launcher": "torchrun"})
    assert code_file(launched, tmp_path, []) == tmp_path / "train.py"
    assert code_file(_job(command=["train.py"]), tmp_path, []) is None  # found on PATH


def test_modules_are_found_without_being_imported(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "train.py").write_text("raise RuntimeError('imported')\ndef main(): pass\n")
    search = [str(tmp_path)]
    entry = _job(entrypoint="mypkg.train:main")
    assert code_file(entry, tmp_path, search) == pkg / "train.py"
    assert code_file(_job(command=["python", "-m", "mypkg.train"]), tmp_path, search) == (
        pkg / "train.py"
    )
    assert "mypkg" not in sys.modules
    assert code_file(_job(entrypoint="nopkg.x:main"), tmp_path, search) is None


def test_the_digest_follows_the_bytes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("a\n")
    cfg = _job(command=["python", "train.py"])
    first = code_of(cfg, tmp_path, [])
    assert first is not None
    assert first.digest == file_digest(script)
    assert first.digest.startswith("sha256:")
    assert len(first.digest) == 7 + 64
    script.write_text("b\n")
    assert code_of(cfg, tmp_path, []) != first
    assert code_of(_job(), tmp_path, []) is None  # the built-in trainer: no file of its own


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def test_git_state_gives_the_commit_and_whether_tracked_files_changed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("a\n")
    _git(repo, "add", "train.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "untracked.txt").write_text("x\n")  # untracked files do not make a tree dirty
    assert git_state(repo) == (head, False)
    (repo / "train.py").write_text("b\n")
    assert git_state(repo) == (head, True)
    sub = repo / "sub"
    sub.mkdir()
    assert git_state(sub) == (head, True)  # a sub-directory of a repository


def test_no_repository_or_no_git_is_none_never_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert git_state(tmp_path) == (None, None)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # git is not found
    assert git_state(repo) == (None, None)


def test_status_compares_the_latest_attempt_with_the_first(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    lines = [
        code_event(job_id="1", file="/p/train.py", digest="sha256:" + "a" * 64, now=1.0),
        '{"event": "attempt_start", torn',
        code_event(job_id="1", file="/p/train.py", digest="sha256:" + "a" * 64, now=2.0),
    ]
    ledger.write_text("\n".join(lines) + "\n")
    runs = read_code_runs(ledger)
    assert [r.time for r in runs] == [1.0, 2.0]
    assert code_change(runs) is None
    with ledger.open("a") as f:
        f.write(code_event(job_id="2", file="/p/train.py", digest="sha256:" + "b" * 64, now=3.0))
    changed = code_change(read_code_runs(ledger))
    assert changed is not None
    assert [r.job_id for r in changed] == ["1", "2"]
    assert describe_code_change(*changed) == (
        "code changed since the first attempt: train.py digest aaaaaaaaaaaa -> bbbbbbbbbbbb"
    )
    assert read_code_runs(tmp_path / "none.jsonl") == []
    assert code_change([]) is None


def test_record_code_appends_one_event_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("a\n")
    monkeypatch.chdir(tmp_path)
    ledger = tmp_path / "run" / "ledger.jsonl"
    code = record_code(_job(command=["python", "train.py"]), ledger, job_id="7")
    assert code is not None
    (event,) = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert event["event"] == "code"
    assert event["job_id"] == "7"
    assert read_code_runs(ledger) == [
        CodeRun(event["time"], "7", str(tmp_path / "train.py"), file_digest(tmp_path / "train.py"))
    ]


def test_gather_records_the_repository_and_the_entrypoint_module(tmp_path: Path) -> None:
    """What the manifest gets at submit, in a git repository: the submit directory, HEAD, the
    dirty flag, and the entrypoint module's file and digest (found, never imported)."""
    (tmp_path / "mymod.py").write_text("raise RuntimeError('imported')\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "mymod.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    found = gather(_job(entrypoint="mymod:main"), tmp_path, [str(tmp_path)])
    assert found == Provenance(
        str(tmp_path), _git(tmp_path, "rev-parse", "HEAD"), False,
        Code(str(tmp_path / "mymod.py"), file_digest(tmp_path / "mymod.py")),
    )  # fmt: skip
    assert "mymod" not in sys.modules
