"""The supervisor's local launches (:mod:`hpc_ddp.backends.local.launcher`): real rank processes."""

from __future__ import annotations

import subprocess

from hpc_ddp.backends.local.launcher import LOCAL_LAUNCHER, LocalStep
from hpc_ddp.fault.blame import assign_blame
from hpc_ddp.fault.supervisor import _task_ends
from hpc_ddp.rundir.endcause import EndCause


def test_a_killed_local_rank_is_blamed_in_the_local_launchers_words_not_srun() -> None:
    """The supervisor saw the rank die through ``waitpid``: there was no srun to say so, and
    the blame does not claim there was (it said ``Killed (srun)``)."""
    ok = subprocess.Popen(["true"])
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()
    step = LocalStep([ok, killed], [])
    ok.wait()
    killed.wait()
    ends = _task_ends(step)  # as the supervisor reads them
    assert [(e.rank, e.node, e.reason, e.said_by) for e in ends] == [
        (1, "local", "Killed", LOCAL_LAUNCHER)
    ]
    found = assign_blame(2, {0: None, 1: None}, task_ends=ends, now=1.0)
    assert found.cause is EndCause.CRASH
    assert found.blame.describe() == "rank 1 on local: Killed (local launcher)"
