"""What each config key accepts beyond its type: names, argv lists, Slurm times and memory,
signals, extra sbatch flags and environment variables.

:data:`FIELD_CONVERTERS` maps a dotted key to its converter; a key not listed there gets one
derived from its dataclass type hint (see :mod:`hpc_ddp.config.schema`).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from hpc_ddp.config.units import format_slurm_time, parse_mem, parse_slurm_time
from hpc_ddp.config.values import (
    Converter,
    Invalid,
    as_float,
    as_int,
    as_str,
    as_str_list,
    bounded,
    check_chars,
    describe,
    positive,
    short_repr,
)
from hpc_ddp.errors import ConfigError

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_CHARS = 128
"""A job name is at most 128 characters: it starts the run directory's name
(``<name>-<YYYYmmdd-HHMMSS>[-N]``, which a file system caps at 255 bytes) and a sweep point's
name (``<name>-<index>``), and Slurm shows it in every listing."""
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}")


def _name(value: Any, key: str) -> str:
    out = as_str(value, key)
    if len(out) > MAX_NAME_CHARS:
        raise Invalid(
            key,
            f"{short_repr(out)} is over hpc-ddp's limit of {MAX_NAME_CHARS} characters for a "
            "job name. HINT: shorten it (it names the run directory and the Slurm job); "
            "put details in the config's values instead",
        )
    if not _NAME_RE.fullmatch(out):
        raise Invalid(
            key,
            f"{out!r} is not a valid job name. HINT: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (it names the run directory and the Slurm job)",
        )
    return out


def _import_string(value: Any, key: str) -> str:
    out = as_str(value, key)
    if not _IMPORT_RE.fullmatch(out):
        raise Invalid(
            key,
            f"{short_repr(out)} is not an import string. HINT: write it as "
            + "'package.module:function'",
        )
    return out


def _maybe_import(value: Any, key: str) -> str:
    out = as_str(value, key)
    return _import_string(out, key) if ":" in out else out


def _command(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = json.dumps(shlex.split(value))
        except ValueError:
            argv = '["python", "train.py", "--lr", "0.1"]'
        raise Invalid(
            key,
            f"expected an argv list, got a string. HINT: write a list, one item per argument: "
            f"{argv}",
        )
    if not isinstance(value, (list, tuple)) or not value:
        raise Invalid(
            key,
            f"expected a non-empty argv list, got {describe(value)}. HINT: e.g. "
            '["python", "train.py"]',
        )
    argv_items = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise Invalid(f"{key}[{i}]", f"expected a string, got {describe(item)}. HINT: quote it")
        argv_items.append(check_chars(item, f"{key}[{i}]"))
    return tuple(argv_items)


def _time(value: Any, key: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a bare YAML integer is minutes, as in sbatch
    text = as_str(value, key)
    try:
        return format_slurm_time(parse_slurm_time(text))
    except ConfigError as exc:
        raise Invalid(key, str(exc)) from None


def _mem(value: Any, key: str) -> str:
    """A per-node memory size; ``0`` (in any unit) is kept as ``0``: all of the node's memory."""
    try:
        megabytes = parse_mem(value)
    except ConfigError as exc:
        raise Invalid(key, str(exc)) from None
    return "0" if megabytes == 0 else str(value).strip()


_PYTHON_RE = re.compile(r"[A-Za-z0-9_./+-]+")


def _container_python(value: Any, key: str) -> str:
    """One executable, a name on the image's PATH or an absolute path: never a command line.

    It is rendered shell-quoted anyway; refusing anything else catches a pasted command line
    (``python3 -u``) or a value that would read as an option, with a clear message."""
    out = as_str(value, key)
    if not _PYTHON_RE.fullmatch(out) or out.startswith("-") or out.endswith("/"):
        raise Invalid(
            key,
            f"{short_repr(out)} is not an executable name or path. HINT: give the image's "
            "interpreter alone, e.g. python3 or /opt/conda/bin/python (letters, digits and "
            "'._+-/', no spaces, quotes or shell characters)",
        )
    return out


def _srun_args(value: Any, key: str) -> tuple[str, ...]:
    """Extra srun options, each one argument that starts with ``-`` (``--mpi=pmix``)."""
    args = as_str_list(value, key)
    for i, arg in enumerate(args):
        if not arg.startswith("-") or arg.strip("-") == "":
            raise Invalid(
                f"{key}[{i}]",
                f"{short_repr(arg)} is not an srun option. HINT: each item is one option "
                "starting with '-', with its value attached: write '--mpi=pmix', not "
                "['--mpi', 'pmix']",
            )
        name = arg.partition("=")[0]
        long_owner = next(
            (
                f
                for f in _SRUN_OWN
                if name.startswith("--") and len(name) >= 5 and f.startswith(name[2:])
            ),
            None,
        )
        if long_owner or (not arg.startswith("--") and arg[:2] in ("-o", "-e")):
            raise Invalid(
                f"{key}[{i}]",
                f"{short_repr(arg)} sets the step's log files, which hpc-ddp writes itself "
                "(RUN_DIR/logs/rank-N.*, appended across requeues). HINT: leave it out",
            )
    return args


_SRUN_OWN = ("output", "error", "open-mode")


_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "ALRM")


def _signal(value: Any, key: str) -> str:
    """Signals Slurm may send ahead of the time limit.

    USR2 is the default because NCCL's watchdog, and some launchers, install a USR1 handler of
    their own, so a USR1 meant for hpc-ddp can be swallowed.
    """
    out = as_str(value, key)
    if out in _SIGNALS:
        return out
    bare = out.upper().removeprefix("SIG")
    hint = f"write '{bare}'" if bare in _SIGNALS else f"use one of: {', '.join(_SIGNALS)}"
    raise Invalid(key, f"{short_repr(out)} is not a signal hpc-ddp handles. HINT: {hint}")


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
        return check_chars(value, key)
    hint = "write null for a bare flag such as --exclusive" if allow_none else "quote it"
    raise Invalid(key, f"expected a string, got {describe(value)}. HINT: {hint}")


def _pairs(value: Any, key: str) -> dict[str, Any]:
    if isinstance(value, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value
    ):
        value = dict(value)  # the pair form a resolved config's dataclass holds
    if not isinstance(value, Mapping):
        raise Invalid(key, f"expected a mapping, got {describe(value)}. HINT: write NAME: VALUE")
    return dict(value)


def _check_name_length(name: Any, key: str) -> None:
    """A flag or variable name is at most :data:`MAX_NAME_CHARS` long (checked before it is
    used in a message's key)."""
    if isinstance(name, str) and len(name) > MAX_NAME_CHARS:
        raise Invalid(
            key,
            f"the name {short_repr(name)} is over hpc-ddp's limit of {MAX_NAME_CHARS} "
            "characters. HINT: no sbatch flag or environment variable has so long a name",
        )


def _extra(value: Any, key: str) -> tuple[tuple[str, str | None], ...]:
    out = []
    for flag, flag_value in _pairs(value, key).items():
        _check_name_length(flag, key)
        where = f"{key}.{flag}"
        if not isinstance(flag, str) or not _FLAG_RE.fullmatch(flag):
            bare = str(flag).lstrip("-")
            hint = (
                f"write it without leading dashes: '{bare}'"
                if bare != str(flag)
                else "write sbatch's long option name in lower case, e.g. gres, mail-type"
            )
            raise Invalid(
                where, f"{short_repr(flag)} is not an sbatch long option name. HINT: {hint}"
            )
        owner = _FLAG_OWNERS.get(flag)
        if owner is not None:
            short = "" if owner == flag else f"'{flag}' abbreviates --{owner}, and "
            raise Invalid(
                where,
                f"{short}--{owner} is set by hpc-ddp itself. HINT: {_CONTROLLED_FLAGS[owner]}",
            )
        out.append((flag, _mapping_value(flag_value, where, allow_none=True)))
    return tuple(out)


def _vars(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    out = []
    for name, var_value in _pairs(value, key).items():
        _check_name_length(name, key)
        where = f"{key}.{name}"
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise Invalid(
                where,
                f"{short_repr(name)} is not a valid environment variable name. HINT: use "
                "letters, digits and '_', not starting with a digit",
            )
        if name in _CONTROLLED_VARS:
            raise Invalid(
                where,
                f"{name} is derived by hpc-ddp from Slurm's environment. HINT: leave it out "
                "(use dist.port for a fixed MASTER_PORT)",
            )
        text = _mapping_value(var_value, where, allow_none=False)
        assert text is not None
        out.append((name, text))
    return tuple(out)


_GPUS_HINT = "leave it out (null) for no GPUs"
FIELD_CONVERTERS: dict[str, Converter] = {
    "name": _name,
    "command": _command,
    "entrypoint": _import_string,
    "slurm.nodes": bounded(as_int, 1),
    "slurm.tasks_per_node": bounded(as_int, 1),
    "slurm.cpus_per_task": bounded(as_int, 1),
    "slurm.gpus_per_task": bounded(as_int, 1, hint=_GPUS_HINT),
    "slurm.gpus_per_node": bounded(as_int, 1, hint=_GPUS_HINT),
    "slurm.time": _time,
    "slurm.mem": _mem,
    "slurm.extra": _extra,
    "slurm.srun_args": _srun_args,
    "env.container.python": _container_python,
    "env.vars": _vars,
    "env.setup": as_str_list,
    "dist.port": bounded(as_int, 1024, 65535, "pick an unprivileged port, or null to derive one"),
    "dist.timeout_s": bounded(as_int, 1),
    "train.model": _maybe_import,
    "train.dataset": _maybe_import,
    "train.num_classes": bounded(as_int, 1),
    "train.image_size": bounded(as_int, 1),
    "train.synthetic_samples": bounded(as_int, 1),
    "train.max_steps": bounded(as_int, 1, hint="set it to at least 1, or null to use train.epochs"),
    "train.epochs": bounded(as_int, 1, hint="set it to at least 1, or null to use train.max_steps"),
    "train.batch_size": bounded(as_int, 1, hint="it is per rank; set it to at least 1"),
    "train.grad_accum": bounded(as_int, 1, hint="1 means no accumulation"),
    "train.lr": positive,
    "train.momentum": bounded(as_float, 0),
    "train.weight_decay": bounded(as_float, 0),
    "train.warmup_steps": bounded(as_int, 0),
    "train.seed": bounded(as_int, 0, 2**32 - 1),
    "train.checkpoint_every": bounded(as_int, 0, hint="0 saves only on stop and at the end"),
    "train.keep_last": bounded(as_int, 1, hint="keep at least the newest checkpoint"),
    "train.eval_every": bounded(as_int, 0, hint="0 never evaluates during training"),
    "train.log_every": bounded(as_int, 1),
    "train.num_workers": bounded(as_int, 0),
    "requeue.signal": _signal,
    # sbatch --signal=SIG@TIME takes 0..65535 seconds.
    "requeue.lead_time": bounded(as_int, 1, 65535),
    "requeue.max_requeues": bounded(as_int, 0),
}
"""Converters for keys whose rules go beyond their type hint, by dotted key."""

PAIR_KEYS = frozenset({"slurm.extra", "env.vars"})
"""Keys written as a mapping of free names, held by the dataclass as (name, value) pairs."""
