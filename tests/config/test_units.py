"""Slurm time limits and memory sizes: every accepted form, and every refusal with its hint."""

from __future__ import annotations

import pytest

from hpc_ddp.config.units import format_slurm_time, parse_mem, parse_slurm_time
from hpc_ddp.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # MM
        ("90", 90 * 60),  # MM may exceed 59
        ("1440", 86400),
        ("5:30", 5 * 60 + 30),  # MM:SS
        ("90:00", 90 * 60),  # MM:SS, MM may exceed 59
        ("01:00:00", 3600),  # HH:MM:SS
        ("36:00:00", 36 * 3600),  # HH may exceed 23
        ("00:00:01", 1),
        ("2-0", 2 * 86400),  # D-HH
        ("1-12", 86400 + 12 * 3600),
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),  # D-HH:MM
        ("1-00:00:05", 86400 + 5),  # D-HH:MM:SS
        ("7-23:59:59", 7 * 86400 + 86399),
        ("  01:30:00 ", 5400),  # surrounding whitespace
    ],
)
def test_parse_slurm_time_accepts_every_sbatch_form(text: str, seconds: int) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("UNLIMITED", "unlimited"),
        ("infinite", "unlimited"),
        ("-1", "unlimited"),
        ("0", "zero"),
        ("00:00:00", "zero"),
        ("0-0", "zero"),
        ("01:75:00", "minutes field is 75"),
        ("1:60", "seconds field is 60"),
        ("01:00:60", "seconds field is 60"),
        ("1-24", "hours field is 24"),
        ("1-00:60", "minutes field is 60"),
        ("1-00:00:60", "seconds field is 60"),
        ("1:2:3:4", "invalid time limit"),
        ("1-2-3", "invalid time limit"),
        ("1-", "invalid time limit"),
        ("1h", "invalid time limit"),
        ("1.5", "invalid time limit"),
        ("", "invalid time limit"),
        ("-5", "invalid time limit"),
        ("\u0663", "invalid time limit"),  # an Arabic-Indic digit: not ASCII
    ],
)
def test_parse_slurm_time_refuses_with_the_accepted_forms(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_slurm_time(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message
    assert "HINT:" in message
    assert "D-HH:MM:SS" in message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "00:00:01"), (3600, "01:00:00"), (86399, "23:59:59"), (86400, "1-00:00:00"),
     (2 * 86400 + 3723, "2-01:02:03")],
)  # fmt: skip
def test_format_slurm_time_is_canonical(seconds: int, text: str) -> None:
    assert format_slurm_time(seconds) == text


@pytest.mark.parametrize("seconds", [1, 59, 60, 3599, 3600, 86399, 86400, 90061, 10 * 86400 + 7])
def test_format_then_parse_is_identity(seconds: int) -> None:
    assert parse_slurm_time(format_slurm_time(seconds)) == seconds


def test_format_slurm_time_refuses_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_slurm_time(-1)


@pytest.mark.parametrize(
    ("value", "megabytes"),
    [
        (4000, 4000),
        ("4000", 4000),
        ("4000M", 4000),
        ("4000m", 4000),
        ("16G", 16 * 1024),
        ("16g", 16 * 1024),
        ("1T", 1024 * 1024),
        ("2048K", 2),
        ("1025K", 2),  # K rounds up, as Slurm does
        ("1k", 1),
        (" 8G ", 8192),
        # 0 asks Slurm for all of the node's memory.
        ("0", 0),
        (0, 0),
        ("0G", 0),
    ],
)
def test_parse_mem_accepts_slurm_syntax(value: str | int, megabytes: int) -> None:
    assert parse_mem(value) == megabytes


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("16GB", "write '16G'"),
        ("16gb", "write '16G'"),
        ("16GiB", "write '16G'"),
        ("1.5G", "write '1536M'"),
        ("0.5T", "write '512G'"),
        ("1.5", "whole number"),
        ("-4G", "negative"),
        (-1, "negative"),
        ("16 G", "without spaces: '16G'"),
        ("lots", "integer number of megabytes"),
        ("", "integer number of megabytes"),
        ("16P", "integer number of megabytes"),
        (True, "not a string or integer"),
        (1.5, "not a string or integer"),
    ],
)
def test_parse_mem_refuses_with_a_fix(value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mem(value)  # type: ignore[arg-type]
    message = str(info.value)
    assert fragment in message
    assert "HINT:" in message
    assert repr(value) in message


@pytest.mark.parametrize(
    ("parse", "value", "fragment"),
    [
        (parse_slurm_time, "9" * 5000, "far too long"),  # int() itself refuses past 4300 digits
        (parse_slurm_time, "4294967294", "longer than Slurm can hold"),  # minutes: INFINITE - 1
        (parse_slurm_time, "99999999-00:00:00", "longer than Slurm can hold"),
        (parse_mem, "9" * 5000 + "G", "far too long"),
        (parse_mem, "9" * 25, "more than Slurm can hold"),
        (parse_mem, "99999999999999T", "more than Slurm can hold"),
    ],
)
def test_sizes_past_what_slurm_can_hold_are_refused(
    parse: object, value: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse(value)  # type: ignore[operator]
    message = str(info.value)
    assert fragment in message
    assert "HINT:" in message
    assert len(message) < 400  # a long value is quoted in part, not whole


def test_the_largest_values_slurm_can_hold_still_parse() -> None:
    assert parse_slurm_time("4294967293") == 4294967293 * 60
    assert parse_mem(str(2**63 - 1)) == 2**63 - 1
    with pytest.raises(ConfigError, match="more than Slurm can hold"):
        parse_mem(str(2**63))
