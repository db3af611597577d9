"""The config schema: every key's converter, derived once from the dataclasses' type hints.

A :class:`Schema` covers one root dataclass and its sections, with its own namespace of dotted
keys: the job config (:data:`JOB_SCHEMA`) and the sweep file (:mod:`hpc_ddp.config.sweepfile`) are
two, so a key of one is never valid in the other. Converting a mapping walks it section by
section: unknown keys get a did-you-mean hint, each value goes through its key's converter,
required keys are checked on a whole config (not on a single layer), and a whole config is then
checked for combinations no single key can catch.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import re
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from hpc_ddp.config.fields import FIELD_CONVERTERS
from hpc_ddp.config.model import JobConfig, SlurmConfig, TrainConfig
from hpc_ddp.config.pairs import PAIR_KEYS
from hpc_ddp.config.params import PYTHON_NAMES, TREE_KEYS, Params, resolve_command
from hpc_ddp.config.values import (
    SHOWN_CHARS,
    Converter,
    Invalid,
    as_bool,
    as_float,
    as_int,
    as_str,
    as_str_list,
    describe,
    one_of,
    optional,
    short_repr,
)
from hpc_ddp.errors import ConfigError
from hpc_ddp.frozen import dataclass


@dataclass(frozen=True)
class _Field:
    """One key of a schema: its field, dotted key and converter, and its section's class."""

    name: str
    key: str
    convert: Converter
    required: bool
    section: type[Any] | None  # a nested config dataclass


@dataclass(frozen=True)
class Schema:
    """The keys of one root dataclass and its sections; build one with :func:`build_schema`."""

    root: type[Any]
    """The dataclass a whole file converts to."""
    fields: Mapping[type[Any], Mapping[str, _Field]]
    """Each section's dataclass (the root's included) -> its fields by name, in order."""
    key_kinds: Mapping[str, str]
    """Dotted key -> ``"section"``, ``"value"``, ``"mapping"`` (a mapping of free names) or
    ``"tree"`` (free names at any depth: ``params``)."""
    children: Mapping[str, tuple[str, ...]]
    """Dotted section key (``""`` for the top level) -> the names of its keys."""
    required_hints: Mapping[str, str]
    """Dotted key -> how to fix it missing (default: ``set KEY``)."""
    shape: str
    """The file's shape and how to start one, for a file that is not a mapping at all."""
    check: Callable[[Any], None] | None = None
    """Checks a whole converted root for what no single key can catch; raises Invalid."""

    def unknown_key(self, key: str) -> Invalid:
        """The error for an unknown dotted key, with a did-you-mean hint (or the valid keys)."""
        import difflib  # only for a typo: a submit that is right never pays for it

        parent, _, leaf = key.rpartition(".")
        siblings = self.children.get(parent, ())
        close = [
            f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(leaf, siblings)
        ]
        if not close:  # the right name in the wrong section
            close = [k for k in self.key_kinds if k.rpartition(".")[2] == leaf]
        if not close:
            leaves = {k.rpartition(".")[2]: k for k in self.key_kinds}
            close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves))]
        if close:
            hint = f"did you mean '{close[0]}'?"
        else:
            where = f"under '{parent}'" if parent else "at the top level"
            hint = f"valid keys {where}: {', '.join(siblings)}"
        if len(leaf) > SHOWN_CHARS:  # a message quotes a key, never floods
            key = f"{parent}.{short_repr(leaf)}" if parent else short_repr(leaf)
        return Invalid(key, f"unknown key. HINT: {hint}")

    def convert(self, data: Any, source: str) -> Any:
        """Convert a whole file's mapping into :attr:`root` and check it; ``source`` labels
        errors (a :class:`ConfigError`)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected {self.shape.format(describe(data))}")
        try:
            out = _convert(self, self.root, data, "", partial=False)
            if self.check is not None:
                self.check(out)
        except Invalid as exc:
            raise ConfigError(f"{source}: {exc.key}: {exc.text}") from None
        return out


def _converter(tp: Any) -> Converter:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return optional(_converter(inner))
    if origin is Literal:
        return one_of(tuple(args))
    if origin is tuple and args[1:] == (Ellipsis,) and args[0] is str:
        return as_str_list
    simple: dict[Any, Converter] = {str: as_str, int: as_int, float: as_float, bool: as_bool}
    if tp in simple:
        return simple[tp]
    raise TypeError(f"no converter for config type {tp!r}")  # a new field type in a model


def build_schema(
    root: type[Any],
    converters: Mapping[str, Converter],
    kinds: Mapping[str, str],
    required_hints: Mapping[str, str],
    shape: str,
    check: Callable[[Any], None] | None = None,
) -> Schema:
    """The schema of ``root``: each field's converter is ``converters[dotted key]`` or derived
    from its type hint; ``kinds`` marks the keys whose sub-keys are free names (``"mapping"``,
    ``"tree"``); ``shape`` is ``"a mapping of keys (...), got {}. HINT: ..."``."""
    fields: dict[type[Any], dict[str, _Field]] = {}
    key_kinds: dict[str, str] = {}

    def register(cls: type[Any], prefix: str) -> None:
        hints = _type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            key, tp = f"{prefix}{f.name}", hints[f.name]
            first = ([a for a in get_args(tp) if a is not type(None)] or [tp])[0]
            section = first if isinstance(first, type) and dataclasses.is_dataclass(first) else None
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if section is not None:
                key_kinds[key] = "section"
                register(section, f"{key}.")
                conv: Converter = _none_is_empty if tp is section else optional(_mapping_section)
            else:
                key_kinds[key] = kinds.get(key, "value")
                base = converters.get(key) or _converter(tp)
                conv = optional(base) if type(None) in get_args(tp) else base
            out[f.name] = _Field(f.name, key, conv, required, section)
        fields[cls] = out

    register(root, "")
    children: dict[str, list[str]] = {}
    for key in key_kinds:
        children.setdefault(key.rpartition(".")[0], []).append(key.rpartition(".")[2])
    return Schema(
        root, fields, key_kinds, {k: tuple(v) for k, v in children.items()},
        required_hints, shape, check,
    )  # fmt: skip


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """``typing.get_type_hints(cls)`` for a dataclass's fields, for less: get_type_hints
    compiles each of a job's 89 annotations on every import; here a bare name (19 of the 28
    distinct ones) is looked up, and each other text compiled once."""
    scopes = (vars(sys.modules[cls.__module__]), dict(vars(cls)), vars(builtins))
    return {f.name: _evaluate(f.type, scopes) for f in dataclasses.fields(cls)}


def _evaluate(annotation: Any, scopes: tuple[dict[str, Any], ...]) -> Any:
    """An annotation's value, found as get_type_hints finds it: the module's names, then the
    class's, then the builtins; ``None`` is ``NoneType``."""
    if not isinstance(annotation, str):
        value = annotation
    elif annotation.isidentifier():
        scope = next((s for s in scopes if annotation in s), None)
        if scope is None:
            raise NameError(f"name {annotation!r} is not defined")
        value = scope[annotation]
    else:
        module, namespace, _ = scopes
        value = eval(_compiled(annotation), namespace, module)
    return type(None) if value is None else value


@functools.cache
def _compiled(annotation: str) -> types.CodeType:
    return compile(annotation, "<annotation>", "eval")


def _none_is_empty(value: Any, key: str) -> Any:
    return {} if value is None else _mapping_section(value, key)


def _mapping_section(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise Invalid(key, f"expected a mapping, got {describe(value)}. HINT: indent its keys")
    return value


_JOB_SHAPE = (
    "a mapping of keys (name:, slurm:, ...), got {}. HINT: start the file with 'name: my-job'"
)
JOB_SCHEMA = build_schema(
    JobConfig,
    FIELD_CONVERTERS,
    {**dict.fromkeys(TREE_KEYS, "tree"), **dict.fromkeys(PAIR_KEYS, "mapping")},
    {
        "name": "start the file with 'name: my-job'",
        "env.container.runtime": "set env.container.runtime: apptainer, pyxis or charliecloud",
        "env.container.image": "set env.container.image to the image file or name",
        "train.keep_best.metric": "name the metric, as in keep_best: {metric: val_loss, mode: min}",
    },
    _JOB_SHAPE,
)
"""Every key of a job config (:class:`JobConfig`)."""
KEY_KINDS = JOB_SCHEMA.key_kinds
"""The job config's dotted keys -> their kind (see :attr:`Schema.key_kinds`)."""


def unknown_key(key: str) -> Invalid:
    """The error for an unknown dotted job-config key, with a did-you-mean hint."""
    return JOB_SCHEMA.unknown_key(key)


# (dotted key, id(list or mapping)) -> (that object, its converted value)
Memo = dict[tuple[str, int], tuple[Any, Any]]


def _convert(
    schema: Schema,
    cls: type[Any],
    data: Mapping[str, Any],
    prefix: str,
    partial: bool,
    memo: Memo | None = None,
) -> Any:
    """Convert one section; ``partial`` checks only what is present (a layer, an override).

    With a ``memo``, a list or mapping seen before under the same key (the same object, as
    sweep points share them) is converted once: conversion is a pure function of the value.
    """
    fields = schema.fields[cls]
    for raw_key in data:
        if raw_key not in fields:
            if not isinstance(raw_key, str):
                where = prefix.rstrip(".") or "(top level)"
                raise Invalid(where, f"key {raw_key!r} is not a string. HINT: use a key name")
            raise schema.unknown_key(f"{prefix}{raw_key}")
    kwargs: dict[str, Any] = {}
    for f in fields.values():
        if f.name in data:
            kwargs[f.name] = _convert_field(schema, f, data[f.name], partial, memo)
        elif f.required and not partial:
            hint = schema.required_hints.get(f.key, f"set {f.key}")
            raise Invalid(f.key, f"required key missing. HINT: {hint}")
    return None if partial else cls(**kwargs)


def _convert_field(schema: Schema, f: _Field, raw: Any, partial: bool, memo: Memo | None) -> Any:
    if memo is None or type(raw) not in (dict, list, tuple):
        return _convert_value(schema, f, raw, partial, memo)
    hit = memo.get((f.key, id(raw)))
    if hit is not None and hit[0] is raw:
        return hit[1]
    value = _convert_value(schema, f, raw, partial, memo)
    memo[(f.key, id(raw))] = (raw, value)  # holding ``raw`` keeps its id valid
    return value


def _convert_value(schema: Schema, f: _Field, raw: Any, partial: bool, memo: Memo | None) -> Any:
    value = f.convert(raw, f.key)
    if f.section is not None and value is not None:
        value = _convert(schema, f.section, value, f"{f.key}.", partial, memo)
    return value


def _check_combinations(cfg: JobConfig, placeholders: bool) -> None:
    slurm, train = cfg.slurm, cfg.train
    if slurm.gpus_per_task is not None and slurm.gpus_per_node is not None:
        raise Invalid(
            "slurm.gpus_per_task",
            "is set together with slurm.gpus_per_node. HINT: set only one (gpus_per_task: 1 "
            "gives each rank its own GPU)",
        )
    if slurm.gpus_per_node is not None and slurm.tasks_per_node > slurm.gpus_per_node:
        # The runtime puts rank LOCAL_RANK on cuda:LOCAL_RANK: the extra ranks would have none.
        raise Invalid(
            "slurm.tasks_per_node",
            f"is {slurm.tasks_per_node}, more tasks than slurm.gpus_per_node "
            f"({slurm.gpus_per_node}): each rank needs a GPU of its own. HINT: set "
            "slurm.tasks_per_node to the GPUs per node (one task per GPU)",
        )
    _check_launcher(cfg)
    if cfg.command is None and cfg.entrypoint is None:
        _check_trainer_gpus(slurm)
    limit = slurm.time_s
    if cfg.requeue.lead_time != "auto" and cfg.requeue.lead_time >= limit:
        raise Invalid(
            "requeue.lead_time",
            f"{cfg.requeue.lead_time} s is not shorter than slurm.time ({slurm.time}). HINT: "
            "shorten requeue.lead_time or lengthen slurm.time",
        )
    if train.max_steps is None and train.epochs is None:
        raise Invalid(
            "train.max_steps",
            "train.max_steps and train.epochs are both null. HINT: set one of them",
        )
    if cfg.command is not None and cfg.entrypoint is not None:
        raise Invalid(
            "command",
            "is set together with entrypoint. HINT: keep one: command runs a script, "
            "entrypoint calls a Python function",
        )
    if placeholders and cfg.command is not None:
        resolve_command(cfg.command, cfg.params)  # a placeholder naming no param fails here
    _check_fault(cfg)
    _check_range(cfg)
    _check_checkpoint_bounds(train)
    flags = dict(slurm.extra)
    for flag in ("mem-per-cpu", "mem-per-gpu"):
        if flag in flags and slurm.mem is not None:
            raise Invalid(
                f"slurm.extra.{flag}",
                "is set together with slurm.mem; sbatch refuses both. HINT: keep one",
            )


def _check_checkpoint_bounds(train: TrainConfig) -> None:
    """``train.checkpoint_min_s``/``checkpoint_max_s`` bound ``checkpoint_every: auto`` only,
    and the minimum may not exceed the maximum."""
    defaults = TrainConfig()
    bounded = (
        train.checkpoint_min_s != defaults.checkpoint_min_s
        or train.checkpoint_max_s != defaults.checkpoint_max_s
    )
    if bounded and train.checkpoint_every != "auto":
        key = (
            "train.checkpoint_min_s"
            if train.checkpoint_min_s != defaults.checkpoint_min_s
            else "train.checkpoint_max_s"
        )
        raise Invalid(
            key,
            f"is set but train.checkpoint_every is {train.checkpoint_every}, not auto: the "
            "bounds apply to the auto interval only. HINT: set train.checkpoint_every: auto, "
            "or remove the bound",
        )
    if train.checkpoint_min_s > train.checkpoint_max_s:
        raise Invalid(
            "train.checkpoint_min_s",
            f"{train.checkpoint_min_s:g} s is more than train.checkpoint_max_s "
            f"({train.checkpoint_max_s:g} s). HINT: make the minimum at most the maximum",
        )


_LOCAL_RANK_ARG = r"--[A-Za-z][A-Za-z0-9_-]*"  # compiled at first use (re caches it)


def _check_launcher(cfg: JobConfig) -> None:
    """``dist.launcher``, ``dist.procs_per_node`` and ``dist.local_rank_arg`` must fit the
    job: torchrun starts a ``command`` once per node; the argument is one option name."""
    dist, slurm = cfg.dist, cfg.slurm
    arg = dist.local_rank_arg
    if arg is not None and not re.fullmatch(_LOCAL_RANK_ARG, arg):
        raise Invalid(
            "dist.local_rank_arg",
            f"{short_repr(arg)} is not an option name. HINT: --local_rank (or --local-rank), "
            "as your script's argument parser spells it",
        )
    if arg is not None and cfg.command is None:
        raise Invalid(
            "dist.local_rank_arg", "is set without a command. HINT: set command, or drop it"
        )
    if dist.procs_per_node is not None and dist.launcher != "torchrun":
        raise Invalid(
            "dist.procs_per_node",
            "is set but dist.launcher is srun (one process per task). HINT: set "
            "dist.launcher: torchrun, or use slurm.tasks_per_node",
        )
    if dist.procs_per_node is not None and dist.procs_per_node < 1:
        raise Invalid("dist.procs_per_node", f"is {dist.procs_per_node}. HINT: at least 1")
    if dist.launcher != "torchrun":
        return
    if cfg.command is None:
        raise Invalid(
            "dist.launcher",
            "is torchrun without a command: torchrun runs your script. HINT: set command: "
            "[python, train.py, ...], or drop dist.launcher for the built-in trainer",
        )
    if slurm.tasks_per_node != 1:
        raise Invalid(
            "slurm.tasks_per_node",
            f"is {slurm.tasks_per_node} with dist.launcher: torchrun, which is started once per "
            "node and starts the workers itself. HINT: set slurm.tasks_per_node: 1 and "
            f"dist.procs_per_node: {slurm.tasks_per_node}",
        )
    if arg is not None:
        raise Invalid(
            "dist.local_rank_arg",
            "is set with dist.launcher: torchrun, which gives each worker LOCAL_RANK but no "
            "argument. HINT: use dist.launcher: srun (one task per GPU), which appends it",
        )
    first = cfg.command[1] if cfg.command[0] in PYTHON_NAMES and len(cfg.command) > 1 else None
    if first is not None and first.startswith("-") and first != "-m":
        raise Invalid(
            "command[1]",
            f"{short_repr(first)}: torchrun runs a script or `-m MODULE` with its own "
            "interpreter and takes no interpreter options. HINT: command: [python, train.py, "
            "...] or [python, -m, package.module, ...]; set PYTHON* variables in env.vars",
        )


def _check_range(cfg: JobConfig) -> None:
    """A ``slurm.min_nodes`` range must keep one global batch at every node count in it."""
    if cfg.slurm.min_nodes is None:
        return
    from hpc_ddp.config.elastic import range_problem  # only for a range: most jobs have none

    problem = range_problem(cfg)
    if problem is not None:
        raise Invalid("slurm.min_nodes", problem)


def _check_fault(cfg: JobConfig) -> None:
    """The fault section's timings must fit each other and ``dist.timeout_s``."""
    fault = cfg.fault
    if cfg.slurm.spare_nodes and not fault.enabled:
        raise Invalid(
            "slurm.spare_nodes",
            f"is {cfg.slurm.spare_nodes} with fault.enabled false: nothing would ever use the "
            "spare nodes. HINT: set fault.enabled: true, or slurm.spare_nodes: 0",
        )
    if not fault.enabled:
        return
    if fault.stale_s < 3 * fault.beat_s:
        raise Invalid(
            "fault.stale_s",
            f"{fault.stale_s:g} s is under 3 heartbeats (fault.beat_s={fault.beat_s:g}): one late "
            f"beat would end the step. HINT: set fault.stale_s to {3 * fault.beat_s:g} or more",
        )
    if fault.step_timeout_s < fault.stale_s:
        raise Invalid(
            "fault.step_timeout_s",
            f"{fault.step_timeout_s} s is shorter than fault.stale_s ({fault.stale_s:g} s). "
            f"HINT: set fault.step_timeout_s to at least {fault.stale_s:g}",
        )
    if fault.startup_timeout_s <= cfg.dist.timeout_s:
        raise Invalid(
            "fault.startup_timeout_s",
            f"{fault.startup_timeout_s} s is not longer than dist.timeout_s "
            f"({cfg.dist.timeout_s} s): the rendezvous alone may take dist.timeout_s. HINT: set "
            f"fault.startup_timeout_s above {cfg.dist.timeout_s}, or lower dist.timeout_s",
        )


def _check_trainer_gpus(slurm: SlurmConfig) -> None:
    """The built-in trainer computes on one GPU per rank: more per rank would stay idle.

    (A ``command`` or ``entrypoint`` may use several per rank, model parallelism inside it.)
    """
    per_task, per_node, tasks = slurm.gpus_per_task, slurm.gpus_per_node, slurm.tasks_per_node
    if per_task is not None and per_task > 1:
        raise Invalid(
            "slurm.gpus_per_task",
            f"is {per_task}, but the built-in trainer computes on one GPU per rank: each "
            f"rank's other {per_task - 1} would stay idle. HINT: gpus_per_task: 1 with "
            "slurm.tasks_per_node set to the GPUs per node",
        )
    if per_node is not None and per_node > tasks:
        raise Invalid(
            "slurm.gpus_per_node",
            f"is {per_node} for {tasks} task(s) per node (slurm.tasks_per_node), but the "
            f"built-in trainer computes on one GPU per rank: {per_node - tasks} would stay "
            f"idle. HINT: set slurm.tasks_per_node to {per_node} (one rank per GPU), or ask for "
            f"{tasks} GPU(s) per node",
        )


MAX_CONFIG_CHARS = 64 * 1024
"""The values of one whole job config hold at most 64 KiB of text (a typical one holds 1 KiB).

Each value is bounded on its own, but a list of them is not, and a sweep repeats its base in
every point's ``config.yaml``: 10,000 points of at most 64 KiB each stay well under a gigabyte."""


_NUMBERS = (int, float, bool, type(None))
"""Values counted as 8 characters, whatever they are (exact types: checked without a call)."""


def _size(value: Any, memo: Memo | None) -> int:
    """About how many characters ``value`` takes in a config file (a section once per memo).

    Called for each of a sweep's thousands of configs: the loop counts strings and numbers in
    place rather than recursing into each.
    """
    fields = JOB_SCHEMA.fields.get(type(value))
    if fields is None:
        if isinstance(value, str):
            return len(value)
        if isinstance(value, tuple):
            return sum(_size(item, None) + 2 for item in value)
        if isinstance(value, Params):
            return sum(len(name) + 2 + _size(item, None) for name, item in value.items())
        return 8  # a number, a bool or null
    key = ("#size", id(value))
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is value:
        cached: int = hit[1]
        return cached
    size = 0
    for f in fields.values():
        item = getattr(value, f.name)
        if type(item) is str:
            size += len(item)
        elif type(item) in _NUMBERS:
            size += 8
        else:
            size += _size(item, memo)
    if memo is not None:
        memo[key] = (value, size)  # holding ``value`` keeps its id valid
    return size


def _check_size(cfg: JobConfig, memo: Memo | None) -> None:
    sizes = {
        f.key: _size(getattr(cfg, f.name), memo) for f in JOB_SCHEMA.fields[JobConfig].values()
    }
    total = sum(sizes.values())
    if total > MAX_CONFIG_CHARS:
        biggest = max(sizes, key=lambda k: sizes[k])
        raise Invalid(
            biggest,
            f"the config's values hold {total:,} characters ({sizes[biggest]:,} of them under "
            f"{biggest}), over hpc-ddp's limit of {MAX_CONFIG_CHARS:,} for one job. HINT: keep "
            "long scripts and data in files the job reads, and give their paths",
        )


def validate_job_config(
    data: Mapping[str, Any], source: str, memo: Memo | None = None, placeholders: bool = True
) -> JobConfig:
    """Convert a merged mapping into a :class:`JobConfig` and check it as a whole.

    ``source`` labels errors; a ``memo`` shared between calls converts shared sections once.
    ``placeholders=False`` leaves out the check that each ``{params.NAME}`` in ``command`` is
    defined (a sweep's base, whose points may define them).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected {_JOB_SHAPE.format(describe(data))}")
    try:
        cfg: JobConfig = _convert(JOB_SCHEMA, JobConfig, data, "", False, memo)
        _check_combinations(cfg, placeholders)
        _check_size(cfg, memo)
    except Invalid as exc:
        raise ConfigError(f"{source}: {exc.key}: {exc.text}") from None
    return cfg


def check_layer(data: Any, source: str, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """Check one layer (site profile, job file, inline base) on its own; returns it as a dict."""
    if not isinstance(data, Mapping):
        raise error(f"{source}: expected {_JOB_SHAPE.format(describe(data))}")
    try:
        _convert(JOB_SCHEMA, JobConfig, data, "", partial=True)
    except Invalid as exc:
        raise error(f"{source}: {exc.key}: {exc.text}") from None
    return dict(data)
