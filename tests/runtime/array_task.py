"""The environment Slurm gives task 0 of array task ``77_3`` (job 78) on node n1: the unit
tests of requeue, entry and session run "inside" it against the shipped FakeSlurm."""

from __future__ import annotations

REF = "77_3"
"""How Slurm names this array task (``ARRAYJOB_TASK``): what a requeue must ask for."""

TASK = {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_JOB_ID": "78",
    "SLURM_ARRAY_JOB_ID": "77",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_JOB_NODELIST": "n1",
    "SLURMD_NODENAME": "n1",
    "SLURM_STEP_ID": "0",
}
