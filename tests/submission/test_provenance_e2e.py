"""Which code ran, end to end with the local backend: a ``command:`` script named by a relative
path, submitted from its directory, cancelled, edited, and resumed from another directory: the
resume runs the same (edited) file, and ``status`` says the code changed since the first
attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc_ddp.rundir.provenance import file_digest, read_code_runs

V1 = "import time\nprint('v1', flush=True)\ntime.sleep(600)\n"
V2 = "print('v2', flush=True)\n"


def _hpc(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    return subprocess.run([sys.executable, "-m", "hpc_ddp", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _wait_for(what: str, predicate: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_an_edited_script_resumed_from_elsewhere_runs_and_status_says_it_changed(
    tmp_path: Path,
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    script = project / "train.py"
    script.write_text(V1)
    (project / "job.yaml").write_text(
        "name: prov\ncommand: [python, train.py]\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1}\n"
    )
    runs = tmp_path / "runs"
    submitted = _json(_hpc(project, "submit", "job.yaml", "--backend", "local", "--json",
                           "--runs-dir", str(runs)))  # fmt: skip
    run = Path(submitted["run_dir"])
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["submit_dir"] == str(project)
    assert manifest["code_file"] == str(script)
    assert manifest["code_digest"] == file_digest(script)
    assert manifest["git_commit"] is None
    assert manifest["git_dirty"] is None
    _wait_for("the first attempt's code event", lambda: read_code_runs(run / "ledger.jsonl"))
    _wait_for("v1 to start", lambda: "v1" in _rank0_out(run))

    cancelled = _hpc(project, "cancel", str(run))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    script.write_text(V2)

    resumed = _hpc(elsewhere, "resume", str(run), "--wait", timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "v2" in _rank0_out(run)
    runs_seen = read_code_runs(run / "ledger.jsonl")
    assert [r.file for r in runs_seen] == [str(script)] * 2
    assert runs_seen[-1].digest == file_digest(script) != runs_seen[0].digest
    assert json.loads((run / "manifest.json").read_text())["submit_dir"] == str(project)

    (row,) = _json(_hpc(elsewhere, "status", str(run), "--json"))["runs"]
    assert row["state"] == "COMPLETED", row
    assert row["code_changed"] == {
        "file": str(script), "first_file": str(script),
        "first_digest": runs_seen[0].digest, "digest": runs_seen[-1].digest,
    }  # fmt: skip
    shown = _hpc(elsewhere, "status", str(run))
    assert "code changed since the first attempt: train.py digest" in shown.stdout, shown.stdout


def _rank0_out(run: Path) -> str:
    log = run / "logs" / "rank-0.out"
    return log.read_text(errors="replace") if log.exists() else ""
