"""Whether what a job will run can be found from the login node: the module of an import
string (searched for, never imported), the program of ``command``, the script or module a
``python`` command runs. Each finding goes to the ``missing`` callback of
:func:`hpc_ddp.config.preflight.check_job`, which decides whether it is an error or a warning.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from hpc_ddp.config.loginnode import LoginNode
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import PYTHON_NAMES, resolve_command

__all__ = ["Missing", "check_command", "check_import", "find_module", "search_path"]

Missing = Callable[[str, str, str], None]
"""(key, what is missing, how to fix it): reports something not found on this machine."""

_PYTHON = r"python[0-9.]*"  # compiled at first use (re caches it): a command job's only
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})  # python options whose value is the next arg


def check_import(spec: str, key: str, cfg: JobConfig, node: LoginNode, missing: Missing) -> None:
    module = spec.partition(":")[0]
    if not find_module(module, search_path(cfg, node), node.use_import_system):
        missing(
            key,
            f"module {module!r} of {spec!r} cannot be found from {node.cwd} (searched the "
            "current directory, PYTHONPATH and this Python's packages, without importing)",
            f"submit from the directory that holds {module.split('.')[0]}/, set "
            "env.vars.PYTHONPATH, or install the package into this environment",
        )


def search_path(cfg: JobConfig, node: LoginNode) -> list[str]:
    """Where the job's Python looks: its directory, the job's PYTHONPATH, then this one's."""
    job_path = dict(cfg.env.vars).get("PYTHONPATH", "")
    extra = [str(node.cwd / p) for p in job_path.split(os.pathsep) if p]
    return [str(node.cwd), *extra, *node.python_path]


def find_module(name: str, search: Sequence[str], use_import_system: bool = True) -> bool:
    """Whether module ``name`` (dotted) can be found on ``search`` (or, with
    ``use_import_system``, by this interpreter), without importing it or its parents."""
    top, *rest = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, list(search))
    if spec is None and use_import_system:
        from importlib.util import find_spec  # only past the search path: seldom needed

        try:  # editable installs and other finders on sys.meta_path; a top-level name is
            spec = find_spec(top)  # looked up, never imported
        except (ImportError, ValueError):
            spec = None
    for part in rest:
        locations = None if spec is None else spec.submodule_search_locations
        if locations is None:  # not found, or a module where a package should be
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec is not None


def check_command(cfg: JobConfig, node: LoginNode, missing: Missing) -> None:
    assert cfg.command is not None
    program, *args = resolve_command(cfg.command, cfg.params)  # what the tasks will run
    # `python`/`python3` run the task's own interpreter (the one running hpc-ddp), not PATH's.
    if program not in PYTHON_NAMES and not _program_found(program, node, missing):
        return
    if re.fullmatch(_PYTHON, Path(program).name):
        _check_python_args(args, cfg, node, missing)


def _program_found(program: str, node: LoginNode, missing: Missing) -> bool:
    """Whether ``command[0]`` can run from here; reports it to ``missing`` when not."""
    if "/" not in program:
        import shutil  # only for a command job: not on every submit

        if shutil.which(program, path=node.path) is not None:
            return True
        missing(
            "command[0]",
            f"program {program!r} is not on PATH",
            "check the spelling, give its full path, or load what provides it in env.setup",
        )
        return False
    path = node.cwd / program
    if path.is_dir():
        missing(
            "command[0]",
            f"program {program!r} is a directory ({path})",
            "name the program inside it (a directory cannot be run)",
        )
    elif not path.is_file():
        missing(
            "command[0]",
            f"program {program!r} does not exist (looked for {path})",
            "fix the path; a relative one starts from the directory you submit from",
        )
    elif not os.access(path, os.X_OK):
        missing(
            "command[0]",
            f"program {program!r} is not executable",
            f"chmod +x {program}, or run it through its interpreter, e.g. [bash, {program}]",
        )
    else:
        return True
    return False


def _check_python_args(
    args: Sequence[str], cfg: JobConfig, node: LoginNode, missing: Missing
) -> None:
    """``python [options] script.py ...`` or ``python [options] -m module ...``."""
    it = iter(args)
    for arg in it:
        if arg == "-m":
            module = next(it, None)
            if module is not None and not find_module(
                module, search_path(cfg, node), node.use_import_system
            ):
                missing(
                    "command",
                    f"python -m {module}: module {module!r} cannot be found from {node.cwd}",
                    "submit from the directory that holds it, set env.vars.PYTHONPATH, or "
                    "install it into this environment",
                )
            return
        if arg in ("-c", "-"):  # code on the command line or stdin: nothing to look for
            return
        if arg in _OPTIONS_WITH_VALUE:
            next(it, None)
            continue
        if arg.startswith("-"):
            continue
        script = node.cwd / arg
        if script.is_dir() and not (script / "__main__.py").is_file():
            missing(
                "command",
                f"python script {arg!r} is a directory without a __main__.py (looked in {script})",
                "name the script inside it; python runs a directory only through its __main__.py",
            )
        elif not script.exists():
            missing(
                "command",
                f"python script {arg!r} does not exist (looked for {script})",
                "fix the path; a relative one starts from the directory you submit from",
            )
        return
