"""A local run's plan (:mod:`hpc_ddp.backends.local.plan`): how many processes this machine
may start, the GPUs each rank sees, the environment they start from, and the dry run.

The plan's functions are pure and tested as tables. The real runs start ranks through the CLI
and read back what each was given: submitit's LocalExecutor, left alone, gives every task
``CUDA_VISIBLE_DEVICES=""`` (a GPU job run with ``--backend local`` trained on the CPU), and
``env.vars`` must reach every rank of a local run and of every local sweep point, as the Slurm
script's ``export`` lines make them reach a Slurm task. A rank writes what it got to a file
(no code of the package under test decides what is found).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp
from hpc_ddp.backends.local.plan import (
    check_local_size,
    free_port,
    job_environment,
    local_gpu_plan,
)
from hpc_ddp.backends.ports import PORT_BASE, PORT_SLOTS
from hpc_ddp.cli.main import main
from hpc_ddp.config.model import EnvConfig, JobConfig, SlurmConfig
from hpc_ddp.errors import ConfigError
from hpc_ddp.rundir.layout import RunPaths
from tests.conftest import REPO

# --- how many processes a local job may start --------------------------------------------------


@pytest.mark.parametrize(
    ("ntasks", "cpus", "refused"),
    [(2, 1, False), (4, 1, False), (5, 1, True), (8, 2, False), (9, 2, True),
     (256, 64, False), (257, 64, True), (257, 1024, True), (1000, 2, True)],
)  # fmt: skip
def test_a_local_job_is_capped_by_the_cpus_and_a_hard_limit(
    ntasks: int, cpus: int, refused: bool
) -> None:
    if not refused:
        check_local_size(ntasks, cpus)
        return
    with pytest.raises(ConfigError, match=rf"= {ntasks} local processes, more than .*HINT:"):
        check_local_size(ntasks, cpus)


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_submit_refuses_a_thousand_local_processes_before_creating_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: list[str]
) -> None:
    runs = tmp_path / "runs"
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "slurm.nodes=1000",
            "--runs-dir", str(runs), *dry_run]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "slurm.nodes x slurm.tasks_per_node = 1000 local processes" in err
    assert "--backend slurm" in err
    assert not runs.exists()


def test_a_local_dry_run_says_what_the_local_backend_would_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "--dry-run", "--runs-dir",
            str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "# backend: local; would start 2 process(es) on this machine (ranks 0-1" in out
    assert "under a supervisor (the local executor's one task) that restarts them" in out
    assert "sbatch" not in out
    assert main([*argv, "fault.enabled=false"]) == 0
    assert "with submitit's local executor in" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"][1:3] == ["-m", "submitit.local._local"]
    assert data["plan"].startswith("backend: local; would start 2 process(es)")
    assert not any(tmp_path.iterdir())


# --- the GPUs each rank sees, as Slurm would give them ----------------------------------------


@pytest.mark.parametrize(
    ("slurm", "parent", "plan"),
    [
        (SlurmConfig(tasks_per_node=2), "3,5", ["", ""]),  # none asked: none given
        (SlurmConfig(tasks_per_node=2, gpus_per_task=1), "3,5", ["3", "5"]),
        (SlurmConfig(tasks_per_node=2, gpus_per_task=1), None, ["0", "1"]),
        (SlurmConfig(tasks_per_node=2, gpus_per_task=2), "GPU-a,GPU-b,GPU-c,GPU-d",
         ["GPU-a,GPU-b", "GPU-c,GPU-d"]),  # UUIDs (and MIG ids) are passed on verbatim
        (SlurmConfig(tasks_per_node=4, gpus_per_node=4), "4,5,6,7,8", ["4,5,6,7"] * 4),
        (SlurmConfig(nodes=2, tasks_per_node=1, gpus_per_node=1), " 2, 3 ", ["2,3", "2,3"]),
    ],
)  # fmt: skip
def test_the_plan_gives_each_rank_its_gpus_as_slurm_would(
    slurm: SlurmConfig, parent: str | None, plan: list[str]
) -> None:
    assert local_gpu_plan(slurm, parent) == plan


def test_a_plan_needing_more_gpus_than_listed_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        local_gpu_plan(SlurmConfig(tasks_per_node=4, gpus_per_task=1), "0,1")
    message = str(info.value)
    assert "slurm.gpus_per_task asks for 4 GPU(s) in all for 4 local rank(s)" in message
    assert "CUDA_VISIBLE_DEVICES='0,1' lists 2. HINT:" in message
    with pytest.raises(ConfigError, match=r"^slurm.gpus_per_node asks for 3 GPU"):
        local_gpu_plan(SlurmConfig(tasks_per_node=3, gpus_per_node=3), "")


def _env(visible: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "CUDA_VISIBLE_DEVICES": visible}


def test_too_few_gpus_for_a_local_job_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    runs = tmp_path / "runs"
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "local", "--runs-dir", str(runs),
            "slurm.nodes=1", "slurm.tasks_per_node=4", "slurm.gpus_per_task=1",
            "--dry-run"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "slurm.gpus_per_task asks for 4 GPU(s)" in err
    assert "CUDA_VISIBLE_DEVICES='0,1'" in err
    assert not runs.exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert main(argv) == 0
    plan = capsys.readouterr().out
    assert "; CUDA_VISIBLE_DEVICES by rank: 0 | 1 | 2 | 3" in plan


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("slurm.gpus_per_task=1", [("3", "1", "1", "cuda:0"), ("5", "1", "1", "cuda:0")]),
        ("slurm.gpus_per_node=2", [("3,5", "2", None, "cuda:0"), ("3,5", "2", None, "cuda:1")]),
        ("slurm.gpus_per_node=null", [("", "0", None, "cpu"), ("", "0", None, "cpu")]),
    ],
)
def test_real_local_ranks_see_the_gpus_the_job_asks_for(
    tmp_path: Path, gpus: str, expected: list[tuple[str, str, str | None, str]]
) -> None:
    """Two real ranks under submitit, started by ``submit --backend local --wait`` with
    ``CUDA_VISIBLE_DEVICES=3,5``: each records what it was given and the device it would take."""
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path), "slurm.nodes=1", "slurm.tasks_per_node=2", gpus,
         "entrypoint=tests.helpers.report_gpus:main"],
        cwd=REPO, env=_env("3,5"), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # The entry point opens no session, so the run's verdict (which reads the ledger) is not
    # what is tested here: what each rank was given is.
    [run_dir] = tmp_path.iterdir()
    reports = [run_dir / f"gpus-rank{rank}.json" for rank in (0, 1)]
    assert all(r.is_file() for r in reports), done.stderr[-3000:]
    seen = []
    for report in reports:
        r = json.loads(report.read_text())
        seen.append((r["visible"], r["given"], r["per_task"], r["device"]))
    assert seen == expected


def test_a_deterministic_job_has_its_cublas_setting_before_cuda_starts(tmp_path: Path) -> None:
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG once: ``hpc-ddp run`` sets it for
    ``train.deterministic`` before the job's code (or torch's CUDA) runs; a user's own value
    in the environment wins."""
    for deterministic, preset, expected in (("true", None, ":4096:8"), ("false", None, None),
                                            ("true", ":16:8", ":16:8")):  # fmt: skip
        runs = tmp_path / deterministic / str(preset)
        env = _env("")
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if preset is not None:
            env["CUBLAS_WORKSPACE_CONFIG"] = preset
        done = subprocess.run(
            [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend",
             "local", "--wait", "--runs-dir", str(runs), "slurm.nodes=1", "slurm.tasks_per_node=1",
             f"train.deterministic={deterministic}", "entrypoint=tests.helpers.report_gpus:main"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        [run_dir] = runs.iterdir()
        report = run_dir / "gpus-rank0.json"
        assert report.is_file(), done.stderr[-3000:]
        seen = json.loads(report.read_text())
        assert (seen["cublas"], seen["cuda_started"]) == (expected, False)


# --- the environment the ranks start from -------------------------------------------------------

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


class _Picks:
    """A ``random.Random`` stand-in that picks the given slots in turn."""

    def __init__(self, *slots: int) -> None:
        self.slots = list(slots)

    def randrange(self, stop: int) -> int:
        return self.slots.pop(0) % stop


def test_a_local_launch_meets_on_a_free_port_below_the_ephemeral_range() -> None:
    """A port from ``bind(port 0)`` lies in the kernel's ephemeral range, where another test's
    gloo connection took it before rank 0 listened (EADDRINUSE, a loaded CI run): the port comes
    from the derived ports' range, and a taken one is passed over."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    low, high = int(ephemeral[0]), int(ephemeral[1])
    for _ in range(20):
        port = free_port()
        assert PORT_BASE <= port < PORT_BASE + PORT_SLOTS
        assert not low <= port <= high
    with socket.socket() as held:
        held.bind(("0.0.0.0", PORT_BASE + 7))
        assert free_port(_Picks(7, 8)) == PORT_BASE + 8  # type: ignore[arg-type]
