"""The suite's own state directories: nothing a test starts writes to the developer's
``~/.local/state/hpc-ddp`` (save times, lemon records), a module-scoped fixture's job included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def state_seen_by_a_module_fixture() -> str | None:
    """What a twin's job, submitted from a module-scoped fixture, inherits."""
    return os.environ.get("XDG_STATE_HOME")


def test_a_module_fixture_runs_under_the_suites_state_dir(
    state_seen_by_a_module_fixture: str | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert state_seen_by_a_module_fixture is not None
    base = tmp_path_factory.getbasetemp()
    assert Path(state_seen_by_a_module_fixture).is_relative_to(base)


def test_a_test_runs_under_a_state_dir_of_its_own(
    state_seen_by_a_module_fixture: str | None,
) -> None:
    mine = os.environ.get("XDG_STATE_HOME")
    assert mine is not None
    assert mine != state_seen_by_a_module_fixture
