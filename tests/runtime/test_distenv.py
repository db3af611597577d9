"""Deriving rank, world, master address and port from explicit environment mappings.

The Slurm mappings are trimmed copies of what tasks saw on the real dev cluster (Slurm 22.05):
``srun`` inside ``sbatch -N2 --ntasks-per-node=2``, ``-N2 -n3``, ``srun -N1 -w n2`` inside a
two-node job, and a two-task array.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from hpc_ddp.backends.ports import PORT_BASE, PORT_SLOTS
from hpc_ddp.backends.slurm.allocation import array_task_index
from hpc_ddp.errors import DistEnvError
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env, derive_master_port


@pytest.fixture(autouse=True)
def _no_env_leak() -> Iterator[None]:
    """Fail any test that leaves os.environ changed (derivation must only read its mapping)."""
    before = _environ()
    yield
    assert _environ() == before, "the test changed os.environ"


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def slurm(
    ids: str,
    ntasks: int,
    nodelist: str,
    tasks_per_node: str,
    node: str,
    **extra: str,
) -> dict[str, str]:
    """One srun task's variables, as Slurm 22.05 sets them; ``ids`` is PROCID/LOCALID/NODEID."""
    procid, localid, nodeid = ids.split("/")
    env = {
        "SLURM_JOB_ID": "1001",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_PROCID": procid,
        "SLURM_LOCALID": localid,
        "SLURM_NODEID": nodeid,
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": node,
    }
    env.update(extra)
    return env


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29500",
}

CASES: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    (
        "1 node x 1 task",
        slurm("0/0/0", 1, "n1", "1", "n1"),
        dict(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            master_addr="n1",
            launcher="slurm",
            nodelist=("n1",),
            job_ref="1001",
        ),
    ),
    (
        "1 node x 2 tasks, rank 1",
        slurm("1/1/0", 2, "n1", "2", "n1"),
        dict(
            rank=1,
            local_rank=1,
            world_size=2,
            local_world_size=2,
            node_rank=0,
            master_addr="n1",
            is_main=False,
        ),
    ),
    (
        "2 nodes x 1 task, rank 1",
        slurm("1/0/1", 2, "n[1-2]", "1(x2)", "n2"),
        dict(
            rank=1,
            local_rank=0,
            world_size=2,
            local_world_size=1,
            node_rank=1,
            master_addr="n1",
            node_name="n2",
            nodelist=("n1", "n2"),
        ),
    ),
    (
        "2 nodes x 2 tasks, rank 3",
        slurm("3/1/1", 4, "n[1-2]", "2(x2)", "n2"),
        dict(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, master_addr="n1"),
    ),
    (
        "3 tasks on 2 nodes (2,1), rank 2",
        slurm("2/0/1", 3, "n[1-2]", "2,1", "n2"),
        dict(rank=2, local_rank=0, world_size=3, local_world_size=1, node_rank=1),
    ),
    (
        "zero-padded nodes, 8 tasks on 4 nodes, rank 5",
        slurm("5/1/2", 8, "gpu-[01-04]", "2(x4)", "gpu-03"),
        dict(rank=5, local_rank=1, node_rank=2, local_world_size=2, master_addr="gpu-01"),
    ),
    (
        "a one-node step inside a two-node job runs on the step's node",
        {
            **slurm("0/0/0", 1, "n2", "1", "n2"),
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_NODELIST": "n[1-2]",
        },
        dict(master_addr="n2", nodelist=("n2",), world_size=1),
    ),
    (
        "array task 1 whose job id is the array's own",
        slurm(
            "0/0/0",
            1,
            "n2",
            "1",
            "n2",
            SLURM_JOB_ID="12",
            SLURM_ARRAY_JOB_ID="12",
            SLURM_ARRAY_TASK_ID="1",
        ),
        dict(job_id="12", array_job_id="12", array_task_id="1", job_ref="12_1"),
    ),
    (
        "array task 0 with its own job id",
        slurm(
            "0/0/0",
            1,
            "n1",
            "1",
            "n1",
            SLURM_JOB_ID="13",
            SLURM_ARRAY_JOB_ID="12",
            SLURM_ARRAY_TASK_ID="0",
        ),
        dict(job_id="13", job_ref="12_0"),
    ),
    (
        "requeued twice",
        slurm("0/0/0", 2, "n1", "2", "n1", SLURM_RESTART_COUNT="2"),
        dict(restart_count=2, master_port=derive_master_port("1001", 2)),
    ),
    (
        "first attempt: SLURM_RESTART_COUNT unset",
        slurm("0/0/0", 2, "n1", "2", "n1"),
        dict(restart_count=0, master_port=derive_master_port("1001", 0), port_source="derived"),
    ),
    (
        "a MASTER_PORT left in a Slurm task's environment is ignored",
        slurm("0/0/0", 2, "n1", "2", "n1", MASTER_PORT="29500"),
        dict(master_port=derive_master_port("1001", 0), port_source="derived"),
    ),
    (
        "SLURM_NTASKS alone (no step variables)",
        {
            k: v
            for k, v in slurm("1/1/0", 2, "n1", "2", "n1").items()
            if "STEP_N" not in k and "STEP_TASKS" not in k
        },
        dict(rank=1, world_size=2, local_world_size=2, master_addr="n1"),
    ),
    (
        "a lone task in a batch script (no srun step)",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "1",
            "SLURM_JOB_NODELIST": "n1",
            "SLURM_TASKS_PER_NODE": "1",
            "SLURMD_NODENAME": "n1",
        },
        dict(rank=0, world_size=1, launcher="slurm", master_addr="n1"),
    ),
    (
        "torchrun under srun: torchrun's variables win, Slurm's ids stay",
        {**slurm("1/0/1", 2, "n[1-2]", "1(x2)", "n2", SLURM_RESTART_COUNT="1"), **TORCHRUN},
        dict(
            rank=3,
            local_rank=1,
            world_size=4,
            local_world_size=2,
            node_rank=1,
            master_addr="n1",
            master_port=29500,
            port_source="launcher",
            launcher="torchrun",
            job_id="1001",
            restart_count=1,
            nodelist=("n1", "n2"),
        ),
    ),
    (
        "torchrun alone",
        TORCHRUN,
        dict(rank=3, launcher="torchrun", job_id=None, job_ref=None, nodelist=(), node_name=None),
    ),
    (
        "hpc-ddp's local backend: torchrun's variables, its own launcher named",
        {**TORCHRUN, "HPC_DDP_LOCAL_JOB": "4242"},
        dict(rank=3, launcher="local", job_id=None, job_ref=None),
    ),
    (
        "a command child of hpc-ddp run under srun: the task's own place, Slurm's launch",
        {
            **slurm("1/0/1", 2, "n[1-2]", "1(x2)", "n2"),
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "23456",
            "HPC_DDP_TASK_LAUNCHER": "slurm",
        },
        dict(rank=1, world_size=2, launcher="slurm", port_source="launcher", job_id="1001"),
    ),
    (
        "torchrun started by such a child: its workers' variables, torchrun named",
        {
            **slurm("1/0/1", 2, "n[1-2]", "1(x2)", "n2"),
            **TORCHRUN,
            "HPC_DDP_TASK_LAUNCHER": "slurm",
            "TORCHELASTIC_RUN_ID": "none",
        },
        dict(rank=3, world_size=4, launcher="torchrun"),
    ),
    (
        "torchrun without LOCAL_WORLD_SIZE, MASTER_PORT or GROUP_RANK",
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1"},
        dict(
            local_world_size=2,
            node_rank=0,
            master_addr="10.0.0.1",
            port_source="derived",
            master_port=derive_master_port(None, 0),
        ),
    ),
    (
        "RANK=0 WORLD_SIZE=1 needs nothing else",
        {"RANK": "0", "WORLD_SIZE": "1"},
        dict(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", launcher="torchrun"),
    ),
    (
        "no launcher",
        {},
        dict(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            master_addr="127.0.0.1",
            launcher="single",
            job_id=None,
            restart_count=0,
            nodelist=(),
            is_main=True,
            job_ref=None,
        ),
    ),
    (
        "no launcher inside an salloc shell keeps the job id",
        {"SLURM_JOB_ID": "55", "SLURM_JOB_NODELIST": "n1"},
        dict(launcher="single", job_id="55", world_size=1, master_addr="127.0.0.1"),
    ),
]


@pytest.mark.parametrize(("env", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_derive_dist_env(env: dict[str, str], expected: dict[str, Any]) -> None:
    dist = derive_dist_env(env)
    actual = {key: getattr(dist, key) for key in expected}
    assert actual == expected


def test_config_port_beats_derivation_but_not_torchrun() -> None:
    env = slurm("0/0/0", 2, "n1", "2", "n1")
    dist = derive_dist_env(env, port=23456)
    assert (dist.master_port, dist.port_source) == (23456, "config")
    dist = derive_dist_env({**env, **TORCHRUN}, port=23456)
    assert (dist.master_port, dist.port_source) == (29500, "launcher")


def test_as_environ() -> None:
    dist = derive_dist_env(slurm("3/1/1", 4, "n[1-2]", "2(x2)", "n2"), port=24000)
    assert dist.as_environ() == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "24000",
    }
    # Round trip: what as_environ writes, derive_dist_env reads back as the same ranks.
    again = derive_dist_env(dist.as_environ())
    for field in (
        "rank",
        "local_rank",
        "world_size",
        "local_world_size",
        "node_rank",
        "master_addr",
        "master_port",
    ):
        assert getattr(again, field) == getattr(dist, field)


BAD: list[tuple[str, dict[str, str], list[str]]] = [
    (
        "RANK/WORLD_SIZE left in the environment srun passed to a 2-task step",
        {**slurm("1/0/1", 2, "n[1-2]", "1(x2)", "n2"), "RANK": "0", "WORLD_SIZE": "1"},
        ["RANK=0 WORLD_SIZE=1", "SLURM_STEP_NUM_TASKS=2", "unset RANK WORLD_SIZE"],
    ),
    (
        "PROCID >= NTASKS",
        slurm("4/0/1", 4, "n[1-2]", "2(x2)", "n2"),
        ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"],
    ),
    (
        "LOCALID >= tasks on the node",
        slurm("3/2/1", 4, "n[1-2]", "2(x2)", "n2"),
        ["SLURM_LOCALID=2", "SLURM_STEP_TASKS_PER_NODE='2(x2)'"],
    ),
    (
        "NODEID outside the node list",
        slurm("1/0/2", 2, "n[1-2]", "1(x2)", "n2"),
        ["SLURM_NODEID=2", "SLURM_STEP_NODELIST='n[1-2]'"],
    ),
    (
        "PROCID not an integer",
        slurm("0/0/0", 1, "n1", "1", "n1", SLURM_PROCID="zero"),
        ["SLURM_PROCID='zero'", "not an integer"],
    ),
    (
        "NTASKS zero",
        slurm("0/0/0", 1, "n1", "1", "n1", SLURM_STEP_NUM_TASKS="0"),
        ["SLURM_STEP_NUM_TASKS='0'"],
    ),
    (
        "negative LOCALID",
        slurm("0/0/0", 1, "n1", "1", "n1", SLURM_LOCALID="-1"),
        ["SLURM_LOCALID='-1'"],
    ),
    (
        "RESTART_COUNT not an integer",
        slurm("0/0/0", 1, "n1", "1", "n1", SLURM_RESTART_COUNT="once"),
        ["SLURM_RESTART_COUNT='once'"],
    ),
    (
        "tasks per node for the wrong node count",
        slurm("0/0/0", 2, "n1", "1(x2)", "n1"),
        ["SLURM_STEP_TASKS_PER_NODE='1(x2)'", "SLURM_STEP_NODELIST='n1'"],
    ),
    (
        "tasks per node summing to the wrong total",
        slurm("0/0/0", 3, "n[1-2]", "1(x2)", "n1"),
        ["SLURM_STEP_TASKS_PER_NODE='1(x2)'", "SLURM_STEP_NUM_TASKS=3"],
    ),
    (
        "malformed tasks per node",
        slurm("0/0/0", 2, "n1", "2x", "n1"),
        ["SLURM_STEP_TASKS_PER_NODE='2x'"],
    ),
    ("malformed node list", slurm("0/0/0", 2, "n[1-", "2", "n1"), ["'n[1-'"]),
    (
        "no node list for two tasks",
        {k: v for k, v in slurm("0/0/0", 2, "n1", "2", "n1").items() if "NODELIST" not in k},
        ["SLURM_STEP_NUM_TASKS=2", "SLURM_STEP_NODELIST"],
    ),
    (
        "node list not this step's",
        slurm("0/0/0", 1, "n1", "1", "n2"),
        ["SLURM_NODEID=0", "'n1'", "SLURMD_NODENAME='n2'"],
    ),
    (
        "NODEID missing for two tasks",
        {k: v for k, v in slurm("0/0/0", 2, "n1", "2", "n1").items() if k != "SLURM_NODEID"},
        ["SLURM_NODEID is not set"],
    ),
    (
        "the batch script of a 4-task job",
        {
            "SLURM_JOB_ID": "11",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "4",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURMD_NODENAME": "n1",
        },
        ["SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_STEP_ID", "srun"],
    ),
    ("RANK without WORLD_SIZE", {"RANK": "0", "MASTER_ADDR": "n1"}, ["RANK='0'", "WORLD_SIZE"]),
    ("WORLD_SIZE without RANK", {"WORLD_SIZE": "2"}, ["WORLD_SIZE='2'", "RANK is not"]),
    ("RANK >= WORLD_SIZE", {**TORCHRUN, "RANK": "4"}, ["RANK=4", "WORLD_SIZE=4"]),
    (
        "LOCAL_RANK >= LOCAL_WORLD_SIZE",
        {**TORCHRUN, "LOCAL_RANK": "2"},
        ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"],
    ),
    (
        "LOCAL_RANK missing with two ranks",
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1"},
        ["LOCAL_RANK is not set"],
    ),
    (
        "MASTER_ADDR missing with two ranks",
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
        ["RANK=0", "WORLD_SIZE=2", "MASTER_ADDR"],
    ),
    ("MASTER_PORT not an integer", {**TORCHRUN, "MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
    ("WORLD_SIZE not an integer", {**TORCHRUN, "WORLD_SIZE": "4.0"}, ["WORLD_SIZE='4.0'"]),
    ("array task id not a number", {**TORCHRUN, "SLURM_ARRAY_TASK_ID": "abc"},
     ["SLURM_ARRAY_TASK_ID='abc' is not an integer"]),
    ("array task id garbled in a Slurm task", {"SLURM_PROCID": "0", "SLURM_ARRAY_TASK_ID": "3x"},
     ["SLURM_ARRAY_TASK_ID='3x' is not an integer"]),
    ("a digit int() takes but Slurm never writes", {**TORCHRUN, "RANK": "\u0661"},
     ["RANK='\u0661' is not an integer"]),
    ("underscores", {**TORCHRUN, "WORLD_SIZE": "1_0"}, ["WORLD_SIZE='1_0'"]),
    ("five thousand digits", {**TORCHRUN, "WORLD_SIZE": "9" * 5000}, ["WORLD_SIZE='9999"]),
]  # fmt: skip


@pytest.mark.parametrize(("env", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_derive_dist_env_rejects(env: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(DistEnvError) as info:
        derive_dist_env(env)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert re.search(r"HINT: [^\n]+$", message), message


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_derive_dist_env_rejects_config_port(port: int) -> None:
    with pytest.raises(DistEnvError, match=rf"dist.port={port} .*HINT:"):
        derive_dist_env({}, port=port)


def test_derived_port_is_deterministic_and_below_the_ephemeral_range() -> None:
    ports = {derive_master_port(str(j), r) for j in range(0, 50_000, 7) for r in range(6)}
    assert min(ports) >= PORT_BASE
    assert max(ports) < PORT_BASE + PORT_SLOTS <= 32768
    assert derive_master_port("424242", 1) == derive_master_port("424242", 1)
    # The permutation reaches every slot: no part of the range is wasted.
    assert len({derive_master_port(str(j), 0) for j in range(PORT_SLOTS)}) == PORT_SLOTS


@pytest.mark.parametrize("first_id", [1, 4_096, 123_457, 9_999_000, 2**31 - 1000])
@pytest.mark.parametrize("attempts", [3, 6])
def test_consecutive_jobs_and_requeues_never_share_a_port(first_id: int, attempts: int) -> None:
    """1000 consecutive job ids x every attempt up to 6 (max_requeues=5): all ports differ."""
    ports = [
        derive_master_port(str(j), r)
        for j in range(first_id, first_id + 1000)
        for r in range(attempts)
    ]
    assert len(set(ports)) == len(ports)


def test_every_attempt_and_array_task_gets_its_own_port() -> None:
    task0 = derive_dist_env(
        slurm(
            "0/0/0",
            2,
            "n1",
            "2",
            "n1",
            SLURM_JOB_ID="13",
            SLURM_ARRAY_JOB_ID="12",
            SLURM_ARRAY_TASK_ID="0",
        )
    )
    task1 = derive_dist_env(
        slurm(
            "0/0/0",
            2,
            "n1",
            "2",
            "n1",
            SLURM_JOB_ID="12",
            SLURM_ARRAY_JOB_ID="12",
            SLURM_ARRAY_TASK_ID="1",
        )
    )
    requeued = derive_dist_env(
        slurm(
            "0/0/0",
            2,
            "n1",
            "2",
            "n1",
            SLURM_JOB_ID="13",
            SLURM_ARRAY_JOB_ID="12",
            SLURM_ARRAY_TASK_ID="0",
            SLURM_RESTART_COUNT="1",
        )
    )
    assert len({task0.master_port, task1.master_port, requeued.master_port}) == 3
    assert {derive_master_port(None, r) for r in range(3)} == {
        derive_master_port("local", r) for r in range(3)
    }
    assert len({derive_master_port("local", r) for r in range(3)}) == 3


def test_fallback_candidates_are_deterministic_and_distinct() -> None:
    first = [derive_master_port("1001", 0, candidate=k) for k in range(9)]
    assert first == [derive_master_port("1001", 0, candidate=k) for k in range(9)]
    assert len(set(first)) == 9
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SLOTS for p in first)
    # The fallbacks are not the next job's ports.
    neighbours = {derive_master_port(str(j), 0) for j in range(1002, 1010)}
    assert not neighbours & set(first[1:])


def test_dist_env_is_frozen() -> None:
    dist = derive_dist_env({})
    assert isinstance(dist, DistEnv)
    with pytest.raises(AttributeError):
        dist.rank = 1  # type: ignore[misc]


def test_rank_zero_must_be_on_the_first_node() -> None:
    env = slurm("0/0/1", 2, "n[1-2]", "1(x2)", "n2")
    with pytest.raises(DistEnvError, match=r"SLURM_PROCID=0 runs on SLURM_NODEID=1.*HINT:"):
        derive_dist_env(env)


@pytest.mark.parametrize(
    ("env", "index"),
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": ""}, None),
        ({"SLURM_ARRAY_TASK_ID": "7"}, 7),
        ({"SLURM_ARRAY_TASK_ID": "7", "HPC_DDP_ARRAY_OFFSET": "1001"}, 1008),
        ({"HPC_DDP_ARRAY_OFFSET": "1001"}, None),  # not an array task: the offset is unused
    ],
)
def test_array_task_index(env: dict[str, str], index: int | None) -> None:
    assert array_task_index(env) == index


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SLURM_ARRAY_TASK_ID": "abc"}, "SLURM_ARRAY_TASK_ID='abc' is not an integer"),
        ({"SLURM_ARRAY_TASK_ID": "2", "HPC_DDP_ARRAY_OFFSET": "1e3"},
         "HPC_DDP_ARRAY_OFFSET='1e3' is not an integer"),
        ({"SLURM_ARRAY_TASK_ID": "-2"}, "SLURM_ARRAY_TASK_ID='-2' is below 0"),
    ],
)  # fmt: skip
def test_array_task_index_rejects(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(DistEnvError) as info:
        array_task_index(env)
    assert fragment in str(info.value)
    assert "HINT:" in str(info.value)
