"""The API's arguments as the command line gives them: a path (``runs_dir``, ``site``, a job
file) and the dotted overrides (``{"train.lr": 0.1}`` or ``["train.lr=0.1"]``).

What every API function checks of its arguments before it reads anything; light on purpose, as
``submit --dry-run`` loads it (JSON and YAML are imported only for a mapping's values).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from hpc_ddp.errors import OverrideError

Overrides = Mapping[str, Any] | Sequence[str]
"""Dotted overrides: ``{"train.lr": 0.1}`` (values as Python data), or ``["train.lr=0.1"]`` as
on the command line (values read as YAML)."""

_PATH_EXAMPLES = {"config": "jobs/train.yaml", "sweep_file": "sweeps/lr.yaml", "site": "site.yaml"}


def path_arg(name: str, value: object) -> str | None:
    """An API argument that names a path (``runs_dir``, ``site``, a job file), as text; None
    stays None. Anything but a ``str`` or an ``os.PathLike`` is a :class:`TypeError` naming
    it, never a path made of its text (``runs_dir=123`` used to create ``./123/``)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        text = os.fspath(value)
        if isinstance(text, str):
            return text
    example = _PATH_EXAMPLES.get(name, "runs")
    raise TypeError(
        f"{name}={value!r}: expected a path (a str or os.PathLike), not "
        f"{type(value).__name__}. HINT: pass a path such as {name}={example!r} or "
        f"{name}=pathlib.Path({example!r})."
    )


def override_args(overrides: Overrides) -> list[str]:
    """``KEY=VALUE`` strings for ``overrides``: a mapping's values are written so that the
    config reader reads back the same value (``0.1``, ``"a: b"``, ``[1, 2]``, None): a string
    that reads back as itself as it is, anything else as JSON.

    A bare string is refused (it would be read as its characters), and so is a value JSON
    cannot hold (an infinity, an object): :class:`OverrideError` naming the key.
    """
    if isinstance(overrides, str):
        raise OverrideError(
            f"overrides {overrides!r}: a single string, not a list or mapping. HINT: pass "
            f"[{overrides!r}], or a mapping such as {{'train.lr': 0.1}}."
        )
    if not isinstance(overrides, Mapping):
        return [str(o) for o in overrides]
    return [f"{key}={_value_text(key, value)}" for key, value in overrides.items()]


def _value_text(key: str, value: Any) -> str:
    """``value`` as the text of an override: a string the config reader reads back as itself
    as it is (so that messages quote ``slurm.time=25:99`` as the CLI does), else JSON."""
    import json

    import yaml

    from hpc_ddp.config.yaml_dialect import load_yaml_value

    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    plain = isinstance(value, str) and value.strip() == value
    if plain and not any(c in value for c in "\n\r\0"):
        try:
            if load_yaml_value(value) == value:
                return str(value)
        except (yaml.YAMLError, ValueError):  # not YAML as it is: written as JSON below
            pass
    try:
        return json.dumps(value, allow_nan=False, default=_path_text)
    except (TypeError, ValueError) as exc:
        raise OverrideError(
            f"override {key!r}: {value!r} cannot be a config value ({exc}). HINT: use a "
            "number, string, bool, None, or a list or mapping of those."
        ) from None


def _path_text(value: object) -> str:
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    raise TypeError(f"{type(value).__name__} is not a config value")
