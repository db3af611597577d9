"""Layering rules that keep the login-node side light and the pure core pure.

* The pure core (every module of ``config/`` but the preflight ones; ``slurm/`` render, nodelist,
  jobstate; ``sweep/`` model and spec; the on-node derivations in ``runtime/``; the verdicts
  in ``state/``; the run-directory contract ``rundir``) never runs a command, never reads the
  environment, never writes a file and never imports torch. It takes what it needs as
  arguments (config parsing reads the file it is given), so it is testable and cheap on a
  login node. Checked two ways: the source of each pure module (``subprocess``, ``os.environ``,
  ``os.getenv``, however ``os`` is imported), and what importing it loads (only other pure
  modules of hpc_ddp, and neither torch nor ``subprocess``).
* ``config/preflight`` (with ``loginnode`` and ``programs``) inspects the login node (PATH,
  files, the environment) but still runs nothing and imports no torch.
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
PACKAGE = ROOT / "hpc_ddp"


def _modules(folder: str, names: list[str] | None = None) -> list[str]:
    """``hpc_ddp.<folder>.<name>`` for the given names, or for every module in the folder."""
    found = sorted(p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__")
    chosen = found if names is None else names
    assert set(chosen) <= set(found), f"no such module in hpc_ddp/{folder}"
    return [f"hpc_ddp.{folder}.{name}" for name in chosen]


PREFLIGHT = _modules("config", ["preflight", "loginnode", "programs"])
"""The submit-time checks: they look at this machine (PATH, files, the environment)."""
PURE_MODULES = sorted(
    [m for m in _modules("config") if m not in PREFLIGHT]
    + _modules("slurm", ["render", "nodelist", "jobstate"])
    + _modules("sweep", ["model", "spec"])
    + _modules(
        "runtime", ["distenv", "placement", "attempt", "progress", "requeue_messages", "stopcause"]
    )
    + _modules("state", ["resumable", "task", "verdict"])
    + _modules("devcluster", ["conf"])
    + ["hpc_ddp.rundir", "hpc_ddp.errors", "hpc_ddp.version"]
)
PACKAGES = {"hpc_ddp", *(f"hpc_ddp.{p.name}" for p in PACKAGE.iterdir() if p.is_dir())}
HEAVY = ("torch", "subprocess")


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _loaded_by(module: str) -> dict[str, list[str]]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps({{'heavy': [m for m in {list(HEAVY)!r} if m in sys.modules], "
        "'ours': sorted(m for m in sys.modules if m.startswith('hpc_ddp'))}))"
    )
    return json.loads(_run(code))  # type: ignore[no-any-return]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_only_pure_modules(module: str) -> None:
    loaded = _loaded_by(module)
    assert loaded["heavy"] == [], f"{module} pulls in {loaded['heavy']}"
    impure = sorted(set(loaded["ours"]) - set(PURE_MODULES) - PACKAGES)
    assert impure == [], f"{module} pulls in modules that do I/O: {impure}"


@pytest.mark.parametrize("module", PREFLIGHT)
def test_preflight_runs_nothing_and_imports_no_torch(module: str) -> None:
    assert _loaded_by(module)["heavy"] == []
    assert [v for v in _violations(_source(module)) if "environ" not in v] == []


def _source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)


def _os_names(tree: ast.Module) -> set[str]:
    """The names ``os`` is bound to in a module (``import os``, ``import os as _os``)."""
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "os"
    }


def _violations(tree: ast.Module) -> list[str]:
    found = []
    os_names = _os_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.split(".")[0] == "subprocess"
            ]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "subprocess":
                found.append("from subprocess import ...")
            env = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
            if node.module == "os" and any(a.name in env for a in node.names):
                found.append("from os import environ/getenv")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            found.append(f"os.{node.attr} (line {node.lineno})")
    return found


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_neither_runs_commands_nor_reads_the_environment(module: str) -> None:
    assert _violations(_source(module)) == []


def test_the_static_check_catches_what_it_looks_for() -> None:
    tree = ast.parse(
        "import os, subprocess\nimport os as _os\nfrom os import environ\n"
        "from subprocess import run\nx = os.environ['A']\ny = _os.getenv('B')\n"
    )
    assert len(_violations(tree)) == 5


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
