"""A sweep on this machine (``hpc-ddp sweep ... --backend local``): real local runs, no Slurm.

The sweep directory is the Slurm sweep's, so ``status``, ``results``, ``logs --task`` and
``--resubmit-failed`` read it alike; the command returns as soon as the sweep controller has
started (a script's ``$(hpc-ddp sweep ... --json)`` is not held until the sweep ends), and the
CLI's ``--json`` is what the Python API returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp
from hpc_ddp.api.status import status_json
from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]

TINY = """\
name: tiny
slurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1, time: "00:10:00"}
env: {vars: {OMP_NUM_THREADS: "1"}}
train:
  model: mlp
  dataset: synthetic
  synthetic_samples: 256
  batch_size: 32
  max_steps: 4
  checkpoint_every: 2
  log_every: 2
  eval_every: 2
"""

# A torchrun-ready program without a session: it fails while its marker file exists.
FLAKY = """\
import sys
from pathlib import Path
sys.exit(3 if (Path(__file__).parent / f"fail-{sys.argv[1]}").exists() else 0)
"""


def hpc(*args: str, cwd: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``hpc-ddp ARGS`` for real, its output captured through pipes (as ``$(...)`` does)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def cli_json(*argv: str) -> tuple[int, Any]:
    code, out = run_cli(*argv)
    return code, json.loads(out)


def test_a_command_line_grid_runs_as_local_runs_and_results_has_a_row_per_point(
    tmp_path: Path,
) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    began = time.monotonic()
    done = hpc("sweep", "tiny.yaml", "train.lr=0.1,0.01", "--backend", "local",
               "--runs-dir", "runs", "--json", cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["schema"], shown["backend"], shown["points"]) == ("hpc-ddp.sweep/1", "local", 2)
    sweep = hpc_ddp.Sweep.from_dir(shown["sweep_dir"])
    assert sweep.backend == "local"
    # Returned once the controller started, not when the sweep ended: its stdout was not held.
    assert not sweep.status().ended, f"returned after {took:.1f} s, with the sweep over"
    assert sweep.status().summary["pending"] >= 1  # one at a time: max_parallel 1 by default

    status = sweep.wait(timeout=300)
    assert status.succeeded, status.tasks
    table = hpc("results", str(sweep.sweep_dir), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["#", "state", "train.lr"]
    rows = [line.split() for line in lines[2:] if line.strip() and line.split()[1] == "finished"]
    assert sorted((r[0], r[1], r[2]) for r in rows) == [("0", "finished", "0.1"),
                                                        ("1", "finished", "0.01")]  # fmt: skip
    assert "2 tasks: 2 finished" in table.stdout
    # Each point is a whole local run in tasks/<i>: its own ranks, logs and checkpoints.
    for task in sweep.tasks():
        assert task.backend == "local"
        assert task.status().state == "COMPLETED"
        assert "step 4/4" in task.logs()
    logs = hpc("logs", str(sweep.sweep_dir), "--task", "1", cwd=tmp_path)
    assert "step 4/4" in logs.stdout + logs.stderr

    # The CLI's --json and the API give the same thing, a sweep included.
    code, results = cli_json("results", str(sweep.sweep_dir), "--json")
    assert (code, results["schema"]) == (0, "hpc-ddp.results/1")
    assert results["rows"] == json.loads(json.dumps(sweep.results()))
    tasks = [str(sweep.sweep_dir / "tasks" / str(i)) for i in (0, 1)]
    code, statuses = cli_json("status", str(sweep.sweep_dir), *tasks, "--json")
    assert code == 0
    listed = hpc_ddp.runs(sweep.sweep_dir.parent)
    assert statuses["sweeps"] == [sweep.status().to_dict()]
    assert [r["run_dir"] for r in statuses["runs"]] == tasks
    assert statuses["runs"] == [t.status().to_dict() for t in sweep.tasks()]
    assert json.loads(json.dumps(status_json(listed)))["sweeps"] == statuses["sweeps"]


def test_resubmit_failed_runs_a_failed_point_again_locally(tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY)
    (tmp_path / "flaky.yaml").write_text(
        f"name: flaky\ncommand: [python, {tmp_path / 'flaky.py'}, '{{params.x}}']\n"
        "params: {x: 0}\n"
        "slurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1, time: '5'}\n"
    )
    (tmp_path / "fail-1").touch()
    sweep = hpc_ddp.submit_sweep(tmp_path / "flaky.yaml", ["params.x=0,1,2"],
                                 runs_dir=tmp_path / "runs", backend="local")  # fmt: skip
    assert sweep.backend == "local"
    with pytest.raises(hpc_ddp.RunFailedError, match=r"1 of 3 task\(s\) did not finish"):
        sweep.wait(timeout=300)
    failed = sweep.status().tasks
    assert [t["state"] for t in failed] == ["finished", "failed", "finished"]
    (tmp_path / "fail-1").unlink()
    again = hpc("sweep", "--resubmit-failed", str(sweep.sweep_dir), "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert (shown["schema"], shown["backend"], shown["resubmitted"]) == (
        "hpc-ddp.sweep/1", "local", [1]
    )  # fmt: skip
    done = sweep.wait(timeout=300)
    assert [t["state"] for t in done.tasks] == ["finished"] * 3
    # Point 1 ran once more, in its own directory; the others were left alone.
    assert [t["attempts"] for t in done.tasks] == [1, failed[1]["attempts"] + 1, 1]
    nothing = hpc("sweep", "--resubmit-failed", str(sweep.sweep_dir), cwd=tmp_path)
    assert nothing.returncode == 0, nothing.stderr
    assert "nothing to resubmit" in nothing.stdout


def test_cancel_of_a_local_sweep_stops_the_running_point_and_starts_no_more(
    tmp_path: Path,
) -> None:
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    (tmp_path / "sleeper.yaml").write_text(
        f"name: sleeper\ncommand: [python, {tmp_path / 'sleeper.py'}]\nparams: {{x: 0}}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    sweep = hpc_ddp.submit_sweep(tmp_path / "sleeper.yaml", ["params.x=0,1"],
                                 runs_dir=tmp_path / "runs", backend="local")  # fmt: skip
    deadline = time.monotonic() + 120
    while [t["state"] for t in sweep.status().tasks] != ["running", "pending"]:
        assert time.monotonic() < deadline, sweep.status().tasks
        time.sleep(0.5)
    done = hpc("cancel", str(sweep.sweep_dir), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)["results"]
    assert (result["outcome"], result["backend"]) == ("cancelled", "local")
    ended = sweep.wait(timeout=120, check=False)
    assert [t["state"] for t in ended.tasks] == ["cancelled", "cancelled"]
    assert not (sweep.sweep_dir / "tasks" / "1" / "manifest.json").exists()  # never started
    assert (
        "stopped: point(s) not started: 1"
        in (sweep.sweep_dir / "logs" / "local-sweep.log").read_text()
    )


def test_a_resubmit_dry_run_reports_no_pid_of_a_controller_that_has_exited(
    tmp_path: Path,
) -> None:
    """The sweep has ended: its recorded controller pid names no process of the sweep (and may
    be another process's by now), so the dry run's ``job_id`` is null, not that pid."""
    (tmp_path / "flaky.py").write_text(FLAKY)
    (tmp_path / "flaky.yaml").write_text(
        f"name: flaky\ncommand: [python, {tmp_path / 'flaky.py'}, '{{params.x}}']\n"
        "params: {x: 0}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    (tmp_path / "fail-1").touch()
    sweep = hpc_ddp.submit_sweep(tmp_path / "flaky.yaml", ["params.x=0,1"],
                                 runs_dir=tmp_path / "runs", backend="local")  # fmt: skip
    with pytest.raises(hpc_ddp.RunFailedError):
        sweep.wait(timeout=300)
    dead = json.loads((sweep.sweep_dir / "manifest.json").read_text())["job_id"]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{dead}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the controller exits just after its last point
    code, shown = cli_json("sweep", "--resubmit-failed", str(sweep.sweep_dir), "--dry-run",
                           "--json")  # fmt: skip
    assert code == 0
    assert (shown["dry_run"], shown["resubmitted"], shown["job_id"]) == (True, [1], None)
