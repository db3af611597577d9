"""What each config key accepts beyond its type: names, argv lists, Slurm times and memory,
signals; the free-name mappings are :mod:`hpc_ddp.config.pairs` and ``params`` is
:mod:`hpc_ddp.config.params`.

:data:`FIELD_CONVERTERS` maps a dotted key to its converter; a key not listed there gets one
derived from its dataclass type hint (see :mod:`hpc_ddp.config.schema`).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from hpc_ddp.config.pairs import CLUSTERS_REFUSAL, PAIR_KEYS, env_vars, extra_flags
from hpc_ddp.config.params import as_params
from hpc_ddp.config.units import format_slurm_time, parse_mem, parse_slurm_time
from hpc_ddp.config.values import (
    MAX_NAME_CHARS,
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

__all__ = ["FIELD_CONVERTERS", "MAX_NAME_CHARS", "PAIR_KEYS"]

# Patterns of values most jobs never set are compiled when first used (re caches them), not
# on every import: the compiled ones are only the job name's.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT = rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}"


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
    if not re.fullmatch(_IMPORT, out):
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
        import json  # only for this message: a submit that is right never pays for it

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


_PYTHON = r"[A-Za-z0-9_./+-]+"


def _container_python(value: Any, key: str) -> str:
    """One executable, a name on the image's PATH or an absolute path: never a command line.

    It is rendered shell-quoted anyway; refusing anything else catches a pasted command line
    (``python3 -u``) or a value that would read as an option, with a clear message."""
    out = as_str(value, key)
    if not re.fullmatch(_PYTHON, out) or out.startswith("-") or out.endswith("/"):
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
        if _names_clusters(arg):
            raise Invalid(f"{key}[{i}]", f"{short_repr(arg)} {CLUSTERS_REFUSAL}")
        if long_owner or (not arg.startswith("--") and arg[:2] in ("-o", "-e")):
            raise Invalid(
                f"{key}[{i}]",
                f"{short_repr(arg)} sets the step's log files, which hpc-ddp writes itself "
                "(RUN_DIR/logs/rank-N.*, appended across requeues). HINT: leave it out",
            )
    return args


_SRUN_OWN = ("output", "error", "open-mode")


def _names_clusters(arg: str) -> bool:
    """``-M x``, ``-Mx``, ``--clusters=x``, ``--cluster=x`` or an abbreviation srun takes
    (``--clus=x``; ``--cluster-constraint`` is another option)."""
    if not arg.startswith("--"):
        return arg.startswith("-M")
    name = arg[2:].partition("=")[0]
    return len(name) >= 4 and "clusters".startswith(name)


_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "ALRM")


def _signal(value: Any, key: str) -> str:
    """Signals Slurm may send ahead of the time limit.

    USR2 is the default, as submitit's, because other tools claim USR1: PyTorch Lightning's
    SLURM support handles it, and NCCL installs a USR1 handler when ``NCCL_PROXY_DUMP_SIGNAL=10``
    is set. NCCL 2.12 installed one unconditionally (NVIDIA/nccl#704), which swallowed Slurm's
    USR1 and is why submitit moved to USR2; later NCCL releases, the one torch 2.14 bundles
    included, install none unless asked.
    """
    out = as_str(value, key)
    if out in _SIGNALS:
        return out
    bare = out.upper().removeprefix("SIG")
    hint = f"write '{bare}'" if bare in _SIGNALS else f"use one of: {', '.join(_SIGNALS)}"
    raise Invalid(key, f"{short_repr(out)} is not a signal hpc-ddp handles. HINT: {hint}")


_WORKER_COUNT = bounded(as_int, 0, hint="0 loads in the training process; auto picks per device")


def _num_workers(value: Any, key: str) -> int | str:
    """A count of data-loader workers (0 and up), or ``auto``."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise Invalid(
            key,
            f"{short_repr(value)} is neither a number nor auto. HINT: write auto (workers on "
            "GPUs, none on CPUs) or a count such as 4",
        )
    count: int = _WORKER_COUNT(value, key)
    return count


_CHECKPOINT_EVERY = bounded(as_int, 0, hint="0 saves only on stop and at the end")


def _checkpoint_every(value: Any, key: str) -> int | str:
    """Steps between checkpoints (0: only on stop and at the end), or ``auto``."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise Invalid(
            key,
            f"{short_repr(value)} is neither a number of steps nor auto. HINT: write auto (the "
            "interval is chosen from the measured save cost and interruption rate) or a step "
            "count such as 100",
        )
    every: int = _CHECKPOINT_EVERY(value, key)
    return every


_LEAD_TIME = bounded(as_int, 1, 65535, hint="auto sizes it from your measured save times")


def _lead_time(value: Any, key: str) -> int | str:
    """Seconds of warning before the time limit, or ``auto``."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise Invalid(
            key,
            f"{short_repr(value)} is neither a number of seconds nor auto. HINT: write auto "
            "(sized from your measured save times) or seconds such as 120",
        )
    seconds: int = _LEAD_TIME(value, key)
    return seconds


_METRIC = r"[A-Za-z_][A-Za-z0-9_./-]*"
_NOT_METRICS = frozenset({"step", "epoch", "time"})
"""Keys of a metrics row that say when, never how good."""


def _metric_name(value: Any, key: str) -> str:
    """The name of a metric a ``s.log(...)`` row carries (``val_loss``)."""
    name = as_str(value, key)
    if name in _NOT_METRICS or not re.fullmatch(_METRIC, name):
        raise Invalid(
            key,
            f"{short_repr(name)} is not a metric a checkpoint can be ranked by. HINT: name a "
            "number your rows log, as in keep_best: {metric: val_loss, mode: min} (the built-in "
            "trainer logs val_loss and val_acc when train.eval_every is set)",
        )
    return name


_GPUS_HINT = "leave it out (null) for no GPUs"
MAX_NODES = 100_000
"""More nodes than any Slurm cluster has (the largest have about 10,000): a larger count is a
typo, refused before it is rendered into ``#SBATCH --nodes``."""
MAX_PER_NODE = 10_000
"""More tasks, CPUs or GPUs than one node has, by far."""
_NODES_HINT = f"use 1 to {MAX_NODES:,} (no cluster has more nodes)"
_PER_NODE_HINT = f"use 1 to {MAX_PER_NODE:,} (no node has more)"
FIELD_CONVERTERS: dict[str, Converter] = {
    "name": _name,
    "command": _command,
    "entrypoint": _import_string,
    "slurm.nodes": bounded(as_int, 1, MAX_NODES, _NODES_HINT),
    "slurm.min_nodes": bounded(
        as_int, 1, MAX_NODES, f"null (the default) asks for exactly slurm.nodes; else {_NODES_HINT}"
    ),
    "slurm.tasks_per_node": bounded(as_int, 1, MAX_PER_NODE, _PER_NODE_HINT),
    "slurm.cpus_per_task": bounded(as_int, 1, MAX_PER_NODE, _PER_NODE_HINT),
    "slurm.gpus_per_task": bounded(as_int, 1, MAX_PER_NODE, f"{_GPUS_HINT}; else {_PER_NODE_HINT}"),
    "slurm.gpus_per_node": bounded(as_int, 1, MAX_PER_NODE, f"{_GPUS_HINT}; else {_PER_NODE_HINT}"),
    "slurm.time": _time,
    "slurm.mem": _mem,
    "slurm.extra": extra_flags,
    "slurm.srun_args": _srun_args,
    "env.container.python": _container_python,
    "env.vars": env_vars,
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
    "train.checkpoint_every": _checkpoint_every,
    "train.checkpoint_min_s": bounded(as_float, 0, hint="0 (the default) sets no minimum"),
    "train.checkpoint_max_s": bounded(as_float, 1, hint="3600 (the default) saves hourly at most"),
    "train.keep_last": bounded(as_int, 1, hint="keep at least the newest checkpoint"),
    "train.keep_best.metric": _metric_name,
    "train.eval_every": bounded(as_int, 0, hint="0 never evaluates during training"),
    "train.log_every": bounded(as_int, 1),
    "train.num_workers": _num_workers,
    "requeue.signal": _signal,
    # sbatch --signal=SIG@TIME takes 0..65535 seconds.
    "requeue.lead_time": _lead_time,
    "requeue.max_requeues": bounded(as_int, 0),
    "slurm.spare_nodes": bounded(as_int, 0, MAX_NODES, "0 runs without spare nodes"),
    "fault.beat_s": bounded(as_float, 0.1, 60, "beat every 0.1 to 60 s (1 is the default)"),
    "fault.stale_s": bounded(as_float, 0.3),
    "fault.startup_stale_s": bounded(as_float, 0.3),
    "fault.startup_timeout_s": bounded(as_int, 1),
    "fault.step_timeout_s": bounded(as_int, 1),
    "fault.step_timeout_factor": bounded(as_float, 1, hint="use 1 or more (10 is the default)"),
    "fault.warmup_steps": bounded(as_int, 0),
    "fault.checkpoint_timeout_s": bounded(as_int, 1),
    "fault.max_restarts": bounded(as_int, 0, hint="0 never restarts in the job"),
    "fault.no_progress_limit": bounded(as_int, 0, hint="0 never stops for a crash loop"),
    "fault.standby_after_s": bounded(as_float, 0, hint="0 starts the standby at the first step"),
    "fault.lemon_window_days": bounded(
        as_float, 0.01, 365, "count a node's faults for 0.01 to 365 days (7 is the default)"
    ),
    "params": as_params,
}
"""Converters for keys whose rules go beyond their type hint, by dotted key."""
