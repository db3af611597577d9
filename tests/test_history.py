"""A user's history file read leniently (:mod:`hpc_ddp.history`)."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ddp.history import parse_runs


def _seconds(raw: Any) -> float | None:
    return float(raw["s"]) if isinstance(raw, dict) and "s" in raw else None


@pytest.mark.parametrize(
    ("text", "entries", "warning"),
    [
        ("", {}, None),
        ('{"version": 1, "runs": {"a": {"s": 2}, "b": {"s": "3"}}}', {"a": 2.0, "b": 3.0}, None),
        ('{"version": 1, "runs": {"a": {"s": 2}, "b": [], "c": {}}}', {"a": 2.0},
         "2 damaged entries skipped"),
        ('{"version": 1, "runs": {"a": 7}}', {}, "1 damaged entry skipped"),
        ('{"version": 1, "runs": [1]}', {}, "no 'runs' mapping; it is rewritten soon"),
        ("[]", {}, "no 'runs' mapping; it is rewritten soon"),
    ],
)  # fmt: skip
def test_what_can_be_read_is_kept_and_the_rest_is_said(
    text: str, entries: dict[str, float], warning: str | None
) -> None:
    assert parse_runs(text, _seconds, version=1, rewritten="soon") == (entries, warning)


def test_a_file_that_is_not_json_is_no_entries_and_a_warning() -> None:
    got, warning = parse_runs('{"runs": ', _seconds, version=1, rewritten="soon")
    assert got == {}
    assert warning is not None
    assert warning.startswith("not JSON (")
    assert warning.endswith("; it is rewritten soon")


def test_a_run_s_entry_is_replaced_and_only_the_newest_are_kept() -> None:
    from dataclasses import dataclass

    from hpc_ddp.history import render_runs

    @dataclass(frozen=True)
    class E:
        s: float
        updated: float

    def as_dict(e: E) -> dict[str, Any]:
        return {"s": e.s, "updated": e.updated}

    runs = {"a": E(1, 1.0), "b": E(2, 2.0), "c": E(3, 3.0)}
    text = render_runs(runs, "a", E(9, 4.0), as_dict, version=1, keep=2)
    assert parse_runs(text, _seconds, version=1, rewritten="soon") == ({"a": 9.0, "c": 3.0}, None)
