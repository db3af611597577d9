"""Load, layer, validate and dump job configs (:class:`~hpc_ddp.config.model.JobConfig`).

Layers, lowest first: the dataclass defaults, a site profile, the job file, then ``KEY=VALUE``
overrides from the command line. Mappings merge key by key; any other value (lists included)
from a later layer replaces the earlier one. Each layer is checked on its own (unknown keys,
types, ranges), so an error names the file or override it comes from; the merged result is then
checked as a whole (required keys, combinations).

Reading and writing YAML is :mod:`hpc_ddp.config.yaml_dialect` (YAML 1.2 core scalars,
duplicate keys refused); what each key accepts is :mod:`hpc_ddp.config.schema`. This module is
the public face: every loading entry point lives here.

Login-node side: imports only the standard library, PyYAML and the pure core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.pairs import PAIR_KEYS
from hpc_ddp.config.params import Params
from hpc_ddp.config.schema import KEY_KINDS, Memo, check_layer, unknown_key, validate_job_config
from hpc_ddp.config.values import short_repr
from hpc_ddp.config.yaml_dialect import (
    YamlLimitError,
    dump_yaml,
    load_yaml_value,
    read_yaml,
)
from hpc_ddp.errors import ConfigError, OverrideError, RunDirError

SITE_ENV = "HPC_DDP_SITE"
"""Environment variable naming the site profile (after ``--site``, before the default path):
config's own, read on the login side only, so not part of the run directory's contract
(:mod:`hpc_ddp.rundir.layout`)."""
SITE_DEFAULT = Path(".config", "hpc-ddp", "site.yaml")
"""The site profile looked for under the home directory when none is named."""


def job_config_from_dict(
    data: Mapping[str, Any], source: str, *, placeholders: bool = True
) -> JobConfig:
    """Validate a merged plain mapping into a :class:`JobConfig`; ``source`` labels errors.

    ``placeholders=False`` does not require the params that ``command`` names (a sweep's base).
    """
    return validate_job_config(data, source, None, placeholders)


def job_configs_from_dicts(items: Iterable[tuple[Mapping[str, Any], str]]) -> list[JobConfig]:
    """:func:`job_config_from_dict` over many (mapping, source) pairs, e.g. sweep points.

    Sections shared between the mappings as the same object (as :func:`with_value` leaves
    them) are converted once; every config is still checked as a whole.
    """
    memo: Memo = {}
    return [validate_job_config(data, source, memo) for data, source in items]


def split_key(key: str, source: str, error: type[ConfigError] = ConfigError) -> tuple[str, ...]:
    """Check a dotted key against the schema and split it (``env.vars.A`` -> env, vars, A).

    An unknown key raises ``error`` naming ``source`` with a did-you-mean hint; under
    ``params`` any name goes (``params.opt.lr`` -> params, opt, lr): the section is free-form.
    """
    parts = key.split(".")
    if not all(parts):
        raise error(
            f"{source}: {short_repr(key)} is not a dotted key. HINT: write it like train.lr"
        )
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        kind = KEY_KINDS.get(prefix)
        if kind is None:
            exc = unknown_key(prefix)
            raise error(f"{source}: {exc.key}: {exc.text}")
        if kind == "tree":
            return tuple(parts)
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
        source = f"override {short_repr(text)}"
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OverrideError(
                f"{source}: expected KEY=VALUE. HINT: e.g. train.lr=0.05 or slurm.nodes=2"
            )
        path = split_key(key, source, OverrideError)
        if any(c in raw for c in "\n\r\0"):
            # YAML would fold the line break into a space (a changed value, unseen) and the
            # command line that carries it would reach the script's header comment.
            raise OverrideError(
                f"{source}: {key}: the value {short_repr(raw)} contains a line break or NUL. "
                "HINT: an override is one line; write a list or mapping in flow style "
                "(key='[a, b]'), or put the value in the job file."
            )
        try:
            value = load_yaml_value(raw)
        except YamlLimitError as exc:
            raise OverrideError(f"{source}: {key}: {exc.problem}. HINT: {exc.hint}") from None
        except yaml.YAMLError:
            raise OverrideError(
                f"{source}: {key}: cannot read {short_repr(raw)} as a YAML value. HINT: quote "
                "the value for the shell and for YAML, e.g. key='\"a: b\"'"
            ) from None
        check_layer(with_value({}, path, value), source, OverrideError)
        out = with_value(out, path, value)
    return out


def find_site_profile(explicit: str | None, env: Mapping[str, str], home: Path) -> Path | None:
    """The site profile to use: ``explicit`` (``--site``), else ``$HPC_DDP_SITE``, else
    ``$XDG_CONFIG_HOME/hpc-ddp/site.yaml`` (``home/.config/hpc-ddp/site.yaml`` when
    ``XDG_CONFIG_HOME`` is unset, empty or relative, as the XDG spec says) if it exists, else
    ``None``.

    A named profile (option or variable) that does not exist is a :class:`ConfigError`.
    """
    for text, origin in ((explicit, "--site"), (env.get(SITE_ENV), f"${SITE_ENV}")):
        if text:
            path = home / text[2:] if text == "~" or text.startswith("~/") else Path(text)
            if not path.is_file():
                raise ConfigError(
                    f"{origin}: site profile {text!r} does not exist. HINT: fix the path, or "
                    f"unset {origin} to use {default_site_profile(env, home)} if present"
                )
            return path
    default = default_site_profile(env, home)
    return default if default.is_file() else None


def default_site_profile(env: Mapping[str, str], home: Path) -> Path:
    """Where the site profile lives when none is named (XDG base directory spec)."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg, *SITE_DEFAULT.parts[1:])
    return home / SITE_DEFAULT


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
        data = check_layer({} if site is None else site, str(site_profile))
    if isinstance(job, Path):
        raw = read_yaml(job)
        if raw is None:
            raise ConfigError(f"{job}: the job file is empty. HINT: start it with 'name: my-job'")
        layer = check_layer(raw, str(job))
    else:
        layer = check_layer(job, source or "inline config")
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
    out: dict[str, Any] = to_plain(cfg, "")
    return out


def to_plain(value: Any, key: str) -> Any:
    """``value`` (a config dataclass or field at dotted ``key``) as plain YAML-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        prefix = f"{key}." if key else ""
        return {
            f.name: to_plain(getattr(value, f.name), f"{prefix}{f.name}")
            for f in dataclasses.fields(value)
        }
    if key in PAIR_KEYS:
        return dict(value)
    if isinstance(value, Params):
        return {name: to_plain(item, f"{key}.{name}") for name, item in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


def dump_job_config(cfg: JobConfig) -> str:
    """The resolved config as YAML text (what ``RUN_DIR/config.yaml`` holds)."""
    return dump_yaml(to_plain(cfg, ""))


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
