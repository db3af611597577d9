"""A supervised launch as srun steps: the requeue that asks Slurm to avoid bad nodes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import CompletedCommand
from hpc_ddp.backends.slurm.step import SrunLauncher

SIGTERMS_ITSELF = "import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.1)"


def test_the_exclusion_after_a_requeue_outlives_slurms_sigterm() -> None:
    """Slurm SIGTERMs every process of the batch step once the requeue is accepted, the
    ``scontrol update ExcNodeList`` started right after it included. Here that update is a
    real process that gets the SIGTERM: it must finish, and the job keep its ExcNodeList."""
    fake = FakeSlurm()
    fake.add_job("7", state=JobState.RUNNING, fields={"Partition": "debug", "NumNodes": "2"})
    fake.node_states = {"n1": "idle", "n2": "down*", "n3": "idle"}
    killed: list[int] = []

    def runner(argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        if list(argv[:2]) == ["scontrol", "update"]:
            # What Slurm does to the batch step's processes at that moment. (Not a shell: sh
            # clears its signal mask as it starts; scontrol, like this child, keeps it.)
            child = subprocess.run([sys.executable, "-c", SIGTERMS_ITSELF], check=False)
            killed.append(child.returncode)
            if child.returncode != 0:
                return CompletedCommand(tuple(argv), child.returncode, "", "")
        return fake(argv, timeout=timeout)

    launcher = SrunLauncher(
        ["srun", "true"], SlurmClient(runner), job_id="7", job_ref="7", nodes=["n1", "n2"]
    )
    assert launcher.requeue(["n2"]) is None
    assert killed == [0]
    assert fake.jobs["7"].fields["ExcNodeList"] == "n2"
    assert fake.jobs["7"].restart_count == 1
