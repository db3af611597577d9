"""Rank 0 probes the derived port with real sockets and publishes it; other ranks read it."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.errors import DistEnvError
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env, derive_master_port
from hpc_ddp.runtime.ports import is_port_free, port_file, resolve_master_port


def two_ranks(job_id: str, restart: int = 0) -> tuple[DistEnv, DistEnv]:
    def env(procid: int) -> dict[str, str]:
        return {
            "SLURM_JOB_ID": job_id,
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid),
            "SLURM_NODEID": "0",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_RESTART_COUNT": str(restart),
        }

    return derive_dist_env(env(0)), derive_dist_env(env(1))


def free_job_id(start: int) -> str:
    """A job id whose derived port (and first fallback) is free right now."""
    for j in range(start, start + 1000):
        if all(is_port_free(derive_master_port(str(j), 0, candidate=k)) for k in range(3)):
            return str(j)
    raise AssertionError("no free ports")


@pytest.fixture
def occupied() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def hold(port: int, socks: list[socket.socket], host: str = "127.0.0.1") -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, port))
    s.listen()
    socks.append(s)


def test_is_port_free_sees_a_listener_on_any_address(occupied: list[socket.socket]) -> None:
    port = derive_master_port(free_job_id(70_000), 0)
    assert is_port_free(port)
    hold(port, occupied)  # loopback only: still taken for a bind on 0.0.0.0
    assert not is_port_free(port)


def test_a_taken_port_moves_and_every_rank_reads_the_same(
    tmp_path: Path, occupied: list[socket.socket]
) -> None:
    rank0, rank1 = two_ranks(free_job_id(71_000))
    assert rank0.master_port == rank1.master_port
    hold(rank0.master_port, occupied, "0.0.0.0")
    seen: list[int] = []
    reader = threading.Thread(
        target=lambda: seen.append(resolve_master_port(rank1, tmp_path, timeout_s=10))
    )
    reader.start()  # rank 1 starts waiting before rank 0 has published
    chosen = resolve_master_port(rank0, tmp_path, timeout_s=10)
    reader.join(timeout=10)
    assert chosen != rank0.master_port
    assert chosen == derive_master_port(rank0.job_id, 0, candidate=1)
    assert seen == [chosen]
    assert port_file(rank0, tmp_path).read_text() == f"{chosen}\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_free_port_is_the_derived_one(tmp_path: Path) -> None:
    rank0, rank1 = two_ranks(free_job_id(72_000))
    assert resolve_master_port(rank0, tmp_path, timeout_s=1) == rank0.master_port
    assert resolve_master_port(rank1, tmp_path, timeout_s=1) == rank0.master_port


def test_two_jobs_get_different_ports(tmp_path: Path) -> None:
    a0, _ = two_ranks(free_job_id(73_000))
    b0, _ = two_ranks(str(int(a0.job_id or 0) + 1))
    assert resolve_master_port(a0, tmp_path, timeout_s=1) != resolve_master_port(
        b0, tmp_path, timeout_s=1
    )
    assert port_file(a0, tmp_path) != port_file(b0, tmp_path)


def test_a_stale_file_from_an_earlier_attempt_is_never_read(tmp_path: Path) -> None:
    job = free_job_id(74_000)
    old0, _ = two_ranks(job, restart=0)
    resolve_master_port(old0, tmp_path, timeout_s=1)
    _, new1 = two_ranks(job, restart=1)
    assert port_file(new1, tmp_path) != port_file(old0, tmp_path)
    with pytest.raises(DistEnvError) as info:
        resolve_master_port(new1, tmp_path, timeout_s=0.2, poll_s=0.01)
    message = str(info.value)
    assert "rank 1 waited 0.2 s" in message
    assert str(port_file(new1, tmp_path)) in message
    assert "HINT:" in message
    assert "filesystem every node sees" in message


def test_array_tasks_publish_under_their_own_key(tmp_path: Path) -> None:
    rank0, _ = two_ranks("500")
    task = dataclasses.replace(rank0, array_job_id="499", array_task_id="3", restart_count=2)
    assert port_file(task, tmp_path).name == "master_port.499_3.2"
    assert port_file(rank0, tmp_path).name == "master_port.500.0"


def test_fixed_ports_are_left_alone(tmp_path: Path, occupied: list[socket.socket]) -> None:
    rank0, _ = two_ranks(free_job_id(75_000))
    hold(rank0.master_port, occupied)
    for source in ("config", "launcher"):
        fixed = dataclasses.replace(rank0, port_source=source)
        assert resolve_master_port(fixed, tmp_path, timeout_s=1) == rank0.master_port
    assert list(tmp_path.iterdir()) == []


def test_a_single_rank_probes_but_publishes_nothing(
    tmp_path: Path, occupied: list[socket.socket]
) -> None:
    single = derive_dist_env({"SLURM_JOB_ID": free_job_id(76_000)})
    hold(single.master_port, occupied)
    assert resolve_master_port(single, tmp_path, timeout_s=1) != single.master_port
    assert list(tmp_path.iterdir()) == []
