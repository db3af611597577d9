"""Node lists (Slurm's hostlist form, read by every backend), by table and against Slurm's own
parser."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpc_ddp.backends.nodelist import MAX_NAMES, parse_nodelist
from hpc_ddp.errors import DistEnvError

VALID = [
    ("n1", ["n1"]),
    ("  n1\n", ["n1"]),
    ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
    ("gpu-[01-04]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
    ("n[9-10]", ["n9", "n10"]),
    ("n[09-10]", ["n09", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("a[1-2],b3,c[05-06]", ["a1", "a2", "b3", "c05", "c06"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("n[3,1-2]", ["n3", "n1", "n2"]),
    ("n[1-2],n1", ["n1", "n2", "n1"]),
    ("n1 n2", ["n1", "n2"]),
    ("a,,b", ["a", "b"]),
    ("[1-2]", ["1", "2"]),
    ("node.example.org", ["node.example.org"]),
    ("127.0.0.1", ["127.0.0.1"]),
    ("n[5]", ["n5"]),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parse_nodelist_expands(text: str, expected: list[str]) -> None:
    assert parse_nodelist(text) == expected


INVALID = [
    ("", "empty"),
    ("   ", "empty"),
    (",", "names no node"),
    ("n[1-2", "'[' without ']'"),
    ("n1-2]", "']' without '['"),
    ("n[[1-2]]", "nested"),
    ("n[]", "not a number"),
    ("n[a]", "not a number"),
    ("n[1-]", "not a number"),
    ("n[-1]", "not a number"),
    ("n[1,,2]", "not a number"),
    ("n[1:9:2]", "not a number"),
    ("n[2-1]", "runs backwards"),
    ("n[1 -2]", "blank inside brackets"),
    ("n[1-99999999]", f"more than {MAX_NAMES}"),
    ("a[1-60000],b[1-60000]", f"more than {MAX_NAMES}"),
]


@pytest.mark.parametrize(("text", "fragment"), INVALID)
def test_parse_nodelist_rejects(text: str, fragment: str) -> None:
    with pytest.raises(DistEnvError) as info:
        parse_nodelist(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message
    assert "HINT:" in message


@pytest.mark.usefixtures("slurm_commands")
def test_parse_nodelist_agrees_with_scontrol(tmp_path: Path) -> None:
    """Slurm's own parser (no controller needed for show hostnames) gives the same names."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cases = [text for text, _ in VALID if text.strip() and text not in ("[1-2]",)]
    for text in cases:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", text],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
        assert parse_nodelist(text) == out, text
