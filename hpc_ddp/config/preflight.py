"""Submit-time checks of what would otherwise fail on the compute nodes, after the queue wait.

- ``train.dataset`` is a built-in dataset (:data:`BUILTIN_DATASETS`) or an import string, and
  ``train.data_root`` is set for a dataset read from pre-staged files;
- ``train.model`` is ``mlp``, a torchvision classification model (:data:`TORCHVISION_MODELS`)
  or an import string;
- the module of every import string (``train.model``, ``train.dataset``, ``entrypoint``) can
  be found from here, searched for without importing anything;
- the program of ``command`` exists (on PATH, or as a file), and so does the script or module
  a ``python`` command runs (``python``/``python3`` themselves are the task's own interpreter,
  see :func:`hpc_ddp.job.command.command_argv`, so they need no PATH);
- ``train.data_root`` exists here, ``~`` and ``$VARS`` expanded with this shell's environment
  (:func:`expand_path`); only a warning when missing, since the data may be staged on a file
  system only the compute nodes mount.

- a Charliecloud image seen from here holds ``env.container.python`` and a directory for each
  bind (:mod:`hpc_ddp.config.images`); an image not found here is only a warning.

A job whose environment differs from this shell's (a container, ``env.modules`` or
``env.setup`` lines) may find on the nodes what is missing here: a missing module or program
is then a warning, not an error. Names and ``data_root`` do not depend on the environment.

The model names are a static list, so that checking them never imports torchvision (1.5 s and
torch with it); a torch-marked test compares the list with torchvision's own. Login-node side:
the standard library only.

The login node as the checks see it is :mod:`hpc_ddp.config.loginnode`; finding modules and
programs is :mod:`hpc_ddp.config.programs`; this module holds the policy (what is checked, and
whether a finding is an error or a warning) and the names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from hpc_ddp.config.exactness import asks_for_gpus
from hpc_ddp.config.loginnode import LoginNode, expand_path, this_machine, unset_vars
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.pairs import CLUSTERS_REFUSAL, CLUSTERS_VARS
from hpc_ddp.config.params import resolve_command
from hpc_ddp.config.programs import Missing, check_command, check_import
from hpc_ddp.errors import ConfigError
from hpc_ddp.frozen import dataclass

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

    if cfg.dist.backend == "nccl" and not asks_for_gpus(cfg.slurm):
        warnings.append(
            (
                "dist.backend",
                "is nccl, but the job asks for no GPUs: its tasks see none unless this site "
                "hands out GPU nodes without Slurm's GRES. HINT: ask for them (slurm.gpus_per_node "
                "or slurm.gpus_per_task), or use dist.backend: auto",
            )
        )
    try:
        _check_clusters_env(node)
        _check_container(cfg, node, warnings)
        if cfg.command is None and cfg.entrypoint is None:  # the built-in trainer runs
            _check_dataset(cfg, node, missing)
            _check_data_root(cfg, node, warnings)
            _check_model(cfg, node, missing, warnings)
        if cfg.entrypoint is not None:
            check_import(cfg.entrypoint, "entrypoint", cfg, node, missing)
        if cfg.command is not None:
            check_command(cfg, node, missing)
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
            _indirection(cfg), cfg.env.vars, cfg.dist.backend,
            asks_for_gpus(cfg.slurm), cfg.env.container)  # fmt: skip


def _check_clusters_env(node: LoginNode) -> None:
    """sbatch exports the submitting shell's environment: ``SBATCH_CLUSTERS`` sends the job to
    another cluster, ``SLURM_CLUSTERS`` points squeue, scontrol (the requeue, in the job too),
    scancel and sacct there."""
    for name in CLUSTERS_VARS:
        if node.environ.get(name):
            raise _Found(f"${name}", f"is set in this environment ({node.environ[name]!r}), which "
                         f"{CLUSTERS_REFUSAL}; or unset {name} to use this one")  # fmt: skip


def _check_container(cfg: JobConfig, node: LoginNode, warnings: list[tuple[str, str]]) -> None:
    """What this machine can see of the job's container image (a Charliecloud one only)."""
    container = cfg.env.container
    if container is None or container.runtime != "charliecloud":
        return
    from hpc_ddp.config.images import check_charliecloud_image  # a Charliecloud job's only

    path_may_change = bool(cfg.env.modules or cfg.env.setup)
    chdir = dict(cfg.slurm.extra).get("chdir")
    workdir = node.cwd / expand_path(chdir, node.environ) if chdir else node.cwd
    for found in check_charliecloud_image(container, node, workdir, path_may_change):
        if found.error:
            raise _Found(found.key, found.text)
        warnings.append((found.key, found.text))


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
    import difflib  # only for a bad name: a submit that is right never pays for it

    close = difflib.get_close_matches(name, choices, n=3)
    if not close:
        return rest
    return f"did you mean {' or '.join(repr(c) for c in close)}? Otherwise {rest}"


def _check_dataset(cfg: JobConfig, node: LoginNode, missing: Missing) -> None:
    name = cfg.train.dataset
    if ":" in name:
        check_import(name, "train.dataset", cfg, node, missing)
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
    unset = " and ".join(unset_vars(expanded))
    fix = f"{unset}: not set here; the nodes must set it" if unset else "stage the data there"
    text = f"{shown} {what} on this machine; it may exist only on the compute nodes"
    warnings.append(("train.data_root", f"{text}. HINT: {fix}, or fix the path"))


def _check_model(
    cfg: JobConfig, node: LoginNode, missing: Missing, warnings: list[tuple[str, str]]
) -> None:
    name = cfg.train.model
    if ":" in name:
        check_import(name, "train.model", cfg, node, missing)
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
