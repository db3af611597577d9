"""One session per rank of a launch (issue 39 item 6): the claim, and a task whose
``mp.spawn`` children each open a session, refused in a real local run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.errors import HpcDdpError
from hpc_ddp.runtime.rankclaim import claim_rank

REPO = Path(__file__).resolve().parents[2]


def test_a_live_twin_is_refused_and_a_dead_holder_is_taken_over(tmp_path: Path) -> None:
    claim_rank(tmp_path, 0)
    claim_rank(tmp_path, 0)  # the same process again (a second session in sequence)
    claim_rank(tmp_path, 1, pid=os.getppid())  # another rank: its own claim
    with pytest.raises(HpcDdpError, match=r"rank 0 of this launch has a session in process"):
        claim_rank(tmp_path, 0, pid=os.getppid())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / "rank-2.session").write_text(f"{gone.stdout.strip()} {os.uname().nodename}\n")
    claim_rank(tmp_path, 2)  # its holder has exited: taken over
    (tmp_path / "rank-3.session").write_text("garbage")
    claim_rank(tmp_path, 3)  # a half-written claim is stale too


@pytest.mark.torch
def test_sessions_in_mp_spawn_children_of_one_task_are_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    script = REPO / "tests" / "helpers" / "spawned_sessions.py"
    job.write_text(f"name: spawned\ncommand: [python, {json.dumps(str(script))}]\n"
                   "slurm: {nodes: 1, tasks_per_node: 1}\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend", "local", "--wait",
         "--runs-dir", str(tmp_path / "runs"), "--json"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    log = (run_dir / "logs" / "rank-0.err").read_text(errors="replace")
    assert "two processes opened a session as the same rank" in log, log[-3000:]
    assert "HINT" in log
