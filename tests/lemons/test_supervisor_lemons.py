"""The supervisor and the lemon record: which of a launch's faults it records, and the lemons
it leaves out of its launches while the allocation keeps enough other nodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpc_ddp.config.model import FaultConfig, JobConfig, SlurmConfig
from hpc_ddp.fault.blame import Finding
from hpc_ddp.fault.launch_ledger import Identity
from hpc_ddp.fault.supervisor import Plan, Supervisor
from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, read_record, where
from hpc_ddp.rundir.attempt import Blame
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths


class _Nodes:
    def __init__(self, nodes: tuple[str, ...]) -> None:
        self._nodes = nodes

    def nodes(self) -> tuple[str, ...]:
        return self._nodes


def supervisor(
    tmp_path: Path, alloc: tuple[str, ...], *, job: str | None = "42", lemon_nodes: bool = True
) -> Supervisor:
    cfg = JobConfig(
        name="t", slurm=SlurmConfig(nodes=2), fault=FaultConfig(lemon_nodes=lemon_nodes)
    )
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    return Supervisor(
        RunPaths(tmp_path / "run"), cfg, _Nodes(alloc), Identity(job, job, 0),  # type: ignore[arg-type]
        env=env,
    )  # fmt: skip


def record(tmp_path: Path) -> list[LemonEntry]:
    return list(read_record(where({"XDG_STATE_HOME": str(tmp_path / "state")})).values)


def lost_before(tmp_path: Path, node: str) -> None:
    entry = LemonEntry(node, "lost", "node_fail", "srun: Node failure", "old", "/runs/old", "7",
                       time.time() - 60)  # fmt: skip
    add_entry(where({"XDG_STATE_HOME": str(tmp_path / "state")}), entry)


def test_a_lemon_in_the_allocation_is_left_out_while_enough_others_remain(tmp_path: Path) -> None:
    lost_before(tmp_path, "n2")
    bad = supervisor(tmp_path, ("n1", "n2", "n3"))._with_lemons({})
    assert list(bad) == ["n2"]
    assert bad["n2"].startswith("lemon node: lost in run old (job 7)")
    assert supervisor(tmp_path, ("n1", "n2"))._with_lemons({}) == {}  # too few without it
    assert supervisor(tmp_path, ("n1", "n3", "n4"))._with_lemons({}) == {}  # not given it
    off = supervisor(tmp_path, ("n1", "n2", "n3"), lemon_nodes=False)
    assert off._with_lemons({"n9": "x"}) == {"n9": "x"}


def test_a_damaged_record_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lost_before(tmp_path, "n2")
    (where({"XDG_STATE_HOME": str(tmp_path / "state")}) / "1-x.json").write_text("{")
    assert list(supervisor(tmp_path, ("n1", "n2", "n3"))._with_lemons({})) == ["n2"]
    assert "ignoring damaged entry" in caplog.text


def finding(cause: EndCause, nodes: tuple[str, ...], *, node_level: bool = False) -> Finding:
    ranks = tuple(range(len(nodes)))
    return Finding(cause, Blame(ranks, nodes, "evidence", node_level, detected_at=1.8e9))


@pytest.mark.parametrize(
    ("found", "own_error", "kind"),
    [
        (finding(EndCause.NODE_FAIL, ("n2",), node_level=True), False, "lost"),
        (finding(EndCause.CRASH, ("n2",), node_level=True), False, "hardware"),
        (finding(EndCause.HANG, ("n2",)), False, "fault"),
        (finding(EndCause.CRASH, ("n2",)), True, None),  # a Python exception
        (finding(EndCause.HANG, ("n1", "n2")), False, None),  # every node alike
        (finding(EndCause.HANG, ("?",)), False, None),  # no node known
    ],
)
def test_which_faults_the_supervisor_records(
    tmp_path: Path, found: Finding, own_error: bool, kind: str | None
) -> None:
    supervisor(tmp_path, ("n1", "n2"))._remember(Plan(0, 2, 1, ()), found, own_error)
    entries = record(tmp_path)
    assert [e.kind for e in entries] == ([kind] if kind else [])
    for e in entries:
        assert (e.node, e.job, e.cause, e.time) == ("n2", "42", found.cause.value, 1.8e9)
        assert e.run_dir == str(tmp_path / "run")


def test_a_local_run_records_nothing(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, ("n1", "n2"), job=None)
    sup._remember(Plan(0, 2, 1, ()), finding(EndCause.NODE_FAIL, ("n2",)), False)
    assert record(tmp_path) == []
