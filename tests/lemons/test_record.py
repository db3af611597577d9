"""The lemon record's rules (pure): which faults are recorded, which nodes are lemons within
the window, what a submission excludes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.lemons.record import (
    DEFAULT_WINDOW_S,
    LemonEntry,
    entry_from_dict,
    entry_kind,
    entry_name,
    fault_entries,
    judge,
    launch_exclusion,
    record_dir,
    submit_exclusion,
)

NOW = 1_800_000_000.0
DAY = 86400.0


def entry(node: str, kind: str = "fault", run: str = "r1", age_days: float = 0.0) -> LemonEntry:
    cause = {"lost": "node_fail", "hardware": "crash"}.get(kind, "hang")
    return LemonEntry(node, kind, cause, "why", run, f"/runs/{run}", "12", NOW - age_days * DAY)


def nodes(entries: list[LemonEntry], window_s: float = DEFAULT_WINDOW_S) -> list[str]:
    return [x.node for x in judge(entries, now=NOW, window_s=window_s)]


@pytest.mark.parametrize(
    ("cause", "node_level", "own_error", "singled_out", "kind"),
    [
        ("node_fail", False, False, True, "lost"),
        ("node_fail", False, True, False, "lost"),  # a lost node counts however it ended
        ("crash", True, False, False, "hardware"),  # an ECC error, an Xid
        ("crash", False, True, True, None),  # a Python exception: the program's
        ("hang", False, False, True, "fault"),
        ("crash", False, False, True, "fault"),  # a death by signal on some nodes
        ("hang", False, False, False, None),  # every node hung alike: points at none
    ],
)
def test_which_faults_are_recorded(
    cause: str, node_level: bool, own_error: bool, singled_out: bool, kind: str | None
) -> None:
    got = entry_kind(cause, node_level=node_level, own_error=own_error, singled_out=singled_out)
    assert got == kind


def test_a_lost_node_is_a_lemon_alone() -> None:
    assert nodes([entry("n1", "lost")]) == ["n1"]
    assert nodes([entry("n1", "hardware")]) == ["n1"]


def test_a_fault_counts_only_in_two_distinct_runs() -> None:
    assert nodes([entry("n1")]) == []
    assert nodes([entry("n1", run="a"), entry("n1", run="a", age_days=1)]) == []
    both = [entry("n1", run="a"), entry("n1", run="b", age_days=1)]
    assert nodes(both) == ["n1"]
    reason = judge(both, now=NOW, window_s=DEFAULT_WINDOW_S)[0].reason
    assert reason.startswith("faults in 2 runs within 7 day(s)")
    assert "/runs/" not in reason
    assert nodes([entry("n1", run="a"), entry("n2", run="b")]) == []  # different nodes


def test_the_window_forgets_old_faults() -> None:
    old = [entry("n1", run="a", age_days=8), entry("n1", run="b")]
    assert nodes(old) == []
    assert nodes(old, window_s=9 * DAY) == ["n1"]
    assert nodes([entry("n2", "lost", age_days=7.5)]) == []
    assert nodes([entry("n2", "lost", age_days=6.5)]) == ["n2"]


def test_an_entry_round_trips_and_damage_is_named() -> None:
    e = entry("n1", "lost")
    assert entry_from_dict(e.to_dict()) == e
    for bad, said in [
        ([], "not a JSON object"),
        ({"kind": "lost", "time": 1}, "no node"),
        ({"node": "n1", "kind": "flaky", "time": 1}, "kind 'flaky'"),
        ({"node": "n1", "kind": "lost", "time": "yesterday"}, "time 'yesterday'"),
        ({"node": "n1", "kind": "lost", "time": float("nan")}, "time nan"),
    ]:
        with pytest.raises(ValueError, match=said):
            entry_from_dict(bad)


def test_entry_names_are_safe_and_unique_by_their_tail() -> None:
    e = entry("../n1 x")
    name = entry_name(e, "7-abc")
    assert "/" not in name
    assert " " not in name
    assert name.endswith("-7-abc.json")


def test_record_dir_follows_xdg() -> None:
    home = Path("/home/u")
    assert record_dir({}, home) == home / ".local/state/hpc-ddp/nodes"
    assert record_dir({"XDG_STATE_HOME": "/s"}, home) == Path("/s/hpc-ddp/nodes")
    assert record_dir({"XDG_STATE_HOME": "rel"}, home) == home / ".local/state/hpc-ddp/nodes"


def test_submit_excludes_while_the_partition_keeps_enough() -> None:
    lemons = judge([entry("n1", "lost"), entry("n9", "lost")], now=NOW, window_s=DEFAULT_WINDOW_S)
    part = ["n1", "n2", "n3"]
    ex = submit_exclusion(lemons, partition="p", partition_nodes=part, needed=2)
    assert ex.nodes == ("n1",)
    assert any("not in partition p: n9" in n for n in ex.notes)
    assert "lemon node n1: excluding (lost in run r1 (job 12)" in ex.lines()[0]
    tight = submit_exclusion(lemons, partition="p", partition_nodes=part, needed=3)
    assert tight.nodes == ()
    assert any("would keep 2 node(s)" in n for n in tight.notes)
    unknown = submit_exclusion(
        lemons, partition="p", partition_nodes=None, needed=1, unknown_why="x"
    )
    assert unknown.nodes == ()
    assert "not known: x" in unknown.notes[0]
    assert submit_exclusion((), partition="p", partition_nodes=None, needed=1).lines() == []


def test_a_launch_leaves_out_the_lemons_in_its_allocation_while_enough_others_remain() -> None:
    lost = [entry("n2", "lost"), entry("n9", "lost")]
    found, said = launch_exclusion(lost, alloc=["n1", "n2", "n3"], bad={}, needed=2, now=NOW,
                                   window_s=DEFAULT_WINDOW_S)  # fmt: skip
    assert list(found) == ["n2"]
    assert found["n2"].startswith("lemon node: lost in run r1")
    assert said == [f"leaving out n2 ({found['n2']})"]
    found, said = launch_exclusion(lost, alloc=["n1", "n2"], bad={}, needed=2, now=NOW,
                                   window_s=DEFAULT_WINDOW_S)  # fmt: skip
    assert found == {}
    assert "which has 1 other(s) of the 2 a launch needs: using them" in said[0]
    assert launch_exclusion(lost, alloc=["n1", "n2", "n3"], bad={"n2": "x"}, needed=2, now=NOW,
                            window_s=DEFAULT_WINDOW_S) == ({}, [])  # fmt: skip


def test_a_fault_becomes_one_entry_per_blamed_node_of_its_kind() -> None:
    made = fault_entries("hang", ("n2", "n2", "?"), node_level=False, own_error=False,
                         launch_nodes=2, evidence="e", run="r", run_dir="/runs/r", job="12",
                         time=NOW)  # fmt: skip
    assert made == [LemonEntry("n2", "fault", "hang", "e", "r", "/runs/r", "12", NOW)]
    every = fault_entries("hang", ("n1", "n2"), node_level=False, own_error=False,
                          launch_nodes=2, evidence="e", run="r", run_dir="/runs/r", job=None,
                          time=NOW)  # fmt: skip
    assert every == []  # every node alike: none singled out
