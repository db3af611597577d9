"""``requeue.lead_time: auto``: the sizing rule (a table), the save-time history's text, and
the config key that takes ``auto``."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ddp.config.leadtime import (
    MAX_LEAD_S,
    MIN_LEAD_S,
    PRIOR_LEAD_S,
    RECENT,
    SaveEntry,
    choose_lead_time,
    history_saves,
    parse_save_history,
    render_save_history,
)
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import RequeueConfig
from hpc_ddp.errors import ConfigError

HOUR = 3600.0

RULE: list[tuple[list[float], float | None, int, str, str | None]] = [
    # (W of the saves, time limit, lead chosen, source, bound)
    ([], HOUR, PRIOR_LEAD_S, "prior", None),
    ([], None, PRIOR_LEAD_S, "prior", None),
    ([], 180.0, 90, "prior", "slurm.time"),  # the prior never above half the time limit
    ([0.4], HOUR, 31, "history", None),  # 2 x 15.4, rounded up
    ([0.0], HOUR, MIN_LEAD_S, "history", None),  # the stop alone: the floor
    ([20.0], HOUR, 70, "history", None),  # 2 x (20 + 15)
    ([1.0, 20.0, 3.0], HOUR, 70, "history", None),  # the slowest decides
    ([20.0] + [1.0] * RECENT, HOUR, 32, "history", None),  # only the newest RECENT count
    ([2000.0], 100 * HOUR, MAX_LEAD_S, "history", "max"),
    ([100.0], 300.0, 150, "history", "slurm.time"),
    ([float("nan"), -1.0, 10.0], HOUR, 50, "history", None),  # nonsense left out
]


@pytest.mark.parametrize(("saves", "limit", "lead", "source", "bound"), RULE)
def test_lead_time_rule(
    saves: list[float], limit: float | None, lead: int, source: str, bound: str | None
) -> None:
    chosen = choose_lead_time(saves, time_limit_s=limit)
    assert (chosen.seconds, chosen.source, chosen.bound) == (lead, source, bound)
    assert "requeue.lead_time auto" in chosen.describe()


def test_describe_says_where_it_came_from() -> None:
    assert "prior" in choose_lead_time([], time_limit_s=HOUR).describe()
    words = choose_lead_time([5.0, 20.0], time_limit_s=HOUR).describe()
    assert "70 s" in words
    assert "slowest save 20.0 s" in words
    assert "2 save(s)" in words


def test_history_round_trip_and_choice_by_name() -> None:
    runs = {"a": SaveEntry("big", (30.0,), 100.0), "b": SaveEntry("small", (1.0,), 200.0)}
    text = render_save_history(runs, "c", SaveEntry("big", (10.0, 12.0), 300.0))
    back, warning = parse_save_history(text)
    assert warning is None
    assert set(back) == {"a", "b", "c"}
    assert history_saves(back, name="big", now=400.0) == [30.0, 10.0, 12.0]
    assert history_saves(back, name="new", now=400.0) == [30.0, 1.0, 10.0, 12.0]
    assert history_saves(back, name="big", now=400.0 + 40 * 86400) == []


@pytest.mark.parametrize(
    ("text", "entries", "fragment"),
    [
        ("", 0, None),
        ("{", 0, "not JSON"),
        ('{"runs": 3}', 0, "no 'runs'"),
        ('{"runs": {"a": {"name": "x", "durable_s": [1], "updated": 1}, "b": 7}}', 1, "1 damaged"),
        ('{"runs": {"a": {"name": "x", "durable_s": ["NaN"], "updated": 1}}}', 0, "damaged"),
    ],
)
def test_damaged_history_is_a_warning(text: str, entries: int, fragment: str | None) -> None:
    runs, warning = parse_save_history(text)
    assert len(runs) == entries
    assert (warning is None) if fragment is None else (fragment in (warning or ""))


def _load(requeue: dict[str, Any], time: str = "01:00:00") -> Any:
    return job_config_from_dict({"name": "j", "slurm": {"time": time}, "requeue": requeue}, "x")


def test_auto_is_accepted_and_reads_as_the_prior_until_resolved() -> None:
    cfg = _load({"lead_time": "auto"})
    assert cfg.requeue.lead_time == "auto"
    assert cfg.requeue.lead_s == PRIOR_LEAD_S
    assert RequeueConfig(lead_time=60).lead_s == 60
    # A short job is no error under auto: the choice is capped at half its time.
    assert _load({"lead_time": "auto"}, time="00:01:00").requeue.lead_time == "auto"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("Auto", "neither a number of seconds nor auto"),
        ("2min", "HINT: write auto"),
        (0, "between 1 and 65535"),
        (70000, "between 1 and 65535"),
    ],
)
def test_bad_lead_time_has_a_hint(value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load({"lead_time": value})
    message = str(info.value)
    assert "requeue.lead_time" in message
    assert "HINT:" in message
    assert fragment in message


def test_a_misspelt_key_is_still_suggested() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'requeue\.lead_time'"):
        _load({"lead_tim": "auto"})
