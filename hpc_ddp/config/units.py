"""Slurm's units: time limits and memory sizes, parsed strictly and formatted canonically.

Pure: no I/O. Errors are :class:`~hpc_ddp.errors.ConfigError` whose message names the bad value
and ends with a ``HINT:``; the config loader prefixes them with the file and key.
"""

from __future__ import annotations

import functools
import math
import re

from hpc_ddp.errors import ConfigError

TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
"""The time-limit forms sbatch accepts, as listed in error messages."""

_TIME_HINT = (
    f"HINT: use one of the forms sbatch accepts: {TIME_FORMS} "
    "(e.g. '90' for 90 minutes, '01:30:00', '2-00:00:00')"
)
# [0-9] rather than \d: \d also matches non-ASCII digits, which sbatch would refuse.
_DAYS_RE = re.compile(r"([0-9]+)-([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")
_CLOCK_RE = re.compile(r"([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")
_UNLIMITED = {"UNLIMITED", "INFINITE"}
_MAX_TEXT = 32
"""No valid time or memory size is longer (``365-00:00:00`` is 12); checked before any int()."""
MAX_TIME_MINUTES = 0xFFFFFFFD
"""Slurm keeps a time limit as 32-bit minutes, two of the values meaning infinite and unset."""
MAX_MEM_MB = 2**63 - 1
"""Slurm keeps a memory size as 64-bit megabytes, its top bit a flag."""

# The memory patterns are compiled at first use (re caches them): most jobs set no slurm.mem.
_MEM = r"([0-9]+)([KMGTkmgt]?)"
_MEM_FACTOR_MB = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
_MEM_HINT_FORMS = "an integer number of megabytes or an integer with K, M, G or T (e.g. 16G, 4000M)"
_MEM_WITH_B = r"([0-9]+)\s*([KMGTkmgt])i?[Bb]"
_MEM_FRACTION = r"([0-9]*\.[0-9]+)\s*([KMGTkmgt]?)"


@functools.lru_cache(maxsize=256)  # pure; a sweep checks the same limit for every point
def parse_slurm_time(text: str) -> int:
    """Parse a Slurm time limit into seconds.

    Accepts exactly the forms sbatch documents: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM`` and ``D-HH:MM:SS``. The leading field may be as large as you like (``90`` is
    90 minutes, ``36:00:00`` is 36 hours), but the fields after it must stay below 60 (24 for
    hours after a day count): sbatch would silently carry ``01:75:00`` over, which is almost
    always a typo. ``UNLIMITED``/``INFINITE`` and a zero limit are refused because hpc-ddp
    schedules its requeue signal relative to the time limit.
    """
    raw = text.strip()
    if len(raw) > _MAX_TEXT:
        raise ConfigError(f"invalid time limit {_short(text)}: far too long. {_TIME_HINT}")
    if raw.upper() in _UNLIMITED or raw == "-1":
        raise ConfigError(
            f"time limit {text!r} is unlimited; hpc-ddp needs a finite limit to send the "
            f"requeue signal ahead of it. {_TIME_HINT}"
        )
    days_match = _DAYS_RE.fullmatch(raw)
    clock_match = None if days_match else _CLOCK_RE.fullmatch(raw)
    if days_match:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in days_match.groups())
        _check_below(text, "hours", hours, 24)
        _check_below(text, "minutes", minutes, 60)
    elif clock_match:
        fields = [int(g) for g in clock_match.groups() if g is not None]
        days, hours = 0, 0
        if len(fields) == 1:
            minutes, seconds = fields[0], 0
        elif len(fields) == 2:
            minutes, seconds = fields
        else:
            hours, minutes, seconds = fields
            _check_below(text, "minutes", minutes, 60)
    else:
        raise ConfigError(f"invalid time limit {text!r}. {_TIME_HINT}")
    _check_below(text, "seconds", seconds, 60)
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total > MAX_TIME_MINUTES * 60:
        raise ConfigError(
            f"time limit {text!r} is longer than Slurm can hold ({MAX_TIME_MINUTES:,} minutes, "
            f"about 8,000 years). {_TIME_HINT}"
        )
    if total == 0:
        raise ConfigError(
            f"time limit {text!r} is zero, which Slurm reads as 'no limit'; hpc-ddp needs a "
            f"finite limit to send the requeue signal ahead of it. {_TIME_HINT}"
        )
    return total


def _check_below(text: str, what: str, value: int, bound: int) -> None:
    if value >= bound:
        raise ConfigError(
            f"invalid time limit {text!r}: {what} field is {value}, must be below {bound}. "
            f"{_TIME_HINT}"
        )


def format_slurm_time(seconds: int) -> str:
    """Format seconds as Slurm's canonical ``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day).

    ``parse_slurm_time(format_slurm_time(s)) == s`` for every ``s > 0``.
    """
    if seconds < 0:
        raise ValueError(f"a time limit cannot be negative, got {seconds}")
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_mem(text: str | int) -> int:
    """Parse a Slurm memory size into megabytes (Slurm's M, i.e. MiB).

    Accepts an integer (megabytes) or an integer followed by one of ``K``, ``M``, ``G``, ``T``
    in either case, as ``--mem`` does. ``K`` rounds up to whole megabytes, as Slurm does. Zero
    (in any unit) returns 0: ``--mem=0`` asks for all of the node's memory. Fractions
    (``1.5G``) and two-letter units (``16GB``) are refused: sbatch refuses or misreads them.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ConfigError(
            f"invalid memory size {text!r}: not a string or integer. HINT: use {_MEM_HINT_FORMS}"
        )
    raw = str(text).strip()
    if len(raw) > _MAX_TEXT:
        raise ConfigError(
            f"invalid memory size {_short(raw)}: far too long. HINT: use {_MEM_HINT_FORMS}"
        )
    if raw.startswith("-"):
        raise ConfigError(
            f"invalid memory size {text!r}: it is negative. HINT: use {_MEM_HINT_FORMS}"
        )
    match = re.fullmatch(_MEM, raw)
    if match is None:
        raise ConfigError(f"invalid memory size {text!r}. HINT: {_mem_fix(raw)}")
    number, unit = int(match.group(1)), match.group(2).upper()
    if number == 0:
        return 0  # --mem=0: all of the node's memory
    megabytes = max(1, math.ceil(number / 1024)) if unit == "K" else number * _MEM_FACTOR_MB[unit]
    if megabytes > MAX_MEM_MB:
        raise ConfigError(
            f"invalid memory size {text!r}: more than Slurm can hold ({MAX_MEM_MB:,} MB). "
            f"HINT: use {_MEM_HINT_FORMS}"
        )
    return megabytes


def _short(text: str) -> str:
    return f"{text[:_MAX_TEXT]!r}... ({len(text):,} characters)"


def _mem_fix(raw: str) -> str:
    if re.fullmatch(_MEM, "".join(raw.split())):
        return f"write it without spaces: '{''.join(raw.split())}'"
    with_b = re.fullmatch(_MEM_WITH_B, raw)
    if with_b:
        number, unit = with_b.groups()
        return f"Slurm's units are one letter and binary: write '{number}{unit.upper()}'"
    fraction = re.fullmatch(_MEM_FRACTION, raw)
    if fraction:
        value, unit = float(fraction.group(1)), fraction.group(2).upper()
        if unit in ("", "M"):
            return "Slurm takes whole numbers: round to a whole number of megabytes"
        smaller = {"K": "K", "G": "M", "T": "G"}[unit]
        scaled = value if unit == "K" else value * 1024
        return f"Slurm takes whole numbers: write '{math.ceil(scaled)}{smaller}'"
    return f"use {_MEM_HINT_FORMS}"
