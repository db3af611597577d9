"""The free-form ``params:`` section: values of the user's own script, and ``{params.NAME}``
placeholders in a ``command``.

``params`` maps names to YAML scalars (integer, number, boolean, string, null) or to nested
mappings of the same, addressed with dots (``params.opt.lr``). Lists are refused: a list has
no single text to put into a command, and a sweep varies scalars. Unlike every other section,
any name is accepted: the section belongs to the user's script, which alone knows its names.

In a ``command`` item, ``{params.NAME}`` is replaced by the value's text (see
:func:`param_text`) within that one argv item: the command runs without a shell, so a value
never splits into several arguments and is never read as shell. ``{{params.NAME}}`` writes
``{params.NAME}`` literally; every other brace is left as written (``${HOME}``, JSON).

Pure: the standard library and the config's value helpers only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hpc_ddp.config.values import MAX_NAME_CHARS, Invalid, check_chars, describe, short_repr

TREE_KEYS = frozenset({"params"})
"""Keys whose sub-keys are free names, any depth (``params.opt.lr``), unlike the schema's."""

_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"  # compiled at first use (re caches it): few jobs have params
# An escaped placeholder, a placeholder, or the start of a malformed one.
_PLACEHOLDER = r"\{\{params\.([^{}]*)\}\}|\{params\.([^{}]*)\}|\{params\."


class Params(Mapping[str, object]):
    """A read-only, hashable mapping of param names to scalars or nested :class:`Params`.

    Equal to a plain ``dict`` with the same items, so ``cfg.params == {"lr": 0.1}`` holds.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, object] | None = None) -> None:
        self._data: dict[str, object] = dict(data or {})

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        # JobConfig is a frozen dataclass and hashes its fields; a dict could not be hashed.
        return hash(tuple(self._data.items()))

    def __repr__(self) -> str:
        return f"Params({self._data!r})"

    def flat(self) -> dict[str, object]:
        """Every scalar under its dotted name (``{"opt.lr": 0.1}``), in file order."""
        out: dict[str, object] = {}
        for name, value in self._data.items():
            if isinstance(value, Params):
                out.update({f"{name}.{k}": v for k, v in value.flat().items()})
            else:
                out[name] = value
        return out


def as_params(value: Any, key: str) -> Params:
    """The converter of ``params`` (and of each nested mapping under it)."""
    if value is None:
        return Params()
    if not isinstance(value, Mapping):
        raise Invalid(
            key,
            f"expected a mapping of names to values, got {describe(value)}. HINT: e.g. "
            "params: {lr: 0.1, depth: 4}",
        )
    out: dict[str, object] = {}
    for name, item in value.items():
        _check_name(name, key)
        out[name] = _param_value(item, f"{key}.{name}")
    return Params(out)


def _check_name(name: Any, key: str) -> None:
    if isinstance(name, str) and len(name) > MAX_NAME_CHARS:
        raise Invalid(
            key,
            f"the name {short_repr(name)} is over hpc-ddp's limit of {MAX_NAME_CHARS} "
            "characters for a param name. HINT: shorten it",
        )
    if not isinstance(name, str) or not re.fullmatch(_NAME, name):
        raise Invalid(
            key,
            f"{short_repr(name)} is not a valid param name. HINT: use letters, digits, '_' and "
            "'-', starting with a letter or '_' (a dot nests: write a mapping or params.a.b)",
        )


def _param_value(value: Any, key: str) -> object:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid(key, f"must be a finite number, got {value!r}. HINT: write a number")
        return value
    if isinstance(value, str):
        return check_chars(value, key)
    if isinstance(value, Mapping):
        return as_params(value, key)
    raise Invalid(
        key,
        f"expected a number, string, boolean or null, got {describe(value)}. HINT: a param "
        "is one value (a sweep varies it); for several, use one name each (layers_1, layers_2) "
        "or a string your script splits ('64,128')",
    )


def param_text(value: object) -> str:
    """A param's text in a command: a string as is, anything else as YAML writes it
    (``true``, ``null``, ``0.001``)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)  # int, or the shortest text that reads back as the same float


def substitute(text: str, params: Params, key: str) -> str:
    """``text`` with each ``{params.NAME}`` replaced; raises :class:`Invalid` at ``key`` for a
    malformed placeholder or a name ``params`` does not define."""

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped is not None:
            return f"{{params.{escaped}}}"
        if name is None:
            raise Invalid(
                key,
                f"{short_repr(text)} has a '{{params.' with no closing '}}'. HINT: write "
                "{params.NAME}, or {{params.NAME}} for the literal text",
            )
        return param_text(_lookup(params, name, key))

    return re.sub(_PLACEHOLDER, replace, text)


def _lookup(params: Params, name: str, key: str) -> object:
    node: object = params
    for part in name.split("."):
        if not isinstance(node, Params) or part not in node:
            defined = ", ".join(f"params.{n}" for n in params.flat()) or "none"
            raise Invalid(
                key,
                f"{{params.{name}}} names a param that is not defined (defined: {defined}). "
                f"HINT: set params.{name} in the job file or as params.{name}=VALUE, or fix "
                "the name",
            )
        node = node[part]
    if isinstance(node, Params):
        inner = ", ".join(f"params.{name}.{n}" for n in node.flat()) or "none"
        raise Invalid(
            key,
            f"{{params.{name}}} is a mapping, not a value. HINT: name one of its values: {inner}",
        )
    return node


PYTHON_NAMES = frozenset({"python", "python3"})
"""A ``command`` whose first item is exactly one of these runs the task's own interpreter
(:func:`hpc_ddp.job.command.command_argv`); the login node's preflight does not look it up."""


def resolve_command(command: tuple[str, ...], params: Params) -> tuple[str, ...]:
    """``command`` with its placeholders substituted: the argv a command job runs."""
    return tuple(substitute(item, params, f"command[{i}]") for i, item in enumerate(command))
