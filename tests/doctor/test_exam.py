"""The doctor's node side: what it reads of the node (sysfs, routes, a loopback stream), its
reports, and the whole check in real local processes (``hpc-ddp doctor --backend local``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.doctor.exam import (
    cudnn_version,
    infiniband_rates,
    loopback_stream_rate,
    nic_rate,
    route_iface,
)
from hpc_ddp.doctor.judgement import read_reports, report_path
from tests.helpers.launch import REPO, base_env


def test_nic_rate_reads_the_rated_speed_and_ignores_unknown_ones(tmp_path: Path) -> None:
    for iface, speed in (("eth0", "25000\n"), ("veth1", "-1\n"), ("bond0", "garbage")):
        (tmp_path / iface).mkdir()
        (tmp_path / iface / "speed").write_text(speed)
    assert nic_rate("eth0", tmp_path) == 25000e6 / 8
    assert nic_rate("veth1", tmp_path) is None
    assert nic_rate("bond0", tmp_path) is None
    assert nic_rate("missing", tmp_path) is None
    assert nic_rate("lo", tmp_path) is None
    assert nic_rate(None, tmp_path) is None


def test_infiniband_rates_count_active_ports_only(tmp_path: Path) -> None:
    ports = {
        "mlx5_0/ports/1": ("4: ACTIVE\n", "400 Gb/sec (4X NDR)\n"),
        "mlx5_1/ports/1": ("1: DOWN\n", "400 Gb/sec (4X NDR)\n"),
        "mlx5_2/ports/1": ("4: ACTIVE\n", "200 Gb/sec (4X HDR)\n"),
    }
    for port, (state, rate) in ports.items():
        (tmp_path / port).mkdir(parents=True)
        (tmp_path / port / "state").write_text(state)
        (tmp_path / port / "rate").write_text(rate)
    assert infiniband_rates(tmp_path) == [50e9, 25e9]
    assert infiniband_rates(tmp_path / "none") == []


def test_route_and_loopback_stream_on_this_machine() -> None:
    assert route_iface("127.0.0.1") == "lo"
    assert route_iface("no-such-host.invalid") is None
    rate = loopback_stream_rate(4 << 20)
    assert rate is not None
    assert rate > 10e6  # a TCP stream over loopback: at least 10 MB/s however busy the host


def test_cudnn_version_reads_both_encodings() -> None:
    assert cudnn_version(90100) == "9.1.0"
    assert cudnn_version(8902) == "8.9.2"


def test_read_reports_skips_unreadable_ones(tmp_path: Path) -> None:
    report_path(tmp_path, 0).write_text(
        json.dumps(
            {"rank": 0, "local_rank": 0, "node": "n1", "world_size": 3, "link": {"iface": "lo"}}
        )
    )
    report_path(tmp_path, 1).write_text("{not json")
    [only] = read_reports(tmp_path, 3)
    assert (only.rank, only.node, only.link.iface) == (0, "n1", "lo")


@pytest.mark.torch
def test_doctor_in_local_processes_checks_every_rank(tmp_path: Path) -> None:
    """Three real local ranks: each reports, the port check and the all-reduce run, and
    a healthy machine passes with exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "doctor", "--backend", "local", "--json",
         "--runs-dir", str(tmp_path), "slurm.tasks_per_node=3", "--timeout", "30"],
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result["summary"], done.stderr[-2000:])
    assert result["ok"] is True
    assert result["backend"] == "local"
    rows = {(f["rank"], f["check"]): f for f in result["findings"]}
    for rank in range(3):
        assert rows[(rank, "python")]["value"].startswith(f"{sys.version.split()[0]} (")
        assert rows[(rank, "master port")]["verdict"] == "ok"
    assert "2 of 2 other ranks came" in rows[(0, "master port")]["value"]
    assert (1, "run dir free") not in rows  # node checks: once per node, by its first rank
    largest = [f for f in result["findings"] if f["check"] == "all-reduce 32 MiB"]
    assert [f["verdict"] for f in largest] == ["ok"]
    assert "loopback: a TCP stream measured at" in largest[0]["note"]
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == tmp_path / "doctor"
    assert len(read_reports(run_dir / "doctor", 3)) == 3


@pytest.mark.torch
def test_a_relaunch_can_run_the_checks_in_its_own_run_dir(tmp_path: Path) -> None:
    """``python -m hpc_ddp.doctor.exam RUN_DIR OUT_DIR`` with a run's own config, as a step in a
    running allocation would (two ranks, started the way torchrun starts them)."""
    from hpc_ddp.config.load import dump_job_config
    from hpc_ddp.config.model import DistConfig, JobConfig
    from hpc_ddp.doctor.judgement import evaluate
    from tests.helpers.launch import run_ranks

    run_dir, out = tmp_path / "run", tmp_path / "checks-1"
    run_dir.mkdir()
    cfg = JobConfig(name="train", dist=DistConfig(timeout_s=30))
    (run_dir / "config.yaml").write_text(dump_job_config(cfg))
    outs = run_ranks(["-m", "hpc_ddp.doctor.exam", str(run_dir), str(out)], 2, timeout=120)
    assert [code for code, _, _ in outs] == [0, 0], outs[0][2][-2000:] + outs[1][2][-2000:]
    reports = read_reports(out, 2)
    assert [r.rank for r in reports] == [0, 1]
    assert reports[0].group == "done"
    findings = evaluate(reports, 2)
    assert all(f.passed for f in findings), [f for f in findings if not f.passed]
    assert any(f.check == "all-reduce 32 MiB" for f in findings)
