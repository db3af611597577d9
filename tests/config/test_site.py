"""Which site profile applies when none is named: $HPC_DDP_SITE, then the XDG config dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.config.load import find_site_profile
from hpc_ddp.errors import ConfigError


def _profile(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("slurm:\n  partition: gpu\n")
    return path


def test_xdg_config_home_is_honoured(tmp_path: Path) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    _profile(home / ".config" / "hpc-ddp" / "site.yaml")
    mine = _profile(xdg / "hpc-ddp" / "site.yaml")
    assert find_site_profile(None, {"XDG_CONFIG_HOME": str(xdg)}, home) == mine


@pytest.mark.parametrize("xdg", ["", "relative/dir"])
def test_unset_empty_or_relative_xdg_falls_back_to_home_config(tmp_path: Path, xdg: str) -> None:
    home = tmp_path / "home"
    default = _profile(home / ".config" / "hpc-ddp" / "site.yaml")
    assert find_site_profile(None, {"XDG_CONFIG_HOME": xdg}, home) == default
    assert find_site_profile(None, {}, home) == default


def test_no_profile_anywhere_is_none(tmp_path: Path) -> None:
    assert find_site_profile(None, {"XDG_CONFIG_HOME": str(tmp_path / "x")}, tmp_path) is None


def test_named_profile_wins_and_a_missing_one_says_where_the_default_is(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    _profile(xdg / "hpc-ddp" / "site.yaml")
    named = _profile(tmp_path / "cluster.yaml")
    env = {"XDG_CONFIG_HOME": str(xdg), "HPC_DDP_SITE": str(named)}
    assert find_site_profile(None, env, tmp_path) == named
    with pytest.raises(ConfigError, match="HINT: fix the path") as err:
        find_site_profile(str(tmp_path / "nope.yaml"), env, tmp_path)
    assert str(xdg / "hpc-ddp" / "site.yaml") in str(err.value)
