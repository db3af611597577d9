"""Layering rules that keep the login-node side light and the pure core pure.

* The pure modules (config, rendering, node lists, sweep specs, the distributed environment)
  import neither torch nor the part of hpc-ddp that runs Slurm commands, and never touch
  ``subprocess`` or ``os.environ`` themselves: they take what they need as arguments, so they
  are testable and cheap on a login node.
* ``import hpc_ddp`` exposes the exception tree and ``JobConfig`` without importing torch.
* The package's version agrees with ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hpc_ddp
from hpc_ddp import errors
from hpc_ddp.version import __version__

ROOT = Path(__file__).resolve().parents[1]

PURE_MODULES = [
    "hpc_ddp.config.fields",
    "hpc_ddp.config.load",
    "hpc_ddp.config.model",
    "hpc_ddp.config.pairs",
    "hpc_ddp.config.params",
    # hpc_ddp.config.preflight is left out on purpose: it inspects the environment.
    "hpc_ddp.config.reference",
    "hpc_ddp.config.schema",
    "hpc_ddp.config.units",
    "hpc_ddp.config.values",
    "hpc_ddp.config.yaml_dialect",
    "hpc_ddp.slurm.render",
    "hpc_ddp.slurm.nodelist",
    "hpc_ddp.slurm.jobstate",
    "hpc_ddp.sweep.model",
    "hpc_ddp.sweep.spec",
    "hpc_ddp.runtime.distenv",
    "hpc_ddp.runtime.placement",
    "hpc_ddp.runtime.attempt",
    "hpc_ddp.runtime.progress",
    "hpc_ddp.runtime.requeue_messages",
    "hpc_ddp.runtime.stopcause",
    "hpc_ddp.state.resumable",
    "hpc_ddp.state.task",
    "hpc_ddp.state.verdict",
]

HEAVY = ("torch", "hpc_ddp.slurm.client")


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_imports_neither_torch_nor_the_slurm_client(module: str) -> None:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    assert json.loads(_run(code)) == [], f"{module} pulls in heavy modules"


def _source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)


def _violations(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.split(".")[0] == "subprocess"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "subprocess":
                found.append("from subprocess import ...")
            if node.module == "os" and any(a.name in ("environ", "environb") for a in node.names):
                found.append("from os import environ")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"os.{node.attr} (line {node.lineno})")
    return found


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_neither_runs_commands_nor_reads_the_environment(module: str) -> None:
    assert _violations(_source(module)) == []


def test_the_static_check_catches_what_it_looks_for() -> None:
    tree = ast.parse("import os, subprocess\nfrom os import environ\nx = os.environ['A']\n")
    assert len(_violations(tree)) == 3


def test_import_hpc_ddp_gives_errors_and_job_config_without_torch() -> None:
    code = (
        "import json, sys, hpc_ddp\n"
        "assert issubclass(hpc_ddp.RunDirError, hpc_ddp.HpcDdpError)\n"
        "assert hpc_ddp.JobConfig.__module__ == 'hpc_ddp.config.model'\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    assert json.loads(_run(code)) == []


def test_importing_the_errors_is_cheap() -> None:
    code = (
        "import sys; import hpc_ddp.errors; "
        "print(sorted(m for m in sys.modules if m.startswith('hpc_ddp')))"
    )
    assert _run(code).strip() == str(["hpc_ddp", "hpc_ddp.errors", "hpc_ddp.version"])


def test_the_whole_exception_tree_is_public_once() -> None:
    tree = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, errors.HpcDdpError)
        and not name.startswith("_")
    }
    assert "HpcDdpError" in tree
    for name in tree:
        assert getattr(hpc_ddp, name) is getattr(errors, name)
    assert tree <= set(hpc_ddp.__all__)
    assert "JobConfig" in hpc_ddp.__all__
    assert len(hpc_ddp.__all__) == len(set(hpc_ddp.__all__))
    for name in hpc_ddp.__all__:
        assert name in dir(hpc_ddp)


def test_job_config_is_the_config_model_one() -> None:
    from hpc_ddp.config.model import JobConfig

    assert hpc_ddp.JobConfig is JobConfig


def test_the_version_agrees_with_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert hpc_ddp.__version__ == __version__ == project["version"]
