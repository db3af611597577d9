"""A local run's controller (:mod:`hpc_ddp.backends.local.controller`): detached from whoever
submitted, so a local submit returns once it has submitted, however its output is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from hpc_ddp.backends.local.process import local_alive
from hpc_ddp.rundir.manifest import read_manifest
from tests import e2e_util as e2e
from tests.backends.local.machine import hpc, pids_running, says
from tests.conftest import REPO

GATED = """
import os, pathlib, time
flag = pathlib.Path(os.environ["GATE"])
print("waiting for", flag, flush=True)
while not flag.exists():
    time.sleep(0.1)
"""

API_CALLER = """
import sys
import hpc_ddp
job = hpc_ddp.submit(sys.argv[1], backend="local", runs_dir=sys.argv[2])
print(job.run_dir, flush=True)
"""


def _gated_job(tmp_path: Path) -> Path:
    """A ``command:`` job of 2 tasks that runs until the file ``$GATE`` exists."""
    (tmp_path / "gated.py").write_text(GATED)
    job = tmp_path / "gated.yaml"
    job.write_text(
        "name: gated\n"
        f"command: [python, {tmp_path / 'gated.py'}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
    )
    return job


@pytest.mark.parametrize("caller", ["capture", "tee", "api"])
def test_a_local_submit_whose_output_is_read_to_its_end_returns_while_the_run_runs(
    tmp_path: Path, caller: str
) -> None:
    """``x=$(hpc-ddp submit ... --json)``, ``... | tee f`` and a script that calls
    ``hpc_ddp.submit(backend="local")`` with its output captured: each reads its output to
    the end, which comes only once no process holds it. The run's processes hold none of
    it: the caller is back while the run is RUNNING (it waits for a file that only appears
    after), and the run then ends COMPLETED."""
    job, runs, gate = _gated_job(tmp_path), tmp_path / "runs", tmp_path / "gate"
    submit = shlex.join([sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend",
                         "local", "--json", "--runs-dir", str(runs)])  # fmt: skip
    argv = {
        "capture": ["bash", "-c", f'x=$({submit}) && printf "%s\\n" "$x"'],
        "tee": ["bash", "-c", f"set -o pipefail; {submit} | tee {tmp_path / 'tee.out'}"],
        "api": [sys.executable, "-c", API_CALLER, str(job), str(runs)],
    }[caller]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
           "GATE": str(gate), "PYTHONPATH": str(REPO)}  # fmt: skip
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=90, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        [run_dir] = runs.iterdir()
        said = done.stdout.strip()
        assert said == str(run_dir) if caller == "api" else json.loads(said)["run_dir"]
        row = json.loads(hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "RUNNING", row
        for rank in (0, 1):
            log = run_dir / "logs" / f"rank-{rank}.out"
            e2e.wait_for(f"rank {rank} waiting", partial(says, log, "waiting for"), timeout_s=120)
        gate.touch()
        job_id = read_manifest(run_dir).job_id
        e2e.wait_for("the run's end", lambda: not local_alive(run_dir, job_id), timeout_s=120)
        row = json.loads(hpc("status", str(run_dir), "--json").stdout)["runs"][0]
        assert row["state"] == "COMPLETED", row
    finally:
        gate.touch()
        for run_dir in runs.iterdir() if runs.is_dir() else []:
            for pid in pids_running(str(run_dir)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
