"""The dev cluster's pure parts: its spec, ports and job ids, config files, and hosts line."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from hpc_ddp.backends.ports import PORT_SLOTS
from hpc_ddp.devcluster.conf import (
    HOSTS_MARKER,
    JOB_IDS_PER_SLOT,
    LEGACY_OWNER,
    MASTER_PORT_SLOTS,
    MAX_NODES,
    PORTS_PER_SLOT,
    SLOTS,
    ClusterLayout,
    ClusterSpec,
    hosts_owners,
    message_timeout_s,
    parse_sinfo_states,
    pick_slot,
    releasable_early,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
    render_slurmdbd_conf,
    slot_for,
)
from hpc_ddp.errors import DevClusterError
from hpc_ddp.runtime.distenv import derive_master_port

DEFAULT = Path("/var/lib/hpc-ddp/dev-cluster")


def _layout(**spec: int | bool) -> ClusterLayout:
    return ClusterLayout(state_dir=Path("/s"), hostname="box", spec=ClusterSpec(**spec))  # type: ignore[arg-type]


def _settings(conf: str) -> dict[str, str]:
    """``Key=value`` lines of a config (the first word of node and partition lines)."""
    return dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and " " not in line)


def _node_lines(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith("NodeName=")]


def test_default_conf_has_two_nodes_three_partitions_and_fast_requeue() -> None:
    conf = render_slurm_conf(_layout())
    settings = _settings(conf)
    assert settings["SlurmctldHost"] == "box(127.0.0.1)"
    assert settings["ClusterName"] == "hpcddp-dev"  # slot 0 keeps its name (and saved state)
    nodes = _node_lines(conf)
    assert [n.split()[0] for n in nodes] == ["NodeName=n1", "NodeName=n2"]
    assert all("CPUs=4" in n for n in nodes)
    assert "cred_expire=10" in settings["AuthInfo"]
    assert settings["SlurmdTimeout"] == "300"  # Slurm's own default unless asked
    assert settings["MessageTimeout"] == "10"
    assert settings["AccountingStorageType"] == "accounting_storage/none"
    parts = {line.split()[0]: line for line in conf.splitlines() if line.startswith("Partition")}
    assert "Default=YES" in parts["PartitionName=debug"]
    assert "GraceTime=" in parts["PartitionName=low"]
    assert "PriorityTier=10" in parts["PartitionName=high"]
    assert "PreemptMode=OFF" in parts["PartitionName=high"]


def test_n_nodes_get_names_and_ports_of_their_slot() -> None:
    layout = _layout(nodes=3, slot=2)
    conf = render_slurm_conf(layout)
    settings = _settings(conf)
    assert layout.node_names == ("n1", "n2", "n3")
    ports = [int(line.split("Port=")[1].split()[0]) for line in _node_lines(conf)]
    first = 17000 + 2 * PORTS_PER_SLOT
    assert int(settings["SlurmctldPort"]) == first
    assert ports == [first + 10, first + 11, first + 12]
    assert settings["FirstJobId"] == str(layout.first_job_id)
    assert 2_000_000 < layout.first_job_id < 2_100_000
    assert settings["ClusterName"] == "hpcddp-dev2"
    assert "%n" in settings["SlurmdSpoolDir"]


def test_every_slot_owns_its_ports_below_the_derived_master_ports() -> None:
    seen: set[int] = set()
    for slot in range(SLOTS):
        layout = _layout(nodes=MAX_NODES, slot=slot)
        ports = {layout.ctld_port, layout.dbd_port, layout.db_port}
        ports |= {layout.node_port(n) for n in layout.node_names}
        assert len(ports) == 3 + MAX_NODES
        assert not ports & seen, f"slot {slot} shares a port with another slot"
        assert min(ports) >= 17000
        assert max(ports) < 20000  # MASTER_PORTs are derived from 20000 up
        seen |= ports


@pytest.mark.parametrize("other", range(1, SLOTS))
def test_job_ids_of_the_default_and_another_slot_derive_different_master_ports(
    other: int,
) -> None:
    # The first 3000 jobs of the default cluster and of another one on the same loopback:
    # no first-attempt MASTER_PORT in common, so concurrent jobs need no fallback port.
    def ports(slot: int) -> set[int]:
        first = _layout(slot=slot).first_job_id
        assert slot * JOB_IDS_PER_SLOT <= first < (slot + 1) * JOB_IDS_PER_SLOT
        return {derive_master_port(str(first + i), 0) for i in range(3000)}

    assert not ports(0) & ports(other)


def test_the_master_port_ring_is_the_runtimes() -> None:
    assert MASTER_PORT_SLOTS == PORT_SLOTS


def test_other_slots_start_their_job_ids_on_different_master_ports() -> None:
    starts = {derive_master_port(str(_layout(slot=s).first_job_id), 0) for s in range(SLOTS)}
    assert len(starts) == SLOTS


def test_gres_gives_each_node_its_fake_gpus() -> None:
    layout = _layout(nodes=2, gpus_per_node=3)
    conf = render_slurm_conf(layout)
    assert _settings(conf)["GresTypes"] == "gpu"
    assert all(" Gres=gpu:3 " in n for n in _node_lines(conf))
    gres = render_gres_conf(layout).splitlines()
    assert "AutoDetect=off" in gres
    assert "NodeName=n1 Name=gpu File=/s/nodes/n1/dev/nvidia[0-2]" in gres
    assert "NodeName=n2 Name=gpu File=/s/nodes/n2/dev/nvidia[0-2]" in gres
    assert [d.name for d in layout.gpu_devices("n2")] == ["nvidia0", "nvidia1", "nvidia2"]


def test_no_gpus_no_gres() -> None:
    layout = _layout(gpus_per_node=0)
    conf = render_slurm_conf(layout)
    assert "GresTypes" not in conf
    assert "Gres=" not in conf
    assert "Name=gpu" not in render_gres_conf(layout)
    assert layout.gpu_devices("n1") == []


def test_accounting_points_slurmctld_at_its_own_slurmdbd_and_mariadb() -> None:
    layout = _layout(accounting=True, slot=5)
    settings = _settings(render_slurm_conf(layout))
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["AccountingStoragePort"] == str(layout.dbd_port)
    # slurmctld takes the munge socket for slurmdbd from here, not from AuthInfo.
    assert settings["AccountingStoragePass"] == str(layout.munge_socket)
    dbd = _settings(render_slurmdbd_conf(layout))
    assert dbd["DbdPort"] == str(layout.dbd_port)
    assert dbd["StoragePort"] == str(layout.db_port)
    assert dbd["StorageType"] == "accounting_storage/mysql"
    assert dbd["AuthInfo"] == f"socket={layout.munge_socket}"
    assert dbd["PidFile"] == str(layout.dbd_pid)
    assert list(layout.pid_files()) == [
        "munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"
    ]  # fmt: skip
    assert "mariadbd" not in _layout().pid_files()


@pytest.mark.parametrize(("slurmd", "message"), [(300, 10), (20, 10), (10, 5), (5, 2), (2, 2)])
def test_a_short_slurmd_timeout_shortens_the_message_timeout(slurmd: int, message: int) -> None:
    spec = ClusterSpec(slurmd_timeout_s=slurmd)
    assert message_timeout_s(spec) == message
    conf = _settings(render_slurm_conf(_layout(slurmd_timeout_s=slurmd)))
    assert (conf["SlurmdTimeout"], conf["MessageTimeout"]) == (str(slurmd), str(message))


@pytest.mark.parametrize(
    ("field", "value"),
    [("nodes", 0), ("nodes", MAX_NODES + 1), ("gpus_per_node", -1), ("slot", SLOTS),
     ("slurmd_timeout_s", 1), ("nodes", True), ("nodes", "2")],
)  # fmt: skip
def test_a_bad_spec_names_the_field_with_a_hint(field: str, value: object) -> None:
    with pytest.raises(DevClusterError, match=rf"{field}=.*HINT"):
        ClusterSpec(**{field: value})  # type: ignore[arg-type]


def test_spec_round_trips_through_json() -> None:
    spec = ClusterSpec(nodes=3, gpus_per_node=0, accounting=True, slurmd_timeout_s=5, slot=7)
    assert ClusterSpec.from_json(spec.to_json()) == spec
    with pytest.raises(DevClusterError, match="HINT"):
        ClusterSpec.from_json('{"nodes": 3, "colour": "red"}')
    with pytest.raises(DevClusterError, match="HINT"):
        ClusterSpec.from_json("not json")


def test_the_default_dir_has_slot_zero_and_others_a_stable_nonzero_slot() -> None:
    assert slot_for(DEFAULT, DEFAULT) == 0
    other = slot_for(Path("/tmp/x-acct"), DEFAULT)
    assert 1 <= other < SLOTS
    assert slot_for(Path("/tmp/x-acct"), DEFAULT) == other
    slots = {slot_for(Path(f"/tmp/cluster{i}"), DEFAULT) for i in range(200)}
    assert len(slots) > SLOTS // 2  # spread, not one slot for all


def test_a_cluster_keeps_its_slot_unless_a_running_one_holds_it() -> None:
    assert pick_slot(7, {0, 3}) == 7
    assert pick_slot(7, {0, 1, 7}) == 2  # the first free one, never the default dir's 0
    with pytest.raises(DevClusterError, match="HINT"):
        pick_slot(7, set(range(SLOTS)))


# --- /etc/hosts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "original",
    ["127.0.0.1 localhost\n", "127.0.0.1 localhost", "", "::1 ip6\n# comment\n10.0.0.1 x\n"],
)
def test_hosts_line_round_trips(original: str) -> None:
    added = render_hosts(original, {"/a": ("n1", "n2")})
    assert f"127.0.0.1 n1 n2 {HOSTS_MARKER}: /a=n1,n2\n" in added
    assert render_hosts(added, {"/a": ("n1", "n2")}) == added  # idempotent
    assert hosts_owners(added) == {"/a": ("n1", "n2")}
    expected = original if not original or original.endswith("\n") else original + "\n"
    assert render_hosts(added, {}) == expected


def test_the_hosts_line_holds_every_name_any_cluster_needs() -> None:
    text = render_hosts("127.0.0.1 localhost\n", {"/b": ("n1", "n2", "n3"), "/a": ("n1", "n2")})
    [line] = [line for line in text.splitlines() if HOSTS_MARKER in line]
    assert line.startswith("127.0.0.1 n1 n2 n3 ")
    owners = hosts_owners(text)
    assert owners == {"/a": ("n1", "n2"), "/b": ("n1", "n2", "n3")}
    del owners["/b"]
    fewer = render_hosts(text, owners)
    assert "127.0.0.1 n1 n2 " in fewer
    assert "n3" not in fewer
    assert fewer.count(HOSTS_MARKER) == 1


def test_names_sort_naturally() -> None:
    text = render_hosts("", {"/a": tuple(f"n{i}" for i in range(1, 12))})
    assert text.startswith("127.0.0.1 n1 n2 n3 n4 n5 n6 n7 n8 n9 n10 n11 ")


def test_a_state_dir_with_odd_characters_round_trips() -> None:
    owners = {"/tmp/my cluster=x:1": ("n1",), "/a": ("n1", "n2")}
    text = render_hosts("", owners)
    assert hosts_owners(text) == owners
    [line] = text.splitlines()
    assert "my cluster" not in line  # quoted: one word per owner


def test_a_legacy_line_belongs_to_the_legacy_owner() -> None:
    text = f"127.0.0.1 localhost\n127.0.0.1 n1 n2 {HOSTS_MARKER}\n"
    assert hosts_owners(text) == {LEGACY_OWNER: ("n1", "n2")}
    assert render_hosts(text, {"/a": ("n1", "n2", "n3")}) == (
        f"127.0.0.1 localhost\n127.0.0.1 n1 n2 n3 {HOSTS_MARKER}: /a=n1,n2,n3\n"
    )


def test_lines_without_the_marker_are_kept() -> None:
    text = "127.0.0.1 n1 # someone else's\n"
    assert render_hosts(text, {}) == text
    assert render_hosts(text, {"/a": ("n1",)}).startswith(text)
    assert hosts_owners(text) == {}


def test_parse_sinfo_states() -> None:
    text = "n1 idle\nn2 mix\nn1 idle\n\ngarbage line here\n"
    assert parse_sinfo_states(text) == {"n1": "idle", "n2": "mix"}


REQUEUED_AT = "2026-11-23T18:01:00"  # SubmitTime after a requeue (the controller's local time)


@pytest.mark.parametrize(
    ("state", "reason", "after_s", "releasable"),
    [
        ("PENDING", "BeginTime", 0.0, False),  # the second of the requeue: the start is killed
        ("PENDING", "BeginTime", 1.9, False),
        ("PENDING", "BeginTime", 2.0, True),
        ("PENDING", "BeginTime", 30.0, True),
        ("PENDING", "Priority", 30.0, False),  # not held by a requeue: nothing to release
        ("RUNNING", "None", 30.0, False),
    ],
)
def test_a_requeued_job_is_released_early_only_after_the_settle_time(
    state: str, reason: str, after_s: float, releasable: bool
) -> None:
    fields = {"JobState": state, "Reason": reason, "SubmitTime": REQUEUED_AT}
    requeued = datetime.fromisoformat(REQUEUED_AT).timestamp()
    assert releasable_early(fields, requeued + after_s) is releasable
