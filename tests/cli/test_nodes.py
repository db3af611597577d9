"""``hpc-ddp nodes``: the lemon record as a table or JSON, ``--forget``, damage as a warning."""

from __future__ import annotations

import json
import time

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, where


def add(node: str, kind: str, run: str, age_s: float = 60.0) -> None:
    cause = "node_fail" if kind == "lost" else "hang"
    entry = LemonEntry(node, kind, cause, f"{cause} on {node}", run, f"/runs/{run}", "7",
                       time.time() - age_s)  # fmt: skip
    add_entry(where(), entry)


def test_an_empty_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes"]) == 0
    assert capsys.readouterr().out.startswith("no node in the lemon record (")


def test_the_table_puts_lemons_first(capsys: pytest.CaptureFixture[str]) -> None:
    add("n1", "fault", "run-a")
    add("n2", "lost", "run-b", age_s=3600)
    add("n3", "fault", "run-a")
    add("n3", "fault", "run-c")
    assert main(["nodes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["NODE", "LEMON", "FAULTS/7d", "RUNS", "LAST"]
    rows = [line.split()[:4] for line in lines[1:-1]]
    assert rows == [["n3", "yes", "2", "2"], ["n2", "yes", "1", "1"], ["n1", "no", "1", "1"]]
    assert "faults in 2 runs within 7 day(s)" in lines[1]
    assert lines[-1] == f"record: {where()}"


def test_json_and_a_narrower_window(capsys: pytest.CaptureFixture[str]) -> None:
    add("n2", "lost", "run-b", age_s=2 * 86400)
    assert main(["nodes", "--json", "--window-days", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["schema"] == "hpc-ddp.nodes/1"
    assert shown["window_s"] == 86400
    (row,) = shown["nodes"]
    assert (row["node"], row["lemon"], row["faults"], row["last_cause"]) == (
        "n2", False, 0, "node_fail",
    )  # fmt: skip


def test_forget_clears_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    add("n1", "lost", "run-a")
    add("n1", "lost", "run-b")
    add("n2", "lost", "run-a")
    assert main(["nodes", "--forget", "n1"]) == 0
    assert capsys.readouterr().out == "forgot n1: 2 entries removed\n"
    assert main(["nodes", "--json"]) == 0
    assert [r["node"] for r in json.loads(capsys.readouterr().out)["nodes"]] == ["n2"]


def test_a_damaged_entry_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    add("n1", "lost", "run-a")
    (where() / "1-n5-x.json").write_text("[1, 2")
    assert main(["nodes"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].startswith("n1 ")
    assert "warning: lemon record: ignoring damaged entry" in err
    assert "1-n5-x.json" in err


def test_a_bad_node_name_or_window_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes", "--forget", "a,b"]) == 2
    assert "is not a node name" in capsys.readouterr().err
    assert main(["nodes", "--window-days", "0"]) == 2
