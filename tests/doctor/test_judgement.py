"""The doctor's judgement (pure): bus bandwidth as nccl-tests defines it, the clock offset, the
expectations (gloo over TCP, NCCL within and across nodes), the verdicts and who is blamed,
from reports written by hand (the NCCL path has no GPU to run on here)."""

from __future__ import annotations

import dataclasses

import pytest

from hpc_ddp.doctor.judgement import (
    FAIL,
    GB,
    INFO,
    MIN_FREE_BYTES,
    OK,
    SLOW,
    Expectation,
    Link,
    RankReport,
    bandwidth_verdict,
    best_offset,
    bus_bandwidth,
    clock_offset,
    culprits,
    evaluate,
    expected_busbw,
    expected_p2p,
    human_bytes,
    intra_node_busbw,
    network_busbw,
    summary,
    tcp_rate,
)

LOOP = Link(iface="lo", loopback_bytes_s=4 * GB)


def report(rank: int, node: str, **kw: object) -> RankReport:
    """A healthy gloo rank of a two-node job, one rank per node, with ``kw`` changed."""
    base = RankReport(
        rank=rank,
        local_rank=0,
        node=node,
        world_size=2,
        python="3.11.7",
        executable="/venv/bin/python",
        torch="2.4.1",
        cuda_build="12.1",
        backend="gloo",
        device="cpu",
        free_bytes=100 << 30,
        total_bytes=1 << 40,
        token="t0k",
        port=23456,
        port_role="listen" if rank == 0 else "connect",
        port_s=None if rank == 0 else 0.002,
        reached=(1,) if rank == 0 else (),
        group="done",
        clock_offset_s=None if rank == 0 else 0.0004,
        clock_error_s=None if rank == 0 else 0.0001,
        allreduce=((4 << 20, 0.01), (32 << 20, 0.05)) if rank == 0 else (),
        p2p=(("n2", 1, 16 << 20, 0.02),) if rank == 0 else (),
        link=LOOP,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def healthy() -> list[RankReport]:
    return [report(0, "n1"), report(1, "n2")]


def by(findings: list, check: str, node: str | None = None) -> list:  # type: ignore[type-arg]
    return [f for f in findings if f.check == check and (node is None or f.node == node)]


# --- numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "seconds", "world", "busbw"),
    [
        (1_000_000, 0.001, 2, 1e9),  # 2(n-1)/n = 1 for two ranks
        (1_000_000, 0.001, 4, 1.5e9),
        (1_000_000, 0.001, 8, 1.75e9),
        (1_000_000, 0.001, 1, 0.0),  # one rank moves nothing
        (1_000_000, 0.0, 2, 0.0),
    ],
)
def test_bus_bandwidth_is_nccl_tests_algbw_times_2_n_minus_1_over_n(
    nbytes: int, seconds: float, world: int, busbw: float
) -> None:
    assert bus_bandwidth(nbytes, seconds, world) == pytest.approx(busbw)


def test_clock_offset_is_ntps_and_the_least_queued_round_trip_wins() -> None:
    # the peer runs 5 s ahead; the trip took 2 s, 1 s each way
    assert clock_offset(100.0, 106.0, 102.0) == (5.0, 1.0)
    samples = [(100.0, 106.5, 103.0), (110.0, 115.1, 110.2), (120.0, 126.0, 122.0)]
    offset, error = best_offset(samples)
    assert offset == pytest.approx(5.0)
    assert error == pytest.approx(0.1)


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 256 << 10, 32 << 20, 3 << 29)] == [
        "512 B", "256 KiB", "32 MiB", "1.5 GiB",
    ]  # fmt: skip


# --- expectations -----------------------------------------------------------------------------


def test_tcp_rate_is_the_slower_of_the_nic_and_the_hosts_own_stream() -> None:
    assert tcp_rate(LOOP) == Expectation(4 * GB, "loopback: a TCP stream measured at 4 GB/s")
    ten_gbe = Link(iface="eth0", rated_bytes_s=1.25 * GB, loopback_bytes_s=4 * GB)
    rate = tcp_rate(ten_gbe)
    assert rate is not None
    assert rate.bytes_s == pytest.approx(1.125 * GB)
    assert "eth0: 1.25 GB/s rated, 90% for TCP" in rate.how
    fast_nic = Link(iface="eth0", rated_bytes_s=12.5 * GB, loopback_bytes_s=4 * GB)
    assert tcp_rate(fast_nic) == Expectation(4 * GB, "eth0: the host's TCP stream (4 GB/s)")
    unknown = Link(iface="veth3", loopback_bytes_s=3 * GB)
    rate = tcp_rate(unknown)
    assert rate is not None
    assert rate.bytes_s == 3 * GB
    assert "(speed unknown)" in rate.how
    assert tcp_rate(Link(iface="eth0")) is None


def test_gloo_expectations_take_the_slowest_node() -> None:
    reports = [report(0, "n1"), report(1, "n2", link=Link(iface="lo", loopback_bytes_s=2 * GB))]
    allreduce = expected_busbw("gloo", reports)
    assert allreduce is not None
    assert allreduce.bytes_s == pytest.approx(0.4 * GB)  # 0.2 x n2's 2 GB/s
    assert "n2's loopback" in allreduce.how
    p2p = expected_p2p("gloo", reports[1], reports[0])
    assert p2p is not None
    assert p2p.bytes_s == pytest.approx(0.5 * GB)
    assert expected_busbw("gloo", [report(0, "n1", link=Link())]) is None


@pytest.mark.parametrize(
    ("name", "busbw", "words"),
    [
        ("NVIDIA H100 80GB HBM3", 360 * GB, "NVLink 4"),
        ("NVIDIA H200", 360 * GB, "NVLink 4"),
        ("NVIDIA A100-SXM4-80GB", 230 * GB, "NVLink 3"),
        ("Tesla V100-SXM2-32GB", 130 * GB, "NVLink 2"),
        ("NVIDIA H100 PCIe", 40 * GB, "PCIe Gen5"),
        ("NVIDIA H100 NVL", 40 * GB, "PCIe Gen5"),
        ("NVIDIA A100 80GB PCIe", 20 * GB, "PCIe Gen4"),
        ("NVIDIA L40S", 40 * GB, "PCIe Gen5"),
        ("NVIDIA A40", 20 * GB, "(NVIDIA A40: assumed)"),
    ],
)
def test_nccl_within_a_node_follows_the_gpus_nvlink_or_pcie_generation(
    name: str, busbw: float, words: str
) -> None:
    expected = intra_node_busbw(name)
    assert expected.bytes_s == busbw
    assert words in expected.how


def test_nccl_across_nodes_follows_infiniband_or_the_ethernet_socket_transport() -> None:
    ndr = Link(iface="ib0", ib_bytes_s=(50 * GB,) * 8)
    net = network_busbw(ndr)
    assert net is not None
    assert net.bytes_s == pytest.approx(360 * GB)  # 8 x 400 Gb/s, 90%
    assert "8 InfiniBand port(s)" in net.how
    eth = network_busbw(Link(iface="eth0", rated_bytes_s=12.5 * GB))
    assert eth is not None
    assert eth.bytes_s == pytest.approx(6.25 * GB)
    assert network_busbw(LOOP) is None


def gpu_node(rank: int, node: str, local: int, link: Link, name: str = "NVIDIA H100 80GB HBM3"):  # type: ignore[no-untyped-def]
    return report(
        rank, node, local_rank=local, world_size=16, backend="nccl", device=f"cuda:{local}",
        gpu_names=(name,) * 8, link=link,
    )  # fmt: skip


def test_nccl_job_expectation_is_the_narrower_of_nvlink_and_the_network() -> None:
    ib = Link(iface="ib0", ib_bytes_s=(50 * GB,) * 8)
    two_nodes = [gpu_node(r, f"g{r // 8}", r % 8, ib) for r in range(16)]
    expected = expected_busbw("nccl", two_nodes)
    assert expected is not None
    assert expected.bytes_s == pytest.approx(360 * GB)
    one_nic = Link(iface="ib0", ib_bytes_s=(25 * GB,))  # one 200 Gb/s port on g1
    mixed = [gpu_node(r, f"g{r // 8}", r % 8, ib if r < 8 else one_nic) for r in range(16)]
    expected = expected_busbw("nccl", mixed)
    assert expected is not None
    assert expected.bytes_s == pytest.approx(22.5 * GB)
    assert expected.how.startswith("g1's 1 InfiniBand port(s)")
    one_node = [gpu_node(r, "g0", r, ib) for r in range(8)]
    expected = expected_busbw("nccl", one_node)
    assert expected is not None
    assert expected.bytes_s == 360 * GB
    p2p = expected_p2p("nccl", mixed[8], mixed[0])
    assert p2p is not None
    assert p2p.bytes_s == pytest.approx(22.5 * GB)  # one port each way
    no_speed = [gpu_node(r, f"g{r // 8}", r % 8, LOOP) for r in range(16)]
    assert expected_busbw("nccl", no_speed) is None


def test_bandwidth_verdict_threshold_is_half_the_expectation() -> None:
    e = Expectation(10 * GB, "x")
    assert bandwidth_verdict(5 * GB, e) == OK
    assert bandwidth_verdict(4.99 * GB, e) == SLOW
    assert bandwidth_verdict(0.0, None) == INFO


# --- the table ------------------------------------------------------------------------------


def test_a_healthy_job_passes_with_one_row_set_per_node() -> None:
    findings = evaluate(healthy(), 2, token="t0k")
    assert all(f.passed for f in findings), [f for f in findings if not f.passed]
    rows = {(f.node, f.check) for f in findings}
    for node in ("n1", "n2"):
        for check in ("python", "torch", "gpus", "run dir free", "run dir shared", "master port"):
            assert (node, check) in rows
    assert ("n2", "clock skew") in rows
    assert ("n2", "p2p bandwidth") in rows
    assert [f.check for f in findings if f.node == "all"] == [
        "all-reduce 4 MiB", "all-reduce 32 MiB",
    ]  # fmt: skip
    assert [f.verdict for f in findings if f.node == "all"] == [INFO, OK]  # only the largest
    assert summary(findings, ["n1", "n2"]) == "doctor: every check passed on 2 node(s): n1, n2"


def test_every_other_rank_failing_to_reach_the_port_blames_rank_0s_node() -> None:
    error = "rank 0 cannot listen on port 23456: Address already in use. HINT: ..."
    reports = [
        report(0, "n1", port_error=error, reached=(), group="skipped: x", allreduce=(), p2p=()),
        report(1, "n2", port_error="n1:23456 took the connection; ...", group="skipped: x"),
    ]
    findings = evaluate(reports, 2, token="t0k")
    [n1] = by(findings, "master port", "n1")
    [n2] = by(findings, "master port", "n2")
    assert (n1.verdict, n1.value) == (FAIL, "cannot listen on 23456")
    assert (n2.verdict, n2.culprit) == (FAIL, "n1")
    assert list(culprits(findings)) == ["n1"]
    assert summary(findings, ["n1", "n2"]) == "doctor: n1 is broken (master port)"
    [skipped] = by(findings, "group checks")
    assert (skipped.node, skipped.verdict) == ("all", INFO)


def test_one_node_of_several_failing_to_reach_the_port_is_blamed_itself() -> None:
    reports = [report(0, "n1", world_size=3, reached=(1,)), report(1, "n2", world_size=3)]
    reports.append(report(2, "n3", world_size=3, port_error="cannot connect to n1:23456 (...)"))
    findings = evaluate(reports, 3, token="t0k")
    assert list(culprits(findings)) == ["n3"]


def test_a_node_with_other_software_than_rank_0_is_named() -> None:
    reports = [report(0, "n1"), report(1, "n2", torch="2.3.0", executable="/usr/bin/python3")]
    findings = evaluate(reports, 2)
    assert [(f.node, f.check, f.verdict) for f in findings if not f.passed] == [
        ("n2", "python", FAIL),
        ("n2", "torch", FAIL),
    ]
    [torch_row] = by(findings, "torch", "n2")
    assert "differs from rank 0's on n1 (torch 2.4.1, CUDA 12.1)" in torch_row.note


def test_torch_that_cannot_be_imported_fails_with_its_error() -> None:
    reports = [report(0, "n1"), report(1, "n2", torch=None, torch_error="ModuleNotFoundError: x")]
    [row] = by(evaluate(reports, 2), "torch", "n2")
    assert (row.value, row.verdict) == ("cannot import", FAIL)
    assert row.note.startswith("ModuleNotFoundError: x. HINT: install torch")


def test_run_dir_checks_free_space_writability_and_sharing() -> None:
    reports = [
        report(0, "n1", free_bytes=MIN_FREE_BYTES - 1),
        report(1, "n2", token=None, write_error="cannot write in /x: Read-only file system"),
    ]
    findings = evaluate(reports, 2, token="t0k")
    bad = {(f.node, f.check) for f in findings if not f.passed}
    assert bad == {("n1", "run dir free"), ("n2", "run dir free"), ("n2", "run dir shared")}
    [shared] = by(findings, "run dir shared", "n2")
    assert "not /tmp" in shared.note
    # without a token from the caller (a relaunch inside the allocation) there is no such row
    assert not by(evaluate(healthy(), 2), "run dir shared")


def test_clock_skew_over_a_second_fails_on_that_node() -> None:
    reports = [report(0, "n1"), report(1, "n2", clock_offset_s=-2.5, clock_error_s=0.001)]
    [row] = by(evaluate(reports, 2), "clock skew", "n2")
    assert row.verdict == FAIL
    assert row.value == "-2500.000 ms vs n1 (+-1.000 ms)"


def test_a_slow_link_names_its_node_and_a_slow_master_is_blamed_for_all() -> None:
    three = [
        report(0, "n1", world_size=3, reached=(1, 2),
               p2p=(("n2", 1, 16 << 20, 0.02), ("n3", 2, 16 << 20, 2.0))),
        report(1, "n2", world_size=3),
        report(2, "n3", world_size=3),
    ]  # fmt: skip
    findings = evaluate(three, 3)
    assert summary(findings, ["n1", "n2", "n3"]) == "doctor: n3 is slow (p2p bandwidth)"
    master = dataclasses.replace(three[0], p2p=(("n2", 1, 16 << 20, 2.0), ("n3", 2, 16 << 20, 2.0)))
    findings = evaluate([master, *three[1:]], 3)
    assert list(culprits(findings)) == ["n1"]


def test_a_node_whose_link_is_slower_than_the_others_is_named() -> None:
    fast = Link(iface="eth0", rated_bytes_s=3.125 * GB, loopback_bytes_s=4 * GB)  # 25 Gb/s
    slow = Link(iface="eth0", rated_bytes_s=0.125 * GB, loopback_bytes_s=4 * GB)  # 1 Gb/s
    reports = [report(0, "n1", link=fast), report(1, "n2", link=slow)]
    findings = evaluate(reports, 2)
    [n1] = by(findings, "network", "n1")
    [n2] = by(findings, "network", "n2")
    assert (n1.value, n1.verdict) == ("eth0, 25 Gb/s rated", OK)
    assert (n2.value, n2.verdict) == ("eth0, 1 Gb/s rated", SLOW)
    assert "under half of n1's (25 Gb/s)" in n2.note
    assert list(culprits(findings)) == ["n2"]
    # the all-reduce's expectation follows the slow link: measured against it, it passes
    [allreduce] = by(findings, "all-reduce 32 MiB")
    assert "n2's eth0: 0.125 GB/s rated, 90% for TCP" in allreduce.note
    [loop] = by(evaluate(healthy(), 2), "network", "n1")
    assert (loop.value, loop.verdict) == ("lo (one host)", INFO)


def test_a_missing_report_names_the_rank_and_what_the_caller_knows() -> None:
    findings = evaluate([report(0, "n1")], 2, missing={1: ("n2", "srun: Killed")})
    [row] = by(findings, "report")
    assert (row.node, row.rank, row.verdict, row.note) == ("n2", 1, FAIL, "srun: Killed")
    [row] = by(evaluate([report(0, "n1")], 2), "report")
    assert (row.node, row.note) == (
        "?",
        "see logs/rank-1.err: the task did not start, or was killed",
    )


def test_a_task_that_died_in_the_group_checks_fails_there() -> None:
    reports = [report(0, "n1", group="started", allreduce=(), p2p=()), report(1, "n2")]
    [row] = by(evaluate(reports, 2), "group checks")
    assert (row.node, row.verdict, row.value) == ("n1", FAIL, "unfinished")


def test_reports_round_trip_through_json() -> None:
    import json

    r = report(0, "n1", gpu_names=("NVIDIA H100",), link=Link("ib0", 1.0, 2.0, (3.0, 4.0)))
    data = json.loads(json.dumps(dataclasses.asdict(r)))
    assert RankReport.from_dict({**data, "future_field": 1}) == r
