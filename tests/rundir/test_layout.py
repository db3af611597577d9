"""The run directory contract: pure, every ``HPC_DDP_*`` variable declared once, the paths."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpc_ddp.rundir import layout
from hpc_ddp.rundir.layout import LATEST_CHECKPOINT, RunPaths, parse_checkpoint_name, run_dir_name

ROOT = Path(__file__).resolve().parents[2]
_VAR = re.compile(r"HPC_DDP_[A-Z0-9_]+")


def _declared() -> dict[str, str]:
    return {
        value: name
        for name, value in vars(layout).items()
        if name.endswith("_ENV") and isinstance(value, str)
    }


def test_every_hpc_ddp_variable_is_declared_once_in_layout() -> None:
    """No module of the package spells an ``HPC_DDP_*`` name as a string of its own: each one
    imports it from :mod:`hpc_ddp.rundir.layout`, so the login-to-node contract is one list."""
    declared = _declared()
    assert len(declared) == len([n for n in vars(layout) if n.endswith("_ENV")])
    offenders = []
    for path in sorted((ROOT / "hpc_ddp").rglob("*.py")):
        if path.name == "layout.py" and path.parent.name == "rundir":
            continue
        if path.relative_to(ROOT).as_posix() == "hpc_ddp/config/load.py":
            continue  # SITE_ENV: the site profile's, config's own and login-side only
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            # A docstring may mention one; a string that *is* one is a second declaration.
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and _VAR.fullmatch(value.strip()):
                offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert offenders == []


def test_the_template_sets_only_declared_variables() -> None:
    template = (ROOT / "slurm_templates" / "default.sbatch.j2").read_text(encoding="utf-8")
    used = set(_VAR.findall(template))
    assert used
    assert used <= set(_declared())


def test_run_paths_name_every_file_inside_the_root(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    inside = [
        paths.config, paths.script, paths.manifest, paths.ledger, paths.metrics,
        paths.run_id_file, paths.tensorboard, paths.checkpoints, paths.logs, paths.rendezvous,
        paths.tasks,
    ]  # fmt: skip
    assert all(p.parent == tmp_path for p in inside)
    assert len(set(inside)) == len(inside)
    assert paths.manifest.name == layout.MANIFEST_FILE
    assert paths.run_id_file.name == layout.RUN_ID_FILE
    assert paths.task(3).root == tmp_path / "tasks" / "3"
    assert paths.rank_log(1, "err") == tmp_path / "logs" / "rank-1.err"
    assert not list(tmp_path.iterdir())  # naming a path creates nothing


def test_run_dir_name_numbers_the_second_and_later_runs_of_a_second() -> None:
    assert run_dir_name("job", "20260101-120000") == "job-20260101-120000"
    assert run_dir_name("job", "20260101-120000", 2) == "job-20260101-120000-2"


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-00000120.pt", 120),
        ("step-0.pt", 0),
        ("step-00000120.pt.tmp", None),
        (LATEST_CHECKPOINT, None),
    ],
)
def test_parse_checkpoint_name(name: str, step: int | None) -> None:
    assert parse_checkpoint_name(name) == step
