"""The lemon record's files: atomic entries, several writers at once, damage, --forget."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, forget_node, read_record, where

NOW = 1_800_000_000.0


def entry(node: str, run: str = "r1", t: float = NOW) -> LemonEntry:
    return LemonEntry(node, "lost", "node_fail", "srun: Node failure", run, f"/runs/{run}", "7", t)


def test_entries_are_added_read_and_forgotten(tmp_path: Path) -> None:
    d = tmp_path / "nodes"
    assert read_record(d).entries == ()  # none yet: no warning either
    add_entry(d, entry("n1"), now=NOW)
    add_entry(d, entry("n1", run="r2"), now=NOW)
    add_entry(d, entry("n2"), now=NOW)
    assert sorted(e.node for e in read_record(d).values) == ["n1", "n1", "n2"]
    assert not list(d.glob(".*"))  # no temp file left behind
    assert forget_node(d, "n1") == 2
    assert [e.node for e in read_record(d).values] == ["n2"]
    assert forget_node(d, "n1") == 0


def test_old_entries_are_pruned_on_write(tmp_path: Path) -> None:
    d = tmp_path / "nodes"
    add_entry(d, entry("old", t=NOW - 100 * 86400), now=NOW - 100 * 86400)
    add_entry(d, entry("new"), now=NOW)
    assert [e.node for e in read_record(d).values] == ["new"]


def test_a_damaged_entry_is_a_warning(tmp_path: Path) -> None:
    d = tmp_path / "nodes"
    add_entry(d, entry("n1"), now=NOW)
    (d / "1-bad.json").write_text("{not json")
    (d / "2-edited.json").write_text(json.dumps({"node": "n3", "kind": "maybe", "time": NOW}))
    record = read_record(d)
    assert [e.node for e in record.values] == ["n1"]
    assert len(record.warnings) == 2
    assert all("ignoring damaged entry" in w and "HINT" in w for w in record.warnings)
    assert "kind 'maybe'" in " ".join(record.warnings)


def test_an_unreadable_record_is_a_warning(tmp_path: Path) -> None:
    d = tmp_path / "nodes"
    d.write_text("a file where the directory should be")
    record = read_record(d)
    assert record.entries == ()
    assert "unreadable" in record.warnings[0]


def test_where_uses_the_environment(tmp_path: Path) -> None:
    assert where({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "hpc-ddp" / "nodes"


def _write_many(args: tuple[str, int, int]) -> None:
    d, worker, count = args
    for i in range(count):
        add_entry(Path(d), entry(f"n{worker}", run=f"w{worker}-{i}"))


def test_concurrent_writers_lose_no_entry(tmp_path: Path) -> None:
    d = tmp_path / "nodes"
    workers, each = 6, 20
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.map(_write_many, [(str(d), w, each) for w in range(workers)])
    record = read_record(d)
    assert record.warnings == ()
    assert len(record.values) == workers * each
    assert len({(e.node, e.run) for e in record.values}) == workers * each
