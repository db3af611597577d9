"""Submit-time checks of what would otherwise fail on the compute nodes, after the queue wait.

- ``train.dataset`` is a built-in dataset (:data:`BUILTIN_DATASETS`) or an import string, and
  ``train.data_root`` is set for a dataset read from pre-staged files;
- ``train.model`` is ``mlp``, a torchvision classification model (:data:`TORCHVISION_MODELS`)
  or an import string;
- the module of every import string (``train.model``, ``train.dataset``, ``entrypoint``) can
  be found from here, searched for without importing anything;
- the program of ``command`` exists (on PATH, or as a file), and so does the script or module
  a ``python`` command runs (``python``/``python3`` themselves are the task's own interpreter,
  see :func:`hpc_ddp.runtime.entry.command_argv`, so they need no PATH);
- ``train.data_root`` exists here, ``~`` and ``$VARS`` expanded with this shell's environment
  (:func:`expand_path`); only a warning when missing, since the data may be staged on a file
  system only the compute nodes mount.

A job whose environment differs from this shell's (a container, ``env.modules`` or
``env.setup`` lines) may find on the nodes what is missing here: a missing module or program
is then a warning, not an error. Names and ``data_root`` do not depend on the environment.

The model names are a static list, so that checking them never imports torchvision (1.5 s and
torch with it); a torch-marked test compares the list with torchvision's own. Login-node side:
the standard library only.

Over 300 lines because the checks share one search path and one error-or-warning rule; split
apart, each piece would need both.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import resolve_command
from hpc_ddp.errors import ConfigError

log = logging.getLogger(__name__)

BUILTIN_DATASETS = ("synthetic", "cifar10", "mnist", "imagefolder")
"""Datasets :mod:`hpc_ddp.train.data` builds by name."""
STAGED_DATASETS = frozenset({"cifar10", "mnist", "imagefolder"})
"""Built-in datasets read from ``train.data_root`` (never downloaded on a compute node)."""
BUILTIN_MODELS = ("mlp",)
"""Models :mod:`hpc_ddp.train.models` builds itself; any other name is torchvision's."""
TORCHVISION_MODELS_VERSION = (0, 29)
"""The torchvision release :data:`TORCHVISION_MODELS` was taken from."""
TORCHVISION_MODELS = (
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny",
    "densenet121", "densenet161", "densenet169", "densenet201", "efficientnet_b0",
    "efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4",
    "efficientnet_b5", "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_l",
    "efficientnet_v2_m", "efficientnet_v2_s", "googlenet", "inception_v3", "maxvit_t",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "mobilenet_v2",
    "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_16gf", "regnet_x_1_6gf",
    "regnet_x_32gf", "regnet_x_3_2gf", "regnet_x_400mf", "regnet_x_800mf", "regnet_x_8gf",
    "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf", "regnet_y_32gf", "regnet_y_3_2gf",
    "regnet_y_400mf", "regnet_y_800mf", "regnet_y_8gf", "resnet101", "resnet152", "resnet18",
    "resnet34", "resnet50", "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1", "swin_b", "swin_s", "swin_t", "swin_v2_b", "swin_v2_s",
    "swin_v2_t", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
    "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32", "wide_resnet101_2",
    "wide_resnet50_2",
)  # fmt: skip
"""``torchvision.models.list_models(module=torchvision.models)`` of torchvision 0.29."""

_PYTHON_RE = re.compile(r"python[0-9.]*")
_OWN_PYTHON = frozenset({"python", "python3"})
"""A ``command`` starting with one of these runs the task's interpreter (runtime.entry)."""
_VAR = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)
_Missing = Callable[[str, str, str], None]
"""(key, what is missing, how to fix it): reports something not found on this machine."""
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})  # python options whose value is the next arg


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

    return _VAR.sub(lookup, value)


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


@dataclass(frozen=True)
class Findings:
    """What the checks of one job found: the first error (``key``, message) and warnings."""

    error: tuple[str, str] | None
    warnings: tuple[tuple[str, str], ...]


class _Found(Exception):
    def __init__(self, key: str, text: str) -> None:
        super().__init__(text)
        self.key = key
        self.text = text


def check_job(cfg: JobConfig, node: LoginNode) -> Findings:
    """Every check on one job; pure apart from looking at files and directories."""
    warnings: list[tuple[str, str]] = []
    indirect = _indirection(cfg)

    def missing(key: str, text: str, fix: str) -> None:
        """Something not found here: an error, or a warning when the job's environment
        may provide it."""
        if indirect is None:
            raise _Found(key, f"{text}. HINT: {fix}")
        warnings.append(
            (key, f"{text}; it may exist only in the job's environment ({indirect}). HINT: {fix}")
        )

    try:
        if cfg.command is None and cfg.entrypoint is None:  # the built-in trainer runs
            _check_dataset(cfg, node, missing)
            _check_data_root(cfg, node, warnings)
            _check_model(cfg, node, missing, warnings)
        if cfg.entrypoint is not None:
            _check_import(cfg.entrypoint, "entrypoint", cfg, node, missing)
        if cfg.command is not None:
            _check_command(cfg, node, missing)
    except _Found as exc:
        return Findings((exc.key, exc.text), tuple(warnings))
    return Findings(None, tuple(warnings))


def preflight_job(cfg: JobConfig, source: str, node: LoginNode | None = None) -> None:
    """Check one job before it is submitted: raise the first error as a :class:`ConfigError`
    labelled ``source``, log the warnings."""
    found = check_job(cfg, node or this_machine())
    if found.error is not None:
        key, text = found.error
        raise ConfigError(f"{source}: {key}: {text}")
    for key, text in found.warnings:
        log.warning("%s: %s: %s", source, key, text)


def preflight_points(jobs: Iterable[tuple[str, JobConfig]], node: LoginNode | None = None) -> None:
    """:func:`preflight_job` over many (label, config) pairs, such as a sweep's points.

    Points that agree in everything checked are checked once; a warning is logged once, with
    the number of points it concerns.
    """
    node = node or this_machine()
    cache: dict[tuple[object, ...], Findings] = {}
    counts: dict[tuple[str, str], list[str]] = {}
    for label, cfg in jobs:
        relevant = _relevant(cfg)
        found = cache.get(relevant)
        if found is None:
            found = cache[relevant] = check_job(cfg, node)
        if found.error is not None:
            raise ConfigError(f"{label}: {found.error[0]}: {found.error[1]}")
        for warning in found.warnings:
            counts.setdefault(warning, []).append(label)
    for (key, text), labels in counts.items():
        where = labels[0] if len(labels) == 1 else f"{labels[0]} and {len(labels) - 1} more"
        log.warning("%s: %s: %s", where, key, text)


def _relevant(cfg: JobConfig) -> tuple[object, ...]:
    """Everything :func:`check_job` looks at."""
    train = cfg.train
    command = None if cfg.command is None else resolve_command(cfg.command, cfg.params)
    return (command, cfg.entrypoint, train.model, train.dataset, train.data_root,
            _indirection(cfg), cfg.env.vars)  # fmt: skip


def _indirection(cfg: JobConfig) -> str | None:
    """What may give the job modules and programs this shell lacks, or None."""
    env = cfg.env
    parts = [
        *(["a container"] if env.container is not None else []),
        *(["env.modules"] if env.modules else []),
        *(["env.setup"] if env.setup else []),
    ]
    return ", ".join(parts) or None


def _did_you_mean(name: str, choices: Sequence[str], rest: str) -> str:
    """A hint: the close matches of ``name`` if any, then ``rest`` (what else to do)."""
    close = difflib.get_close_matches(name, choices, n=3)
    if not close:
        return rest
    return f"did you mean {' or '.join(repr(c) for c in close)}? Otherwise {rest}"


def _check_dataset(cfg: JobConfig, node: LoginNode, missing: _Missing) -> None:
    name = cfg.train.dataset
    if ":" in name:
        _check_import(name, "train.dataset", cfg, node, missing)
        return
    if name not in BUILTIN_DATASETS:
        raise _Found(
            "train.dataset",
            f"{name!r} is not a known dataset. HINT: "
            + _did_you_mean(
                name,
                BUILTIN_DATASETS,
                f"use one of {', '.join(BUILTIN_DATASETS)}, or an import string "
                "'package.module:function'",
            ),
        )
    if name in STAGED_DATASETS and cfg.train.data_root is None:
        raise _Found(
            "train.data_root",
            f"is not set, and train.dataset {name!r} is read from pre-staged files (compute "
            "nodes do not download). HINT: stage the dataset on a shared file system and set "
            "train.data_root to its directory",
        )


def _check_data_root(cfg: JobConfig, node: LoginNode, warnings: list[tuple[str, str]]) -> None:
    """A ``data_root`` not found here is a warning: the data may be staged on a file system
    that only the compute nodes mount, and the dataset itself says so on the task if not."""
    root = cfg.train.data_root
    if root is None or cfg.train.dataset == "synthetic":
        return
    expanded = expand_path(root, node.environ)
    path = node.cwd / expanded
    if path.is_dir():
        return
    shown = repr(root) if expanded == root else f"{root!r} ({expanded} here)"
    what = "is not a directory" if path.exists() else "does not exist"
    unset = " and ".join(sorted({m.group(0) for m in _VAR.finditer(expanded)}))
    fix = f"{unset}: not set here; the nodes must set it" if unset else "stage the data there"
    text = f"{shown} {what} on this machine; it may exist only on the compute nodes"
    warnings.append(("train.data_root", f"{text}. HINT: {fix}, or fix the path"))


def _check_model(
    cfg: JobConfig, node: LoginNode, missing: _Missing, warnings: list[tuple[str, str]]
) -> None:
    name = cfg.train.model
    if ":" in name:
        _check_import(name, "train.model", cfg, node, missing)
        return
    if name in BUILTIN_MODELS or name in TORCHVISION_MODELS:
        return
    known = ".".join(map(str, TORCHVISION_MODELS_VERSION))
    text = f"{name!r} is not a known model. HINT: " + _did_you_mean(
        name,
        _ALL_MODELS,
        f"use 'mlp', a torchvision {known} classification model "
        "(torchvision.models.list_models()), or an import string 'package.module:function'",
    )
    installed = node.torchvision_version()
    if installed is not None and installed > TORCHVISION_MODELS_VERSION:
        # A model added after the list was taken: the nodes will know whether it exists.
        have = ".".join(map(str, installed))
        warnings.append(("train.model", f"{text} (torchvision {have} here may have it)"))
        return
    raise _Found("train.model", text)


_ALL_MODELS = (*BUILTIN_MODELS, *TORCHVISION_MODELS)


def _check_import(spec: str, key: str, cfg: JobConfig, node: LoginNode, missing: _Missing) -> None:
    module = spec.partition(":")[0]
    if not find_module(module, _search_path(cfg, node), node.use_import_system):
        missing(
            key,
            f"module {module!r} of {spec!r} cannot be found from {node.cwd} (searched the "
            "current directory, PYTHONPATH and this Python's packages, without importing)",
            f"submit from the directory that holds {module.split('.')[0]}/, set "
            "env.vars.PYTHONPATH, or install the package into this environment",
        )


def _search_path(cfg: JobConfig, node: LoginNode) -> list[str]:
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
        try:  # editable installs and other finders on sys.meta_path; a top-level name is
            spec = importlib.util.find_spec(top)  # looked up, never imported
        except (ImportError, ValueError):
            spec = None
    for part in rest:
        locations = None if spec is None else spec.submodule_search_locations
        if locations is None:  # not found, or a module where a package should be
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec is not None


def _check_command(cfg: JobConfig, node: LoginNode, missing: _Missing) -> None:
    assert cfg.command is not None
    program, *args = resolve_command(cfg.command, cfg.params)  # what the tasks will run
    # `python`/`python3` run the task's own interpreter (the one running hpc-ddp), not PATH's.
    if program not in _OWN_PYTHON and not _program_found(program, node, missing):
        return
    if _PYTHON_RE.fullmatch(Path(program).name):
        _check_python_args(args, cfg, node, missing)


def _program_found(program: str, node: LoginNode, missing: _Missing) -> bool:
    """Whether ``command[0]`` can run from here; reports it to ``missing`` when not."""
    if "/" not in program:
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
    args: Sequence[str], cfg: JobConfig, node: LoginNode, missing: _Missing
) -> None:
    """``python [options] script.py ...`` or ``python [options] -m module ...``."""
    it = iter(args)
    for arg in it:
        if arg == "-m":
            module = next(it, None)
            if module is not None and not find_module(
                module, _search_path(cfg, node), node.use_import_system
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
