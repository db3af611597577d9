"""Slurm's node face beyond placement (``tests/runtime/test_distenv.py`` pins placement and
identity, ``tests/runtime/test_procgroup.py`` the GPU grant's table): what a rank asks it of
its CPUs, its partition and its step, read from the mapping it is given."""

from __future__ import annotations

import pytest

from hpc_ddp.backends.allocation import NO_GRANT
from hpc_ddp.backends.local.allocation import LocalAllocation
from hpc_ddp.backends.slurm.allocation import SlurmAllocation, owns_env, slurm_identity
from hpc_ddp.rundir.layout import LOCAL_GPUS_ENV, LOCAL_GPUS_PER_TASK_ENV

JOB = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}


@pytest.mark.parametrize(
    ("more", "cpus"),
    [({"SLURM_CPUS_PER_TASK": "6"}, 6), ({"SLURM_CPUS_PER_TASK": ""}, None),
     ({"SLURM_CPUS_PER_TASK": "0"}, None), ({"SLURM_CPUS_PER_TASK": "two"}, None), ({}, None)],
)  # fmt: skip
def test_the_cpus_slurm_gave_each_task(more: dict[str, str], cpus: int | None) -> None:
    assert SlurmAllocation({**JOB, **more}).cpus_per_task() == cpus


def test_the_partition_and_the_step() -> None:
    env = {**JOB, "SLURM_JOB_PARTITION": "gpu", "SLURM_STEP_ID": "3"}
    assert SlurmAllocation(env).pool() == "gpu"
    assert SlurmAllocation(JOB).pool() is None
    assert slurm_identity(env).step_id == "3"
    assert slurm_identity(JOB).step_id is None


def test_a_slurm_job_is_told_by_its_own_variables_only() -> None:
    assert owns_env(JOB)
    assert not owns_env({"SLURM_CPUS_PER_TASK": "6"})  # not a variable that makes a job Slurm's
    assert not owns_env({})


def test_this_machine_says_what_the_local_backend_gave_and_nothing_else() -> None:
    assert LocalAllocation().gpu_grant(0, 1) == NO_GRANT
    given = LocalAllocation({LOCAL_GPUS_ENV: "2", LOCAL_GPUS_PER_TASK_ENV: "1"}).gpu_grant(0, 2)
    assert (given.asked, given.given, given.per_task) == (True, 2, 1)
    none = LocalAllocation({LOCAL_GPUS_ENV: ""}).gpu_grant(0, 1)
    assert (none.asked, none.given) == (False, 0)
    assert (LocalAllocation().cpus_per_task(), LocalAllocation().pool()) == (None, None)
