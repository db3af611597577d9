"""Load, layer, validate and dump job configs (:class:`~hpc_ddp.config.JobConfig`).

Layers, lowest first: the dataclass defaults, a site profile, the job file, then ``KEY=VALUE``
overrides from the command line. Mappings merge key by key; any other value (lists included)
from a later layer replaces the earlier one. Each layer is checked on its own (unknown keys,
types, ranges), so an error names the file or override it comes from; the merged result is then
checked as a whole (required keys, combinations).

The YAML dialect is the YAML 1.2 core schema, not PyYAML's 1.1 default: ``12:00:00`` stays a
string (1.1 reads it as the sexagesimal integer 43200), ``yes``/``no``/``on``/``off`` and dates
stay strings, ``1e-3`` is a float, ``007`` is a string, and a key given twice in one mapping is
an error. :func:`dump_job_config` quotes every string that either dialect could misread.

Login-node side: imports only the standard library, PyYAML and the pure core.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import shlex
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from hpc_ddp.config import JobConfig
from hpc_ddp.errors import ConfigError, OverrideError, RunDirError
from hpc_ddp.units import format_slurm_time, parse_mem, parse_slurm_time

SITE_ENV_VAR = "HPC_DDP_SITE"
"""Environment variable naming the site profile (after ``--site``, before the default path)."""
SITE_DEFAULT = Path(".config", "hpc-ddp", "site.yaml")
"""The site profile looked for under the home directory when none is named."""

# ---------------------------------------------------------------------------------------------
# YAML dialect

_RESOLVERS: list[tuple[str, str, list[str]]] = [
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    # No leading zeros (PyYAML would read 010 as octal and crash on 08), no underscores.
    ("int", r"^[-+]?(?:0|[1-9][0-9]*)$", list("-+0123456789")),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
    ("merge", r"^(?:<<)$", ["<"]),
]


def _resolver_table() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    table: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for name, pattern, firsts in _RESOLVERS:
        for first in firsts:
            table.setdefault(first, []).append((f"tag:yaml.org,2002:{name}", re.compile(pattern)))
    return table


class _Loader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core scalars that refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":merge"):
                continue
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that quotes strings our loader or a YAML 1.1 reader could misread."""


_Loader.yaml_implicit_resolvers = _resolver_table()
_Dumper.yaml_implicit_resolvers = _resolver_table()
_YAML11 = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    tag = _YAML11.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    ambiguous = tag != _STR_TAG
    return dumper.represent_scalar(_STR_TAG, value, style="'" if ambiguous else None)


_Dumper.add_representer(str, _represent_str)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text in hpc-ddp's dialect; a syntax error names ``source:line:column``."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or exc.context or "syntax error"
        hint = (
            "remove one of the two entries"
            if "duplicate key" in problem
            else "check the indentation and quoting on that line (quote values containing "
            "': ', ' #', '{' or '[')"
        )
        raise ConfigError(f"{where}: invalid YAML: {problem}. HINT: {hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}. HINT: check the file's syntax") from None


def read_yaml(path: Path, what: str = "job file") -> Any:
    """Read and parse one YAML file; a missing or unreadable file is a :class:`ConfigError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such {what}. HINT: check the path (relative paths start from the "
            "current directory)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read {what}: {exc}. HINT: it must be a readable UTF-8 file"
        ) from None
    return parse_yaml(text, str(path))


# ---------------------------------------------------------------------------------------------
# Schema: converters built once from the dataclasses' type hints


class _Invalid(Exception):
    """A value is wrong; ``text`` is "problem. HINT: fix". Callers add the source."""

    def __init__(self, key: str, text: str) -> None:
        super().__init__(f"{key}: {text}")
        self.key = key
        self.text = text


_Conv = Callable[[Any, str], Any]

_YAML_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{_YAML_TYPES.get(type(value), type(value).__name__)} {value!r}"


def _check_chars(value: str, key: str) -> str:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise _Invalid(
            key,
            f"{value[:40]!r} contains a line break or NUL character. HINT: write it on one "
            "line; values go into the generated sbatch script, one line each",
        )
    return value


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        hint = "quote it" if isinstance(value, (bool, int, float)) else "write a single string"
        raise _Invalid(key, f"expected a string, got {_describe(value)}. HINT: {hint}")
    if not value:
        raise _Invalid(key, "is an empty string. HINT: leave the key out (or null) for the default")
    return _check_chars(value, key)


def _int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        hint = f"write it without a decimal point: {int(value)}"
    elif isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+", value.strip()):
        hint = f"remove the quotes: {value.strip()}"
    else:
        hint = "write a whole number"
    raise _Invalid(key, f"expected an integer, got {_describe(value)}. HINT: {hint}")


def _float(value: Any, key: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _Invalid(key, f"must be a finite number, got {value!r}. HINT: write a number")
        return float(value)
    hint = "write a number such as 0.1 or 1e-3"
    if isinstance(value, str):
        try:
            float(value)
            hint = f"remove the quotes: {value.strip()}"
        except ValueError:
            pass
    raise _Invalid(key, f"expected a number, got {_describe(value)}. HINT: {hint}")


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    hint = "write true or false"
    if isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        hint += f" (hpc-ddp reads YAML 1.2, where {value!r} is a string)"
    raise _Invalid(key, f"expected true or false, got {_describe(value)}. HINT: {hint}")


def _choice(choices: tuple[str, ...]) -> _Conv:
    def convert(value: Any, key: str) -> str:
        if isinstance(value, str) and value in choices:
            return value
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "use one of those"
        raise _Invalid(key, f"{_describe(value)} is not one of: {', '.join(choices)}. HINT: {hint}")

    return convert


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise _Invalid(
            key, f"expected a list of strings, got {_describe(value)}. HINT: write [{value}]"
        )
    if not isinstance(value, (list, tuple)):
        raise _Invalid(key, f"expected a list of strings, got {_describe(value)}")
    return tuple(_str(item, f"{key}[{i}]") for i, item in enumerate(value))


def _optional(conv: _Conv) -> _Conv:
    def convert(value: Any, key: str) -> Any:
        return None if value is None else conv(value, key)

    return convert


def _bounded(conv: _Conv, low: float, high: float | None = None, hint: str = "") -> _Conv:
    def convert(value: Any, key: str) -> Any:
        out = conv(value, key)
        if out is not None and (out < low or (high is not None and out > high)):
            want = f"between {low} and {high}" if high is not None else f"at least {low}"
            fix = hint or (f"use a value {want}" if high is not None else f"use {low} or more")
            raise _Invalid(key, f"must be {want}, got {out!r}. HINT: {fix}")
        return out

    return convert


def _positive(value: Any, key: str) -> float:
    out = _float(value, key)
    if out <= 0:
        raise _Invalid(key, f"must be greater than 0, got {out!r}. HINT: e.g. 0.1 or 1e-3")
    return out


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}")


def _name(value: Any, key: str) -> str:
    out = _str(value, key)
    if not _NAME_RE.fullmatch(out):
        raise _Invalid(
            key,
            f"{out!r} is not a valid job name. HINT: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (it names the run directory and the Slurm job)",
        )
    return out


def _import_string(value: Any, key: str) -> str:
    out = _str(value, key)
    if not _IMPORT_RE.fullmatch(out):
        raise _Invalid(
            key, f"{out!r} is not an import string. HINT: write it as 'package.module:function'"
        )
    return out


def _maybe_import(value: Any, key: str) -> str:
    out = _str(value, key)
    return _import_string(out, key) if ":" in out else out


def _command(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = json.dumps(shlex.split(value))
        except ValueError:
            argv = '["python", "train.py", "--lr", "0.1"]'
        raise _Invalid(
            key,
            f"expected an argv list, got a string. HINT: write a list, one item per argument: "
            f"{argv}",
        )
    if not isinstance(value, (list, tuple)) or not value:
        raise _Invalid(
            key,
            f"expected a non-empty argv list, got {_describe(value)}. HINT: e.g. "
            '["python", "train.py"]',
        )
    argv_items = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _Invalid(
                f"{key}[{i}]", f"expected a string, got {_describe(item)}. HINT: quote it"
            )
        argv_items.append(_check_chars(item, f"{key}[{i}]"))
    return tuple(argv_items)


def _time(value: Any, key: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a bare YAML integer is minutes, as in sbatch
    text = _str(value, key)
    try:
        return format_slurm_time(parse_slurm_time(text))
    except ConfigError as exc:
        raise _Invalid(key, str(exc)) from None


def _mem(value: Any, key: str) -> str:
    try:
        parse_mem(value)
    except ConfigError as exc:
        raise _Invalid(key, str(exc)) from None
    return str(value).strip()


_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "ALRM")


def _signal(value: Any, key: str) -> str:
    """Signals Slurm may send ahead of the time limit.

    USR2 is the default because NCCL's watchdog, and some launchers, install a USR1 handler of
    their own, so a USR1 meant for hpc-ddp can be swallowed.
    """
    out = _str(value, key)
    if out in _SIGNALS:
        return out
    bare = out.upper().removeprefix("SIG")
    hint = f"write '{bare}'" if bare in _SIGNALS else f"use one of: {', '.join(_SIGNALS)}"
    raise _Invalid(key, f"{out!r} is not a signal hpc-ddp handles. HINT: {hint}")


# sbatch flags hpc-ddp sets itself: flag -> how to get the effect instead.
_LOGS = "leave it out: logs always go to RUN_DIR/logs/"
_CONTROLLED_FLAGS = {
    "output": _LOGS,
    "error": _LOGS,
    "open-mode": "leave it out: logs are appended to across requeues",
    "signal": "use requeue.signal and requeue.lead_time",
    "requeue": "use requeue.max_requeues",
    "no-requeue": "use requeue.max_requeues: 0",
    "nodes": "use slurm.nodes",
    "ntasks-per-node": "use slurm.tasks_per_node",
    "ntasks": "use slurm.nodes and slurm.tasks_per_node",
    "array": "use a sweep file (hpc-ddp sweep)",
    "job-name": "use name",
    "time": "use slurm.time",
    "mem": "use slurm.mem",
    "partition": "use slurm.partition",
    "account": "use slurm.account",
    "qos": "use slurm.qos",
    "constraint": "use slurm.constraint",
    "exclusive": "use slurm.exclusive: true",
    "cpus-per-task": "use slurm.cpus_per_task",
    "gpus-per-task": "use slurm.gpus_per_task",
    "gpus-per-node": "use slurm.gpus_per_node",
    "wrap": "use command or entrypoint",
    "parsable": "leave it out: hpc-ddp reads the job id itself",
}
# Real sbatch flags that happen to be prefixes of a controlled one.
_PREFIX_FLAGS = frozenset({"gpus"})
# sbatch accepts unambiguous abbreviations (--outp is --output): every prefix -> its flag.
_FLAG_OWNERS = {flag[:i]: flag for flag in _CONTROLLED_FLAGS for i in range(1, len(flag))}
_FLAG_OWNERS.update({flag: flag for flag in _CONTROLLED_FLAGS})
for _flag in _PREFIX_FLAGS:
    _FLAG_OWNERS.pop(_flag, None)
_FLAG_RE = re.compile(r"[a-z][a-z0-9-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROLLED_VARS = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
)


def _mapping_value(value: Any, key: str, allow_none: bool) -> str | None:
    if value is None and allow_none:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return _check_chars(value, key)
    hint = "write null for a bare flag such as --exclusive" if allow_none else "quote it"
    raise _Invalid(key, f"expected a string, got {_describe(value)}. HINT: {hint}")


def _pairs(value: Any, key: str) -> dict[str, Any]:
    if isinstance(value, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value
    ):
        value = dict(value)  # the pair form a resolved config's dataclass holds
    if not isinstance(value, Mapping):
        raise _Invalid(key, f"expected a mapping, got {_describe(value)}. HINT: write NAME: VALUE")
    return dict(value)


def _extra(value: Any, key: str) -> tuple[tuple[str, str | None], ...]:
    out = []
    for flag, flag_value in _pairs(value, key).items():
        where = f"{key}.{flag}"
        if not isinstance(flag, str) or not _FLAG_RE.fullmatch(flag):
            bare = str(flag).lstrip("-")
            hint = (
                f"write it without leading dashes: '{bare}'"
                if bare != str(flag)
                else "write sbatch's long option name in lower case, e.g. gres, mail-type"
            )
            raise _Invalid(where, f"{flag!r} is not an sbatch long option name. HINT: {hint}")
        owner = _FLAG_OWNERS.get(flag)
        if owner is not None:
            short = "" if owner == flag else f"'{flag}' abbreviates --{owner}, and "
            raise _Invalid(
                where,
                f"{short}--{owner} is set by hpc-ddp itself. HINT: {_CONTROLLED_FLAGS[owner]}",
            )
        out.append((flag, _mapping_value(flag_value, where, allow_none=True)))
    return tuple(out)


def _vars(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    out = []
    for name, var_value in _pairs(value, key).items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise _Invalid(
                where,
                f"{name!r} is not a valid environment variable name. HINT: use letters, digits "
                "and '_', not starting with a digit",
            )
        if name in _CONTROLLED_VARS:
            raise _Invalid(
                where,
                f"{name} is derived by hpc-ddp from Slurm's environment. HINT: leave it out "
                "(use dist.port for a fixed MASTER_PORT)",
            )
        text = _mapping_value(var_value, where, allow_none=False)
        assert text is not None
        out.append((name, text))
    return tuple(out)


_GPUS_HINT = "leave it out (null) for no GPUs"
_SPECIAL: dict[str, _Conv] = {
    "name": _name,
    "command": _command,
    "entrypoint": _import_string,
    "slurm.nodes": _bounded(_int, 1),
    "slurm.tasks_per_node": _bounded(_int, 1),
    "slurm.cpus_per_task": _bounded(_int, 1),
    "slurm.gpus_per_task": _bounded(_int, 1, hint=_GPUS_HINT),
    "slurm.gpus_per_node": _bounded(_int, 1, hint=_GPUS_HINT),
    "slurm.time": _time,
    "slurm.mem": _mem,
    "slurm.extra": _extra,
    "env.vars": _vars,
    "env.setup": _str_list,
    "dist.port": _bounded(_int, 1024, 65535, "pick an unprivileged port, or null to derive one"),
    "dist.timeout_s": _bounded(_int, 1),
    "train.model": _maybe_import,
    "train.dataset": _maybe_import,
    "train.num_classes": _bounded(_int, 1),
    "train.image_size": _bounded(_int, 1),
    "train.synthetic_samples": _bounded(_int, 1),
    "train.max_steps": _bounded(_int, 1, hint="set it to at least 1, or null to use train.epochs"),
    "train.epochs": _bounded(_int, 1, hint="set it to at least 1, or null to use train.max_steps"),
    "train.batch_size": _bounded(_int, 1, hint="it is per rank; set it to at least 1"),
    "train.grad_accum": _bounded(_int, 1, hint="1 means no accumulation"),
    "train.lr": _positive,
    "train.momentum": _bounded(_float, 0),
    "train.weight_decay": _bounded(_float, 0),
    "train.warmup_steps": _bounded(_int, 0),
    "train.seed": _bounded(_int, 0, 2**32 - 1),
    "train.checkpoint_every": _bounded(_int, 0, hint="0 saves only on stop and at the end"),
    "train.keep_last": _bounded(_int, 1, hint="keep at least the newest checkpoint"),
    "train.eval_every": _bounded(_int, 0, hint="0 never evaluates during training"),
    "train.log_every": _bounded(_int, 1),
    "train.num_workers": _bounded(_int, 0),
    "requeue.signal": _signal,
    # sbatch --signal=SIG@TIME takes 0..65535 seconds.
    "requeue.lead_time": _bounded(_int, 1, 65535),
    "requeue.max_requeues": _bounded(_int, 0),
}


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    key: str
    convert: _Conv
    required: bool
    section: type[Any] | None  # a nested config dataclass


_SCHEMA: dict[type[Any], tuple[_Field, ...]] = {}
_NAMES: dict[type[Any], frozenset[str]] = {}
_KEYS: dict[str, str] = {}  # dotted key -> "section" | "value" | "mapping" (free child names)
_PAIR_KEYS = frozenset({"slurm.extra", "env.vars"})


def _converter(tp: Any) -> _Conv:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return _optional(_converter(inner))
    if origin is Literal:
        return _choice(tuple(args))
    if origin is tuple and args[1:] == (Ellipsis,) and args[0] is str:
        return _str_list
    simple: dict[Any, _Conv] = {str: _str, int: _int, float: _float, bool: _bool}
    if tp in simple:
        return simple[tp]
    raise TypeError(f"no converter for config type {tp!r}")  # a new field type in config.py


def _register(cls: type[Any], prefix: str) -> None:
    hints = get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        inner = [a for a in get_args(tp) if a is not type(None)] or [tp]
        first = inner[0]
        section = first if isinstance(first, type) and dataclasses.is_dataclass(first) else None
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if section is not None:
            _KEYS[key] = "section"
            _register(section, f"{key}.")
            conv: _Conv = _none_is_empty if tp is section else _optional(_mapping_section)
        else:
            _KEYS[key] = "mapping" if key in _PAIR_KEYS else "value"
            base = _SPECIAL.get(key) or _converter(tp)
            conv = _optional(base) if type(None) in get_args(tp) else base
        fields.append(_Field(f.name, key, conv, required, section))
    _SCHEMA[cls] = tuple(fields)
    _NAMES[cls] = frozenset(f.name for f in fields)


def _none_is_empty(value: Any, key: str) -> Any:
    return {} if value is None else _mapping_section(value, key)


def _mapping_section(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid(key, f"expected a mapping, got {_describe(value)}. HINT: indent its keys")
    return value


_register(JobConfig, "")
_CHILDREN: dict[str, list[str]] = {}
for _key in _KEYS:
    _CHILDREN.setdefault(_key.rpartition(".")[0], []).append(_key.rpartition(".")[2])


def _unknown(key: str) -> _Invalid:
    parent, _, leaf = key.rpartition(".")
    siblings = _CHILDREN.get(parent, [])
    close = [f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(leaf, siblings)]
    if not close:
        close = [k for k in _KEYS if k.rpartition(".")[2] == leaf]  # right name, wrong section
    if not close:
        leaves = {k.rpartition(".")[2]: k for k in _KEYS}
        close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves))]
    if close:
        hint = f"did you mean '{close[0]}'?"
    else:
        where = f"under '{parent}'" if parent else "at the top level"
        hint = f"valid keys {where}: {', '.join(siblings)}"
    return _Invalid(key, f"unknown key. HINT: {hint}")


_REQUIRED_HINTS = {
    "name": "start the file with 'name: my-job'",
    "env.container.runtime": "set env.container.runtime: apptainer or pyxis",
    "env.container.image": "set env.container.image to the image file or name",
}
# (dotted key, id(list or mapping)) -> (that object, its converted value)
_Memo = dict[tuple[str, int], tuple[Any, Any]]


def _convert(
    cls: type[Any], data: Mapping[str, Any], prefix: str, partial: bool, memo: _Memo | None = None
) -> Any:
    """Convert one section; ``partial`` checks only what is present (a layer, an override).

    With a ``memo``, a list or mapping seen before under the same key (the same object, as
    sweep points share them) is converted once: conversion is a pure function of the value.
    """
    fields = _SCHEMA[cls]
    names = _NAMES[cls]
    for raw_key in data:
        if raw_key not in names:
            if not isinstance(raw_key, str):
                where = prefix.rstrip(".") or "(top level)"
                raise _Invalid(where, f"key {raw_key!r} is not a string. HINT: use a key name")
            raise _unknown(f"{prefix}{raw_key}")
    kwargs: dict[str, Any] = {}
    for f in fields:
        if f.name not in data:
            if f.required and not partial:
                hint = _REQUIRED_HINTS.get(f.key, f"set {f.key}")
                raise _Invalid(f.key, f"required key missing. HINT: {hint}")
            continue
        raw = data[f.name]
        shareable = memo is not None and type(raw) in (dict, list, tuple)
        if shareable:
            assert memo is not None
            hit = memo.get((f.key, id(raw)))
            if hit is not None and hit[0] is raw:
                kwargs[f.name] = hit[1]
                continue
        value = f.convert(raw, f.key)
        if f.section is not None and value is not None:
            value = _convert(f.section, value, f"{f.key}.", partial, memo)
        if shareable:
            assert memo is not None
            memo[(f.key, id(raw))] = (raw, value)  # holding ``raw`` keeps its id valid
        kwargs[f.name] = value
    return None if partial else cls(**kwargs)


def _check_combinations(cfg: JobConfig) -> None:
    slurm, train = cfg.slurm, cfg.train
    if slurm.gpus_per_task is not None and slurm.gpus_per_node is not None:
        raise _Invalid(
            "slurm.gpus_per_task",
            "is set together with slurm.gpus_per_node. HINT: set only one (gpus_per_task: 1 "
            "gives each rank its own GPU)",
        )
    limit = parse_slurm_time(slurm.time)
    if cfg.requeue.lead_time >= limit:
        raise _Invalid(
            "requeue.lead_time",
            f"{cfg.requeue.lead_time} s is not shorter than slurm.time ({slurm.time}). HINT: "
            "shorten requeue.lead_time or lengthen slurm.time",
        )
    if train.max_steps is None and train.epochs is None:
        raise _Invalid(
            "train.max_steps",
            "train.max_steps and train.epochs are both null. HINT: set one of them",
        )
    if cfg.command is not None and cfg.entrypoint is not None:
        raise _Invalid(
            "command",
            "is set together with entrypoint. HINT: keep one: command runs a script, "
            "entrypoint calls a Python function",
        )
    flags = dict(slurm.extra)
    for flag in ("mem-per-cpu", "mem-per-gpu"):
        if flag in flags and slurm.mem is not None:
            raise _Invalid(
                f"slurm.extra.{flag}",
                "is set together with slurm.mem; sbatch refuses both. HINT: keep one",
            )


# ---------------------------------------------------------------------------------------------
# Public API


def job_config_from_dict(data: Mapping[str, Any], source: str) -> JobConfig:
    """Validate a merged plain mapping into a :class:`JobConfig`; ``source`` labels errors."""
    return _job_config(data, source, None)


def job_configs_from_dicts(items: Iterable[tuple[Mapping[str, Any], str]]) -> list[JobConfig]:
    """:func:`job_config_from_dict` over many (mapping, source) pairs, e.g. sweep points.

    Sections shared between the mappings as the same object (as :func:`with_value` leaves
    them) are converted once; every config is still checked as a whole.
    """
    memo: _Memo = {}
    return [_job_config(data, source, memo) for data, source in items]


def _job_config(data: Mapping[str, Any], source: str, memo: _Memo | None) -> JobConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping of keys (name:, slurm:, ...), got {_describe(data)}. "
            "HINT: start the file with 'name: my-job'"
        )
    try:
        cfg: JobConfig = _convert(JobConfig, data, "", partial=False, memo=memo)
        _check_combinations(cfg)
    except _Invalid as exc:
        raise ConfigError(f"{source}: {exc.key}: {exc.text}") from None
    return cfg


def _check_layer(data: Any, source: str, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """Check one layer (site profile, job file, inline base) on its own; returns it as a dict."""
    if not isinstance(data, Mapping):
        raise error(
            f"{source}: expected a mapping of keys (name:, slurm:, ...), got {_describe(data)}. "
            "HINT: start the file with 'name: my-job'"
        )
    try:
        _convert(JobConfig, data, "", partial=True)
    except _Invalid as exc:
        raise error(f"{source}: {exc.key}: {exc.text}") from None
    return dict(data)


def split_key(key: str, source: str, error: type[ConfigError] = ConfigError) -> tuple[str, ...]:
    """Check a dotted key against the schema and split it (``env.vars.A`` -> env, vars, A).

    An unknown key raises ``error`` naming ``source`` with a did-you-mean hint.
    """
    parts = key.split(".")
    if not all(parts):
        raise error(f"{source}: {key!r} is not a dotted key. HINT: write it like train.lr")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        kind = _KEYS.get(prefix)
        if kind is None:
            exc = _unknown(prefix)
            raise error(f"{source}: {exc.key}: {exc.text}")
        if kind == "mapping" and i < len(parts):
            return (*parts[:i], ".".join(parts[i:]))
        if kind == "value" and i < len(parts):
            raise error(
                f"{source}: {key}: '{prefix}' is a value, not a section. HINT: set {prefix}=VALUE"
            )
    return tuple(parts)


def with_value(data: Mapping[str, Any], path: Sequence[str], value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at ``path``; only the mappings on the path are copied.

    A mapping value merges into a mapping already there, as a later layer would.
    """
    out = dict(data)
    head, rest = path[0], path[1:]
    current = out.get(head)
    if rest:
        out[head] = with_value(current if isinstance(current, Mapping) else {}, rest, value)
    elif isinstance(value, Mapping) and isinstance(current, Mapping):
        out[head] = merge_layers(current, value)
    else:
        out[head] = value
    return out


def merge_layers(lower: Mapping[str, Any], upper: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two layers: mappings merge key by key, anything else in ``upper`` replaces."""
    out = dict(lower)
    for key, value in upper.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = merge_layers(below, value)
        else:
            out[key] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``dotted.key=VALUE`` overrides (VALUE read as YAML) to a plain config mapping.

    Returns a new mapping; ``data`` is not changed. Each override is checked on its own, so a
    malformed one, an unknown key or a wrongly typed value is an :class:`OverrideError`
    naming it.
    """
    out = dict(data)
    for text in overrides:
        source = f"override {text!r}"
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OverrideError(
                f"{source}: expected KEY=VALUE. HINT: e.g. train.lr=0.05 or slurm.nodes=2"
            )
        path = split_key(key, source, OverrideError)
        try:
            value = yaml.load(raw, Loader=_Loader)
        except yaml.YAMLError:
            raise OverrideError(
                f"{source}: {key}: cannot read {raw!r} as a YAML value. HINT: quote the value "
                "for the shell and for YAML, e.g. key='\"a: b\"'"
            ) from None
        _check_layer(with_value({}, path, value), source, OverrideError)
        out = with_value(out, path, value)
    return out


def find_site_profile(explicit: str | None, env: Mapping[str, str], home: Path) -> Path | None:
    """The site profile to use: ``explicit`` (``--site``), else ``$HPC_DDP_SITE``, else
    ``home/.config/hpc-ddp/site.yaml`` if it exists, else ``None``.

    A named profile (option or variable) that does not exist is a :class:`ConfigError`.
    """
    for text, origin in ((explicit, "--site"), (env.get(SITE_ENV_VAR), f"${SITE_ENV_VAR}")):
        if text:
            path = home / text[2:] if text == "~" or text.startswith("~/") else Path(text)
            if not path.is_file():
                raise ConfigError(
                    f"{origin}: site profile {text!r} does not exist. HINT: fix the path, or "
                    f"unset {origin} to use {home / SITE_DEFAULT} if present"
                )
            return path
    default = home / SITE_DEFAULT
    return default if default.is_file() else None


def load_job_data(
    job: Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
    site_profile: Path | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Merge the layers of one job into a plain mapping, each layer checked on its own.

    ``job`` is a job file or an inline mapping (labelled ``source`` in errors).
    """
    data: dict[str, Any] = {}
    if site_profile is not None:
        site = read_yaml(site_profile, "site profile")
        data = _check_layer({} if site is None else site, str(site_profile))
    if isinstance(job, Path):
        raw = read_yaml(job)
        if raw is None:
            raise ConfigError(f"{job}: the job file is empty. HINT: start it with 'name: my-job'")
        layer = _check_layer(raw, str(job))
    else:
        layer = _check_layer(job, source or "inline config")
    return apply_overrides(merge_layers(data, layer), overrides)


def load_job_config(
    job_path: Path, overrides: Sequence[str] = (), site_profile: Path | None = None
) -> JobConfig:
    """Load a job file over the defaults and a site profile, apply overrides, validate it."""
    data = load_job_data(job_path, overrides, site_profile)
    label = f"{job_path} (with overrides)" if overrides else str(job_path)
    return job_config_from_dict(data, label)


def job_config_to_dict(cfg: JobConfig) -> dict[str, Any]:
    """A plain, YAML-able mapping of every field; :func:`job_config_from_dict` inverts it."""
    out: dict[str, Any] = _to_plain(cfg, "")
    return out


def _to_plain(value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        prefix = f"{key}." if key else ""
        return {
            f.name: _to_plain(getattr(value, f.name), f"{prefix}{f.name}")
            for f in dataclasses.fields(value)
        }
    if key in _PAIR_KEYS:
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def dump_job_config(cfg: JobConfig) -> str:
    """The resolved config as YAML text (what ``RUN_DIR/config.yaml`` holds)."""
    text: str = yaml.dump(
        _to_plain(cfg, ""),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=2**16,
    )
    return text


def load_resolved_config(path: Path) -> JobConfig:
    """Read a run directory's resolved ``config.yaml``.

    A missing file is a :class:`RunDirError`; invalid content a :class:`ConfigError`.
    """
    if not path.is_file():
        raise RunDirError(
            f"{path}: no resolved config. HINT: is {path.parent} a run directory made by "
            "hpc-ddp submit?"
        )
    return job_config_from_dict(read_yaml(path, "resolved config"), str(path))
