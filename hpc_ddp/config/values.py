"""Converters for one config value: type checks, ranges and choices, with a fix in every message.

A converter takes the raw value read from YAML and its dotted key, and returns the value the
config dataclass holds, or raises :class:`Invalid`. The loader adds the file or override the
value came from, so these messages name only the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from hpc_ddp.config.yaml_dialect import MAX_SCALAR_CHARS

SHOWN_CHARS = 60
"""How much of a long bad value an error message quotes."""
MAX_NAME_CHARS = 128
"""A name (job, sbatch flag, environment variable, param) is at most 128 characters. A job
name starts the run directory's name (``<name>-<YYYYmmdd-HHMMSS>[-N]``, which a file system
caps at 255 bytes) and a sweep point's name (``<name>-<index>``), and Slurm shows it in every
listing; no flag or variable has so long a name."""


class Invalid(Exception):
    """A value is wrong; ``text`` is "problem. HINT: fix". Callers add the source."""

    def __init__(self, key: str, text: str) -> None:
        super().__init__(f"{key}: {text}")
        self.key = key
        self.text = text


Converter = Callable[[Any, str], Any]
"""(raw value, dotted key) -> converted value, or raises :class:`Invalid`."""

_YAML_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def short_repr(value: Any) -> str:
    """``repr(value)``, cut short for a long string (an error message quotes, never floods)."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value):,} characters)"
    return repr(value)


def describe(value: Any) -> str:
    """How a bad value is named in a message: its YAML type and the value itself."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{_YAML_TYPES.get(type(value), type(value).__name__)} {short_repr(value)}"


def check_chars(value: str, key: str) -> str:
    """Refuse line breaks, NUL and values over :data:`MAX_SCALAR_CHARS` characters: every
    value ends up on one line of the sbatch script."""
    if len(value) > MAX_SCALAR_CHARS:
        raise Invalid(
            key,
            f"{short_repr(value)} is over hpc-ddp's limit of {MAX_SCALAR_CHARS:,} characters "
            "for one value. HINT: values go into the generated sbatch script; keep large data "
            "in a file and give its path",
        )
    if "\n" in value or "\r" in value or "\x00" in value:
        raise Invalid(
            key,
            f"{value[:40]!r} contains a line break or NUL character. HINT: write it on one "
            "line; values go into the generated sbatch script, one line each",
        )
    return value


def as_str(value: Any, key: str) -> str:
    """A non-empty one-line string."""
    if not isinstance(value, str):
        hint = "quote it" if isinstance(value, (bool, int, float)) else "write a single string"
        raise Invalid(key, f"expected a string, got {describe(value)}. HINT: {hint}")
    if not value:
        raise Invalid(key, "is an empty string. HINT: leave the key out (or null) for the default")
    return check_chars(value, key)


def as_int(value: Any, key: str) -> int:
    """An integer (not a bool, not a float, not a quoted number)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        hint = f"write it without a decimal point: {int(value)}"
    elif isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+", value.strip()):
        hint = f"remove the quotes: {value.strip()}"
    else:
        hint = "write a whole number"
    raise Invalid(key, f"expected an integer, got {describe(value)}. HINT: {hint}")


def as_float(value: Any, key: str) -> float:
    """A finite number; an integer is accepted and returned as a float."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise Invalid(key, f"must be a finite number, got {value!r}. HINT: write a number")
        return float(value)
    hint = "write a number such as 0.1 or 1e-3"
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None and not math.isfinite(number):
            # `nan`, `inf`: strings to YAML 1.2, floats to Python. There were no quotes.
            raise Invalid(key, f"must be a finite number, got {value.strip()!r}. HINT: {hint}")
        if number is not None and _reads_as_number(value.strip()):
            hint = f"remove the quotes: {value.strip()}"  # unquoted, it would have been one
        elif number is not None:
            hint = f"write it as a plain number: {number!r}"  # `1_000`: Python's, not YAML's
    raise Invalid(key, f"expected a number, got {describe(value)}. HINT: {hint}")


def _reads_as_number(text: str) -> bool:
    """True when ``text``, written unquoted, is a number in hpc-ddp's YAML dialect: a string
    value like that was quoted."""
    import yaml

    from hpc_ddp.config.yaml_dialect import load_yaml_value

    try:
        value = load_yaml_value(text)
    except yaml.YAMLError:
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_bool(value: Any, key: str) -> bool:
    """A YAML 1.2 boolean (``true``/``false``)."""
    if isinstance(value, bool):
        return value
    hint = "write true or false"
    if isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        hint += f" (hpc-ddp reads YAML 1.2, where {value!r} is a string)"
    raise Invalid(key, f"expected true or false, got {describe(value)}. HINT: {hint}")


def one_of(choices: tuple[str, ...]) -> Converter:
    """A converter accepting exactly one of ``choices``, with a did-you-mean hint."""

    def convert(value: Any, key: str) -> str:
        if isinstance(value, str) and value in choices:
            return value
        probe = str(value)[:SHOWN_CHARS] if isinstance(value, (str, int, float)) else ""
        import difflib  # only for a bad value: a submit that is right never pays for it

        close = difflib.get_close_matches(probe, choices, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "use one of those"
        raise Invalid(key, f"{describe(value)} is not one of: {', '.join(choices)}. HINT: {hint}")

    return convert


def as_str_list(value: Any, key: str) -> tuple[str, ...]:
    """A list of one-line strings, as a tuple."""
    if isinstance(value, str):
        raise Invalid(
            key, f"expected a list of strings, got {describe(value)}. HINT: write [{value}]"
        )
    if not isinstance(value, (list, tuple)):
        raise Invalid(key, f"expected a list of strings, got {describe(value)}")
    return tuple(as_str(item, f"{key}[{i}]") for i, item in enumerate(value))


def optional(conv: Converter) -> Converter:
    """``conv``, letting ``None`` (YAML null) through."""

    def convert(value: Any, key: str) -> Any:
        return None if value is None else conv(value, key)

    return convert


INT_CEILING = 2**31 - 1
"""The largest integer a field without a range of its own takes: a C ``int``, what Slurm's and
most system interfaces' counts are. A value past it is a typo, never a plan."""


def bounded(conv: Converter, low: float, high: float | None = None, hint: str = "") -> Converter:
    """``conv``, then a range check (``high`` inclusive); ``hint`` replaces the default fix.
    An integer without a ``high`` is still at most :data:`INT_CEILING`."""

    def convert(value: Any, key: str) -> Any:
        out = conv(value, key)
        ceiling = high is None and isinstance(out, int) and out > INT_CEILING
        if ceiling:
            raise Invalid(
                key,
                f"must be at most {INT_CEILING:,}, got {out!r}. HINT: no job needs a value "
                "this large; check for a typo",
            )
        if out is not None and (out < low or (high is not None and out > high)):
            want = f"between {low} and {high}" if high is not None else f"at least {low}"
            fix = hint or (f"use a value {want}" if high is not None else f"use {low} or more")
            raise Invalid(key, f"must be {want}, got {out!r}. HINT: {fix}")
        return out

    return convert


def positive(value: Any, key: str) -> float:
    """A number greater than 0."""
    out = as_float(value, key)
    if out <= 0:
        raise Invalid(key, f"must be greater than 0, got {out!r}. HINT: e.g. 0.1 or 1e-3")
    return out
