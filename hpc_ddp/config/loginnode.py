"""The login node as the checks of :mod:`hpc_ddp.config.preflight` see it, and what a path
in a job config means on a machine (``~`` and ``$VARS`` expanded with its environment).

A job inherits the submitting shell's environment and directory (sbatch exports both), so
what is found from here is, by default, what the tasks will find. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path

from hpc_ddp.frozen import dataclass

__all__ = ["LoginNode", "expand_path", "installed_torchvision", "this_machine", "unset_vars"]

_VAR = r"\$(\w+|\{[^}]*\})"  # with re.ASCII; compiled at first use (re caches it)


@dataclass(frozen=True)
class LoginNode:
    """What the checks look at: this machine as the job will inherit it (sbatch exports the
    submitting shell's environment and runs in its directory)."""

    cwd: Path
    path: str
    """``$PATH``: where a ``command`` program is looked for."""
    python_path: tuple[str, ...]
    """Where ``python -m hpc_ddp run`` finds modules, besides the current directory."""
    torchvision_version: Callable[[], tuple[int, int] | None]
    """The installed torchvision's (major, minor), read from its metadata (never imported)
    only when a model name is unknown: reading it costs ~10 ms of every submit."""
    use_import_system: bool = True
    """Also ask this interpreter's import system (editable installs, zip imports)."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """This shell's environment: what ``$VARS`` in ``train.data_root`` expand to here."""


def this_machine(env: Mapping[str, str] | None = None) -> LoginNode:
    """The :class:`LoginNode` this process runs on."""
    env = os.environ if env is None else env
    return LoginNode(
        cwd=Path.cwd(),
        path=env.get("PATH", os.defpath),
        python_path=tuple(sys.path),
        torchvision_version=installed_torchvision,
        environ=dict(env),
    )


def expand_path(value: str, env: Mapping[str, str]) -> str:
    """``value`` with a leading ``~`` and every ``$NAME``/``${NAME}`` expanded from ``env``.

    What a shell would make of an unquoted path, done where the path is used: on a task with
    the task's environment (``$USER``, ``$SCRATCH`` and ``$HOME`` may differ from the login
    node's), at submit time with this shell's. A variable ``env`` lacks is left as written,
    as :func:`os.path.expandvars` does, so an error shows which one was missing.
    """
    if value == "~" or value.startswith("~/"):
        home = env.get("HOME")
        value = home.rstrip("/") + value[1:] if home else os.path.expanduser(value)
    elif value.startswith("~"):
        value = os.path.expanduser(value)  # ~user: the password database knows their home

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1).removeprefix("{").removesuffix("}")
        return env.get(name, match.group(0))

    return re.sub(_VAR, lookup, value, flags=re.ASCII)


def installed_torchvision() -> tuple[int, int] | None:
    """(major, minor) of the torchvision installed here, from its metadata; None if absent."""
    import importlib.metadata

    try:
        return _version(importlib.metadata.version("torchvision"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _version(text: str) -> tuple[int, int] | None:
    match = re.match(r"([0-9]+)\.([0-9]+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def unset_vars(expanded: str) -> list[str]:
    """The ``$NAME``/``${NAME}`` references an :func:`expand_path` result still holds."""
    return sorted({m.group(0) for m in re.finditer(_VAR, expanded, re.ASCII)})
