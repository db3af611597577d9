"""The argv of a command under ``dist.launcher: torchrun`` and of a ``--local_rank`` script
(a table), and the config's refusals of launchers that cannot work."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.errors import ConfigError
from hpc_ddp.job.torchrun import procs_per_node, torchrun_argv, with_local_rank

PY = "/venv/bin/python"
HEAD = [PY, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=4",
        "--master-addr=n1", "--master-port=29611", "--max-restarts=0"]  # fmt: skip


def _cfg(**sections: Any) -> Any:
    base: dict[str, Any] = {
        "name": "t",
        "command": ["python", "train.py"],
        "slurm": {"nodes": 2, "tasks_per_node": 1, "gpus_per_node": 4},
        "dist": {"launcher": "torchrun"},
    }
    base.update(sections)
    return job_config_from_dict(base, "job.yaml")


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ([PY, "train.py", "--lr", "0.1"], ["train.py", "--lr", "0.1"]),  # python, resolved
        ([PY, "-m", "pkg.train", "x"], ["-m", "pkg.train", "x"]),
        (["train.py", "x"], ["train.py", "x"]),
        (["./run.sh", "x"], ["--no-python", "./run.sh", "x"]),
    ],
)
def test_one_torchrun_per_node_with_the_allocations_rendezvous(
    command: list[str], program: list[str]
) -> None:
    argv = torchrun_argv(_cfg(), command, PY, node_rank=1, master_addr="n1", master_port=29611)
    assert argv == [*HEAD, *program]


def test_workers_per_node_come_from_the_config_then_the_gpus_then_one() -> None:
    assert procs_per_node(_cfg()) == 4
    assert procs_per_node(_cfg(dist={"launcher": "torchrun", "procs_per_node": 3})) == 3
    assert procs_per_node(_cfg(slurm={"nodes": 2, "tasks_per_node": 1})) == 1


def test_a_classic_script_gets_its_local_rank_as_the_option_it_names() -> None:
    cfg = _cfg(dist={"local_rank_arg": "--local_rank"}, slurm={"nodes": 1, "tasks_per_node": 2})
    assert with_local_rank(cfg, ["py", "main.py"], 1) == ["py", "main.py", "--local_rank=1"]
    assert with_local_rank(_cfg(), ["py", "main.py"], 1) == ["py", "main.py"]


@pytest.mark.parametrize(
    ("sections", "key", "hint"),
    [
        ({"slurm": {"nodes": 2, "tasks_per_node": 4}}, "slurm.tasks_per_node",
         "dist.procs_per_node: 4"),
        ({"command": None}, "dist.launcher", "set command"),
        ({"dist": {"launcher": "torchrun", "local_rank_arg": "--local_rank"}},
         "dist.local_rank_arg", "dist.launcher: srun"),
        ({"dist": {"local_rank_arg": "local_rank"}}, "dist.local_rank_arg", "--local_rank"),
        ({"dist": {"procs_per_node": 2}}, "dist.procs_per_node", "dist.launcher: torchrun"),
        ({"command": ["python", "-u", "train.py"]}, "command[1]", "[python, train.py"),
    ],
)  # fmt: skip
def test_launchers_that_cannot_work_are_refused_at_load(
    sections: dict[str, Any], key: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(**sections)
    assert key in str(err.value)
    assert hint in str(err.value)


def test_the_readmes_launcher_snippet_is_a_valid_job() -> None:
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Bring your own training script\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None
    cfg = job_config_from_dict({"name": "readme", **yaml.safe_load(match.group(1))}, "README")
    assert (cfg.dist.launcher, procs_per_node(cfg), cfg.slurm.tasks_per_node) == ("torchrun", 4, 1)
