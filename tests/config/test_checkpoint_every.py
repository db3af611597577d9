"""``train.checkpoint_every: auto`` and its bounds (``checkpoint_min_s``/``checkpoint_max_s``)."""

from __future__ import annotations

from typing import Any

import pytest

from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.errors import ConfigError


def _train(**train: Any) -> Any:
    return job_config_from_dict({"name": "a", "train": train}, "config.yaml").train


def test_auto_and_step_counts_are_accepted_with_bounds_under_auto() -> None:
    t = _train(checkpoint_every="auto", checkpoint_min_s=30, checkpoint_max_s=600.5)
    assert (t.checkpoint_every, t.checkpoint_min_s, t.checkpoint_max_s) == ("auto", 30.0, 600.5)
    assert _train(checkpoint_every=0).checkpoint_every == 0
    assert _train().checkpoint_every == 100


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"checkpoint_every": "sometimes"}, r"neither a number of steps nor auto\. HINT"),
        ({"checkpoint_every": -1}, r"HINT"),
        ({"checkpoint_every": "auto", "checkpoint_min_s": -1}, r"checkpoint_min_s.*HINT"),
        ({"checkpoint_every": "auto", "checkpoint_max_s": 0}, r"checkpoint_max_s.*HINT"),
        (
            {"checkpoint_every": "auto", "checkpoint_min_s": 900, "checkpoint_max_s": 600},
            r"checkpoint_min_s.*more than train\.checkpoint_max_s.*HINT",
        ),
        (
            {"checkpoint_every": 50, "checkpoint_max_s": 600},
            r"checkpoint_max_s.*not auto.*HINT: set train\.checkpoint_every: auto",
        ),
    ],
)
def test_bad_values_are_refused_with_a_hint(train: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _train(**train)
