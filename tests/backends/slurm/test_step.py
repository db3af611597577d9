"""A supervised launch as srun steps: the requeue that asks Slurm to avoid bad nodes."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import CompletedCommand
from hpc_ddp.backends.slurm.step import SrunLauncher, SrunStep
from tests.conftest import Cluster

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


@pytest.mark.slurm
def test_a_step_of_unknown_id_is_ended_by_srun_and_srun_is_never_killed(
    slurm_cluster: Cluster,
) -> None:
    """With no step id to scancel, the step is ended the way srun ends its own (a second SIGINT
    within a second: srun SIGKILLs every task and waits for their exits), and srun returns by
    itself. A step whose srun is SIGKILLed cannot report its tasks' exits, and slurmd then
    drains the node at the job's end ("Kill task failed")."""
    name = "hpc-ddp-step-test"
    argv = ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", "sleep", "300"]

    def no_steps(argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        return CompletedCommand(tuple(argv), 0, "", "")  # squeue -s knows no step

    step = SrunStep(argv, slurm_cluster.env, SlurmClient(no_steps), "1", out=io.StringIO())
    try:
        job = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not job:
            out = slurm_cluster.run("squeue", "-h", "-s", "-n", name, "-o", "%i", check=False)
            job = out.stdout.strip().split(".")[0]  # its step runs: the task is started
            time.sleep(0.2)
        assert job, "the srun step never started"
        step.kill({})
        code = step.proc.wait(timeout=20)  # well before the last resort's 30 s
        assert code != -signal.SIGKILL, "srun was killed, not let return"
        slurm_cluster.wait_gone(job)
    finally:
        if step.proc.poll() is None:
            step.proc.kill()
        step.proc.wait()
        step.poll()  # srun's every line read
        assert step.proc.stderr is not None
        step.proc.stderr.close()
