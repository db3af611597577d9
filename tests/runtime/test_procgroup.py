"""The process group: backend and device choice, the master port (derived, probed and
published), the rendezvous, DDP wrapping."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.config.model import DistConfig
from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir.layout import LOCAL_GPUS_ENV, LOCAL_GPUS_PER_TASK_ENV
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env, derive_master_port
from hpc_ddp.runtime.procgroup import (
    ProcessGroupInfo,
    _listen,
    check_grant,
    choose_backend,
    choose_device,
    destroy_process_group,
    gpu_grant,
    init_process_group,
    is_port_free,
    port_file,
    resolve_master_port,
)
from tests.helpers.launch import Ranks, start_process

REPO = Path(__file__).resolve().parents[2]

# One rank: join, all_reduce rank+1, leave (twice: must be harmless), report as JSON.
RANK_SCRIPT = """
import json, os, sys
from pathlib import Path
import torch
import torch.distributed as tdist
from hpc_ddp.config.model import DistConfig
from hpc_ddp.runtime.distenv import derive_dist_env
from hpc_ddp.runtime.procgroup import destroy_process_group, init_process_group

run_dir, method, timeout_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist = derive_dist_env(os.environ)
cfg = DistConfig(backend="gloo", init_method=method, timeout_s=timeout_s)
if os.environ.get("SLOW_AFTER_LISTEN"):  # rank 0 listens, then is slow to make its store
    import time
    import hpc_ddp.runtime.procgroup as pg
    listen = pg._listen
    def slow_listen(port):
        sock = listen(port)
        time.sleep(float(os.environ["SLOW_AFTER_LISTEN"]))
        return sock
    pg._listen = slow_listen
info = init_process_group(dist, cfg, run_dir, os.environ)
x = torch.tensor([float(dist.rank + 1)])
tdist.all_reduce(x)
report = dict(rank=dist.rank, sum=x.item(), world=tdist.get_world_size(), backend=info.backend,
              device=info.device, init_method=info.init_method, port=info.master_port,
              env_port=os.environ.get("MASTER_PORT"))
import time
time.sleep(float(os.environ.get("SLEEP_BEFORE_LEAVING", "0")))
report["arrived"] = time.time()
destroy_process_group(together=os.environ.get("LEAVE") == "together")
report["left"] = time.time()
destroy_process_group()
print(json.dumps(report))
"""


def single() -> DistEnv:
    return derive_dist_env({})


@pytest.mark.parametrize(
    ("requested", "cuda", "asked", "expected"),
    [
        ("auto", True, None, "nccl"),  # torchrun on a workstation: visible CUDA decides
        ("auto", True, True, "nccl"),
        ("auto", True, False, "gloo"),  # the job asked for no GPUs: visible ones are not its own
        ("auto", False, None, "gloo"),
        ("gloo", True, True, "gloo"),
        ("gloo", False, None, "gloo"),
        ("nccl", True, None, "nccl"),
        ("nccl", True, False, "nccl"),  # explicit: a site that gives GPUs without GRES
    ],
)
def test_choose_backend(requested: str, cuda: bool, asked: bool | None, expected: str) -> None:
    assert choose_backend(requested, cuda, asked) == expected


def test_nccl_without_cuda_is_an_error() -> None:
    with pytest.raises(DistEnvError, match=r"dist.backend='nccl'.*HINT: .*gpus_per_task"):
        choose_backend("nccl", False)
    with pytest.raises(DistEnvError, match=r"dist.backend='mpi' is not one of auto, gloo, nccl"):
        choose_backend("mpi", True)


def ranked(local_rank: int, local_world: int, **extra: str) -> DistEnv:
    return derive_dist_env(
        {
            "RANK": str(local_rank),
            "WORLD_SIZE": str(local_world),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": "n1",
            **extra,
        }
    )


@pytest.mark.parametrize(
    ("local_rank", "local_world", "visible", "count", "per_task", "expected"),
    [
        (1, 4, "0,1", 0, None, "cpu"),  # torch sees no usable CUDA, or none the job asked for
        (1, 4, "1", 1, 1, "cuda:0"),  # --gpus-per-task=1: each task its own, seen as cuda:0
        (3, 4, "5", 1, 1, "cuda:0"),
        (3, 4, "2,3", 2, 2, "cuda:0"),  # --gpus-per-task=2: local rank 3 has its own pair
        (1, 2, "0,1", 2, None, "cuda:1"),  # --gpus-per-node=2: every task sees both
        (0, 4, "0,1,2,3", 4, None, "cuda:0"),
        (2, 4, None, 4, None, "cuda:2"),  # no CUDA_VISIBLE_DEVICES: all of the node's GPUs
        (3, 4, None, 8, None, "cuda:6"),  # 8 shared by 4 ranks: two each, on the first
        (2, 4, "0,1,2,3,4,5,6,7", 8, 2, "cuda:4"),  # 2 per task, but nothing bound them
        (0, 1, "0,1", 2, None, "cuda:0"),  # alone on its node
        (0, 1, "3", 1, None, "cuda:0"),
    ],
)
def test_choose_device_from_what_the_task_sees(
    local_rank: int,
    local_world: int,
    visible: str | None,
    count: int,
    per_task: int | None,
    expected: str,
) -> None:
    assert choose_device(ranked(local_rank, local_world), count, per_task, visible) == expected


@pytest.mark.parametrize(
    ("visible", "count", "per_task"),
    [
        ("0", 1, None),  # one GPU, 4 ranks, nothing binds them apart: "Duplicate GPU detected"
        ("0,1", 2, None),  # torchrun --nproc-per-node 4 on a 2-GPU machine
        ("0", 1, 2),  # 2 per task asked, 1 seen: not a set of its own either
    ],
)
def test_ranks_that_would_share_a_gpu_are_refused_before_nccl(
    visible: str, count: int, per_task: int | None
) -> None:
    with pytest.raises(DistEnvError) as info:
        choose_device(ranked(1, 4), count, per_task, visible)
    message = str(info.value)
    assert f"4 ranks on this node share {count} visible GPU(s)" in message
    assert f"CUDA_VISIBLE_DEVICES {visible!r}" in message
    assert "local rank 1 has no GPU of its own" in message
    assert message.endswith("or use slurm.gpus_per_task: 1.")
    assert "HINT: one rank per GPU" in message


SLURM_TASK = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"}


def seen_by_task(visible: str, on_node: str, **more: str) -> dict[str, str]:
    """A Slurm task's GPU variables: its CUDA_VISIBLE_DEVICES and the step's GPUs on its node."""
    return {**SLURM_TASK, "CUDA_VISIBLE_DEVICES": visible, "SLURM_GPUS_ON_NODE": on_node, **more}


@pytest.mark.parametrize(
    ("env", "asked", "per_task", "given"),
    [
        ({}, None, None, None),  # torchrun or a plain process: nobody says
        (SLURM_TASK, False, None, None),  # a Slurm job without GPUs
        ({**SLURM_TASK, "SLURM_GPUS_ON_NODE": "2"}, True, None, None),  # e.g. --gres=gpu:2
        # --exclusive on a GPU node, no GPUs asked: the step's tasks inherit the batch shell's
        # SLURM_JOB_GPUS and nothing else (Slurm 22.05): they were given no GPU
        ({**SLURM_TASK, "SLURM_JOB_GPUS": "0,1"}, False, None, None),
        ({**SLURM_TASK, "SLURM_GPUS_PER_TASK": "2", "SLURM_STEP_GPUS": "2,3"}, True, 2, None),
        ({**SLURM_TASK, "SLURM_GPUS_PER_TASK": "a100:1"}, True, 1, None),
        # What Slurm 22.05 set on the dev cluster's fake GPUs (2 per node, 2 tasks on a node):
        # a bare `srun --gpus-per-task=1` sets no SLURM_GPUS_PER_TASK, but binds each task
        (seen_by_task("1", on_node="2", SLURM_STEP_GPUS="1"), True, 1, None),
        # --gres=gpu:1: both tasks see the node's one GPU (refused by choose_device)
        (seen_by_task("0", on_node="1", SLURM_STEP_GPUS="0"), True, None, None),
        # --gpus-per-node=2: both see both
        (seen_by_task("0,1", on_node="2", SLURM_GPUS_PER_NODE="2"), True, None, None),
        # torchrun inside one Slurm task: its 4 processes share the task's GPUs
        ({**SLURM_TASK, "SLURM_NTASKS": "1", "SLURM_GPUS_PER_TASK": "4"}, True, None, None),
        ({LOCAL_GPUS_ENV: "0"}, False, None, 0),  # the local backend gave this rank none
        ({LOCAL_GPUS_ENV: "2"}, True, None, 2),  # ... a share of gpus_per_node
        ({LOCAL_GPUS_ENV: "1", LOCAL_GPUS_PER_TASK_ENV: "1"}, True, 1, 1),  # its own one
    ],
)
def test_the_gpus_a_task_was_given_come_from_its_launcher(
    env: dict[str, str], asked: bool | None, per_task: int | None, given: int | None
) -> None:
    grant = gpu_grant(ranked(1, 4), env)
    assert (grant.asked, grant.per_task, grant.given) == (asked, per_task, given)


def test_a_task_given_gpus_that_torch_cannot_see_is_refused() -> None:
    slurm = gpu_grant(ranked(1, 4), {**SLURM_TASK, "SLURM_GPUS_ON_NODE": "1"})
    with pytest.raises(DistEnvError) as info:
        check_grant(slurm, 0, "0", None)
    message = str(info.value)
    assert "the job gave this task GPUs (SLURM_GPUS_ON_NODE=1; CUDA_VISIBLE_DEVICES '0')" in message
    assert "HINT: install a CUDA build of torch" in message
    with pytest.raises(DistEnvError, match=r"torch \(CUDA 12.8\) finds no usable device. HINT"):
        check_grant(slurm, 0, "0", "12.8")
    local = gpu_grant(ranked(1, 4), {LOCAL_GPUS_ENV: "2"})
    with pytest.raises(DistEnvError) as info:
        check_grant(local, 1, "6,7", "12.8")  # CUDA dropped a GPU this machine lacks
    assert "the local backend gave this rank 2 GPU(s) (CUDA_VISIBLE_DEVICES '6,7')" in str(
        info.value
    )
    assert "but torch sees 1: it lists GPUs this machine lacks. HINT" in str(info.value)
    check_grant(local, 2, "6,7", "12.8")  # as given
    check_grant(gpu_grant(ranked(1, 4), SLURM_TASK), 0, None, None)  # none asked, none seen
    check_grant(gpu_grant(ranked(1, 4), {}), 0, None, None)  # nobody says: CPU is fine


def _join_alone(tmp_path: Path, env: dict[str, str]) -> ProcessGroupInfo:
    """One rank joins a one-rank group in this process (and leaves it again)."""
    try:
        return init_process_group(single(), DistConfig(), tmp_path, env)
    finally:
        destroy_process_group()


@pytest.mark.torch
def test_visible_gpus_the_job_did_not_ask_for_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm job without GPUs on a node whose GPUs it can see (no device cgroups): gloo on
    the CPU, never NCCL on another job's GPUs. torch is told it sees 2 GPUs."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("touched a GPU"))
    monkeypatch.setenv("MASTER_PORT", "1")  # not read for one rank; keeps os.environ sane
    info = _join_alone(tmp_path, {"SLURM_JOB_ID": "7"})
    assert (info.backend, info.device) == ("gloo", "cpu")


@pytest.mark.torch
def test_a_local_rank_given_a_gpu_it_cannot_see_stops_before_training(tmp_path: Path) -> None:
    """The local backend gave this rank a GPU; this machine's torch sees none: an error, not
    a silent CPU run of a GPU job."""
    # Which message depends on this torch's build (CPU-only, or CUDA without a device).
    given = r"gave this rank 1 GPU\(s\) \(CUDA_VISIBLE_DEVICES '0'\) but torch sees 0"
    asked = r"gave this task GPUs \(HPC_DDP_LOCAL_GPUS=1; CUDA_VISIBLE_DEVICES '0'\)"
    with pytest.raises(DistEnvError, match=f"{given}|{asked}"):
        _join_alone(tmp_path, {LOCAL_GPUS_ENV: "1", "CUDA_VISIBLE_DEVICES": "0"})


def test_importing_the_module_does_not_import_torch() -> None:
    code = (
        "import sys, hpc_ddp.runtime.procgroup; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_destroy_without_a_group_is_a_no_op() -> None:
    destroy_process_group()
    destroy_process_group()


def free_job_id(start: int) -> str:
    """A job id whose derived port and first fallbacks are free right now."""
    for j in range(start, start + 2000):
        if all(is_port_free(derive_master_port(str(j), 0, candidate=k)) for k in range(3)):
            return str(j)
    raise AssertionError("no free ports")


def rank_env(job_id: str, procid: int, world: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        {
            "SLURM_JOB_ID": job_id,
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid),
            "SLURM_NODEID": "0",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": str(world),
            "SLURM_STEP_TASKS_PER_NODE": str(world),
            "SLURM_STEP_NODELIST": "127.0.0.1",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def run_ranks(
    run_dir: Path, method: str, envs: list[dict[str, str]], timeout_s: int = 60
) -> list[subprocess.CompletedProcess[str]]:
    argv = ["-c", RANK_SCRIPT, str(run_dir), method, str(timeout_s)]
    started = [start_process(argv, env) for env in envs]
    ranks = Ranks([proc for proc, _ in started], [files for _, files in started])
    return [
        subprocess.CompletedProcess(argv, code, out, err)
        for code, out, err in ranks.wait(timeout_s + 60)
    ]


def reports(done: list[subprocess.CompletedProcess[str]]) -> list[dict[str, Any]]:
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    return [json.loads(d.stdout.strip().splitlines()[-1]) for d in done]


@pytest.mark.torch
@pytest.mark.parametrize(
    ("method", "world"),
    # env with 3 ranks: see the fallback test below.
    [("env", 2), ("tcp", 2), ("file", 2), ("tcp", 3), ("file", 3)],
)
def test_ranks_form_a_group_and_all_reduce(tmp_path: Path, method: str, world: int) -> None:
    job = free_job_id(200_000 + 3000 * world)
    got = reports(run_ranks(tmp_path, method, [rank_env(job, r, world) for r in range(world)]))
    assert [r["rank"] for r in got] == list(range(world))
    assert {r["sum"] for r in got} == {world * (world + 1) / 2}
    assert {r["world"] for r in got} == {world}
    assert {(r["backend"], r["device"]) for r in got} == {("gloo", "cpu")}
    (url,) = {r["init_method"] for r in got}
    derived = derive_master_port(job, 0)
    if method == "env":
        assert url == "env://"
        assert {r["env_port"] for r in got} == {str(derived)}
    elif method == "tcp":
        assert url == f"tcp://127.0.0.1:{derived}"
    else:
        assert url == f"file://{tmp_path}/rendezvous/pg.{job}.0"
        assert {r["port"] for r in got} == {None}
        # Whether torch's FileStore has unlinked its file by now is a race inside torch, not
        # a promise of ours: stores are named per attempt and never reused.


@pytest.mark.torch
def test_ranks_agree_on_a_fallback_when_the_derived_port_is_taken(tmp_path: Path) -> None:
    job = free_job_id(230_000)
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", derive_master_port(job, 0)))
        squatter.listen()
        got = reports(run_ranks(tmp_path, "env", [rank_env(job, r, 3) for r in range(3)]))
    assert {r["sum"] for r in got} == {6.0}
    assert {r["port"] for r in got} == {derive_master_port(job, 0, candidate=1)}


@pytest.mark.torch
def test_a_peer_that_comes_before_rank_0s_store_waits_in_the_backlog(tmp_path: Path) -> None:
    """Rank 0 listens, then takes 2 s to make its store: rank 1 connects meanwhile and joins."""
    job = free_job_id(250_000)
    envs = [rank_env(job, r, 2) for r in range(2)]
    envs[0]["SLOW_AFTER_LISTEN"] = "2"
    got = reports(run_ranks(tmp_path, "env", envs))
    assert {r["sum"] for r in got} == {3.0}
    assert {r["port"] for r in got} == {derive_master_port(job, 0)}


def test_rank_0_holds_the_port_it_listens_on() -> None:
    port = derive_master_port(free_job_id(260_000), 0)
    sock = _listen(port)
    try:
        assert not is_port_free(port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepted into the backlog before any store exists
        with pytest.raises(DistEnvError, match=f"cannot listen on master port {port}"):
            _listen(port)
    finally:
        sock.close()


@pytest.mark.torch
def test_ranks_that_leave_together_wait_for_the_last_one(tmp_path: Path) -> None:
    """Rank 1 comes 1.5 s late to leaving: rank 0 leaves only when it has come."""
    job = free_job_id(270_000)
    envs = [{**rank_env(job, r, 2), "LEAVE": "together"} for r in range(2)]
    envs[1]["SLEEP_BEFORE_LEAVING"] = "1.5"
    first, last = reports(run_ranks(tmp_path, "env", envs))
    assert last["arrived"] - first["arrived"] > 1.0
    assert first["left"] >= last["arrived"] - 0.05  # waited for the late one (clock: same host)


@pytest.mark.torch
def test_leaving_together_when_a_peer_has_gone_only_warns(tmp_path: Path) -> None:
    """Rank 1 leaves alone and exits; rank 0's barrier fails and it leaves anyway, exit 0."""
    job = free_job_id(280_000)
    envs = [rank_env(job, r, 2) for r in range(2)]
    envs[0].update(LEAVE="together", SLEEP_BEFORE_LEAVING="1")
    done = run_ranks(tmp_path, "env", envs, timeout_s=20)
    first, _ = reports(done)
    assert [r["rank"] for r in reports(done)] == [0, 1]
    assert "leaving the process group without the others" in done[0].stderr
    # The failed barrier did not wait out the 20 s timeout (timed by the rank itself: the
    # processes' start-up on a busy machine is no part of it).
    assert first["left"] - first["arrived"] < 10


@pytest.mark.torch
def test_a_single_process_still_gets_a_group(tmp_path: Path) -> None:
    env = {k: v for k, v in rank_env("1", 0, 1).items() if not k.startswith("SLURM_")}
    (got,) = reports(run_ranks(tmp_path, "env", [env]))
    assert (got["rank"], got["world"], got["sum"], got["init_method"]) == (0, 1, 1.0, "local")
    assert got["env_port"] == str(got["port"])
    assert not (tmp_path / "rendezvous").exists() or not list((tmp_path / "rendezvous").iterdir())


@pytest.mark.torch
def test_a_rank_whose_peer_never_comes_fails_within_the_timeout(tmp_path: Path) -> None:
    job = free_job_id(240_000)
    start = time.monotonic()
    (lonely,) = run_ranks(tmp_path, "tcp", [rank_env(job, 0, 2)], timeout_s=2)
    assert lonely.returncode != 0
    assert "DistStoreError" in lonely.stderr or "imed out" in lonely.stderr, lonely.stderr[-2000:]
    assert time.monotonic() - start < 30


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.parametrize("method", ["env", "file"])
def test_two_nodes_of_the_dev_cluster_form_a_group(
    slurm_cluster: Any, tmp_path: Path, method: str
) -> None:
    """srun -N2 --ntasks-per-node=2: real SLURM_* values, MASTER_ADDR=n1 through /etc/hosts."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**slurm_cluster.env, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [
            "srun",
            "-N2",
            "--ntasks-per-node=2",
            "-t",
            "2",
            sys.executable,
            str(script),
            str(tmp_path),
            method,
            "60",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = sorted(
        (json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in got] == [0, 1, 2, 3]
    assert {r["sum"] for r in got} == {10.0}


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


class _FakeDist:
    """What destroy_process_group asks of torch.distributed, recorded (no GPU here: the
    NCCL branch is pinned with the backend's name injected)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def get_backend(self) -> str:
        return self.backend

    def barrier(self) -> None:
        self.calls.append("barrier")

    def destroy_process_group(self) -> None:
        self.calls.append("destroy")


@pytest.mark.parametrize(
    ("backend", "together", "calls"),
    [
        ("nccl", False, []),  # an error path under NCCL: no teardown that could wait forever
        ("nccl", True, ["barrier", "destroy"]),
        ("gloo", False, ["destroy"]),
    ],
)
def test_an_error_path_never_tears_an_nccl_group_down(
    monkeypatch: pytest.MonkeyPatch, backend: str, together: bool, calls: list[str]
) -> None:
    fake = _FakeDist(backend)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    destroy_process_group(together=together)
    assert fake.calls == calls


def test_launches_of_one_attempt_never_share_a_port_file_or_a_derived_port() -> None:
    from hpc_ddp.runtime.procgroup import port_file

    env = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    first = derive_dist_env(env)
    again = derive_dist_env({**env, "HPC_DDP_LAUNCH": "1", "HPC_DDP_SUPERVISED": "1"})
    assert (first.attempt_key, again.attempt_key, again.supervised) == ("0", "0.1", True)
    assert port_file(first, Path("r")).name == "master_port.4242.0"  # as before launches
    assert port_file(again, Path("r")).name == "master_port.4242.0.1"
    candidates = {derive_master_port("4242", 0, candidate=c, launch=1) for c in range(4)}
    assert first.master_port != again.master_port
    assert first.master_port not in candidates


@pytest.mark.torch
def test_end_startup_uses_the_older_torchs_private_name_and_never_fails_without_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torch before 2.14 (the image's 2.13) has no public ``set_timeout``: its private name is
    used, and a torch with neither keeps the start-up bound with a warning."""
    import torch.distributed as tdist
    from torch.distributed import distributed_c10d

    from hpc_ddp.runtime.procgroup import end_startup

    set_to: list[float] = []
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "get_world_size", lambda group=None: 2)
    monkeypatch.delattr(tdist, "set_timeout", raising=False)
    monkeypatch.setattr(
        distributed_c10d, "_set_pg_timeout", lambda t, group=None: set_to.append(t.total_seconds())
    )
    end_startup(DistConfig(timeout_s=3))
    assert set_to == [3.0]
    monkeypatch.delattr(distributed_c10d, "_set_pg_timeout")
    end_startup(DistConfig(timeout_s=3))
    assert "cannot change a process group's timeout" in caplog.text
