"""``env.vars`` reach every rank of a local run and of every local sweep point, as the Slurm
script's ``export`` lines make them reach a Slurm task.

The runs are real: a ``command:`` program, or an ``entrypoint:`` whose module is found only
through ``env.vars.PYTHONPATH``, writes the environment each rank got to a file, which the test
reads (no code of the package under test decides what is found).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp
from hpc_ddp.backends.local.backend import job_environment
from hpc_ddp.config.model import EnvConfig, JobConfig
from hpc_ddp.rundir.layout import RunPaths

# What a rank writes: its whole environment, to OUT_DIR/env-<RANK>.json (OUT_DIR from env.vars).
DUMP = """\
import json, os


def dump():
    out = os.path.join(os.environ["OUT_DIR"], "env-%s.json" % os.environ["RANK"])
    with open(out, "w") as f:
        json.dump(dict(os.environ), f)
"""

# An entry point as users write one: a session around the work.
ENTRY = """\
import hpc_ddp


def main():
    with hpc_ddp.session():
        dump()
"""

# A value the shell would expand and split were it not exported verbatim.
ODD = "a b $HOME 'q' \"d\" ;x"


def _hpc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.pop("PYTHONPATH", None)  # the module must come from env.vars.PYTHONPATH, nothing else
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "hpc_ddp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, check=False)  # fmt: skip


def _rank_envs(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"env-{r}.json").read_text()) for r in range(ranks)]


def test_job_environment_puts_env_vars_over_the_submitters_and_the_run_dir_last() -> None:
    cfg = JobConfig(
        name="x",
        env=EnvConfig(vars=(("PYTHONPATH", "/opt/lib"), ("HPC_DDP_RUN_DIR", "/elsewhere"))),
    )
    got = job_environment(cfg, RunPaths(Path("/runs/x")), {"PYTHONPATH": "/mine", "HOME": "/h"})
    assert got == {
        "PYTHONPATH": "/opt/lib",  # the job's, over the submitter's
        "HOME": "/h",
        "HPC_DDP_RUN_DIR": "/runs/x",  # exported after env.vars, as the Slurm script does
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.torch
@pytest.mark.parametrize("fault", ["true", "false"])
def test_a_local_runs_ranks_get_env_vars_and_find_an_entrypoint_through_them(
    tmp_path: Path, fault: str
) -> None:
    """Supervised (the supervisor starts the ranks) and not (submitit's tasks are the ranks)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "envdump_mod.py").write_text(DUMP + ENTRY)
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: envs\n"
        "entrypoint: envdump_mod:main\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:05:00'}\n"
        f"fault: {{enabled: {fault}}}\n"
        "env:\n"
        "  vars:\n"
        f"    PYTHONPATH: {json.dumps(str(lib))}\n"
        '    CUBLAS_WORKSPACE_CONFIG: ":4096:8"\n'
        f"    OUT_DIR: {json.dumps(str(out))}\n"
        f"    ODD: {json.dumps(ODD)}\n"
    )
    done = _hpc("submit", str(job), "--backend", "local", "--wait", "--runs-dir",
                str(tmp_path / "runs"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    for rank, env in enumerate(_rank_envs(out, 2)):
        assert env["RANK"] == str(rank)
        assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert env["ODD"] == ODD
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(lib)
        assert env["HPC_DDP_RUN_DIR"] == str(run_dir)


def test_every_local_sweep_point_gets_its_own_env_vars(tmp_path: Path) -> None:
    """A grid over an env var: each point's ranks see that point's value."""
    (tmp_path / "dump.py").write_text(DUMP + "\ndump()\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: envsweep\n"
        f"command: [python, {tmp_path / 'dump.py'}]\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
        "env: {vars: {OUT_DIR: placeholder, KEEP: kept}}\n"
    )
    outs = [tmp_path / "out0", tmp_path / "out1"]
    for out in outs:
        out.mkdir()
    sweep = hpc_ddp.submit_sweep(job, [f"env.vars.OUT_DIR={outs[0]},{outs[1]}"],
                                 runs_dir=tmp_path / "runs", backend="local")  # fmt: skip
    assert sweep.backend == "local"
    status = sweep.wait(timeout=240)
    assert status.succeeded, status.tasks
    for index, out in enumerate(outs):
        [env] = _rank_envs(out, 1)
        assert (env["OUT_DIR"], env["KEEP"]) == (str(out), "kept")
        assert env["HPC_DDP_RUN_DIR"] == str(sweep.sweep_dir / "tasks" / str(index))
