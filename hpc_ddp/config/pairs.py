"""The free-name mappings of a job config, ``slurm.extra`` (sbatch flags) and ``env.vars``
(environment variables): held by the dataclasses as (name, value) pairs.

Names that hpc-ddp sets itself are refused, with where to set the effect instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hpc_ddp.config.values import MAX_NAME_CHARS, Invalid, check_chars, describe, short_repr

PAIR_KEYS = frozenset({"slurm.extra", "env.vars"})
"""Keys written as a mapping of free names, held by the dataclass as (name, value) pairs."""

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
# sbatch would submit there, but squeue, scontrol (requeue), scancel and sacct would look on
# the local cluster: status, cancel and the requeue would act on the wrong job or none. The same
# refusal for every way of naming another cluster: --clusters (-M) in slurm.extra or
# slurm.srun_args, SLURM_CLUSTERS or SBATCH_CLUSTERS in env.vars or the submitting environment.
CLUSTERS_REFUSAL = (
    "submits to another cluster, and hpc-ddp does not carry the cluster to squeue, "
    "scontrol, scancel and sacct: status, cancel and the requeue would look on this one. "
    "HINT: multi-cluster is not supported yet: leave it out and submit from a login node "
    "of that cluster"
)
"""Why naming another cluster (``--clusters``, ``-M``, ``SLURM_CLUSTERS``, ...) is refused."""
CLUSTERS_VARS = ("SLURM_CLUSTERS", "SBATCH_CLUSTERS")
"""The environment variables that name Slurm's cluster (squeue, scontrol...; sbatch)."""
# sbatch flags hpc-ddp does not support yet: flag -> why, and what to do instead.
_UNSUPPORTED_FLAGS = {"clusters": CLUSTERS_REFUSAL}
# Real sbatch flags that happen to be prefixes of a controlled one.
_PREFIX_FLAGS = frozenset({"gpus"})
# sbatch accepts unambiguous abbreviations (--outp is --output): every prefix -> its flag.
_REFUSED_FLAGS = (*_CONTROLLED_FLAGS, *_UNSUPPORTED_FLAGS)
_FLAG_OWNERS = {flag[:i]: flag for flag in _REFUSED_FLAGS for i in range(1, len(flag))}
_FLAG_OWNERS.update({flag: flag for flag in _REFUSED_FLAGS})
for _flag in _PREFIX_FLAGS:
    _FLAG_OWNERS.pop(_flag, None)
# Compiled at first use (re caches them): most jobs set neither mapping.
_FLAG = r"[a-z][a-z0-9-]*"
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
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


def extra_flags(value: Any, key: str) -> tuple[tuple[str, str | None], ...]:
    out = []
    for flag, flag_value in _pairs(value, key).items():
        _check_name_length(flag, key)
        where = f"{key}.{flag}"
        if not isinstance(flag, str) or not re.fullmatch(_FLAG, flag):
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
            if owner in _UNSUPPORTED_FLAGS:
                raise Invalid(where, f"{short}--{owner} {_UNSUPPORTED_FLAGS[owner]}")
            raise Invalid(
                where,
                f"{short}--{owner} is set by hpc-ddp itself. HINT: {_CONTROLLED_FLAGS[owner]}",
            )
        out.append((flag, _mapping_value(flag_value, where, allow_none=True)))
    return tuple(out)


def env_vars(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    out = []
    for name, var_value in _pairs(value, key).items():
        _check_name_length(name, key)
        where = f"{key}.{name}"
        if not isinstance(name, str) or not re.fullmatch(_ENV_NAME, name):
            raise Invalid(
                where,
                f"{short_repr(name)} is not a valid environment variable name. HINT: use "
                "letters, digits and '_', not starting with a digit",
            )
        if name in CLUSTERS_VARS:
            raise Invalid(where, f"{name} {CLUSTERS_REFUSAL}")
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
