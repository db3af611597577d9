"""``benchmarks/bench_goodput.py``'s short schedule on the real 3-node cluster: a node lost, a
rank SIGKILLed and a rank SIGSTOPped, a minute apart, in one job (the full 30-minute schedule, with
a preemption and ``scontrol requeue`` too, is the benchmark's). Every fault is restarted inside
the allocation from the survivor's save: no step trained twice, and the final weights are the
uninterrupted twin's (trained meanwhile on the local backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_goodput
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.mark.timeout(1200)  # four minutes of training, three restarts, a busy machine
def test_three_faults_a_minute_apart_cost_no_step_and_end_as_the_twin(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    schedule = bench_goodput.plan(bench_goodput.SEED, short=True)
    assert [f.kind for f in schedule.faults] == ["node", "kill", "stop"]
    outcome = bench_goodput.run(
        schedule, accounting_cluster.env, accounting_cluster.state_dir, tmp_path
    )
    targets = bench_goodput.check(outcome, short=True)
    if targets.missed:
        stories = [e2e.story(run, tail=30) for run in sorted((tmp_path / "runs").iterdir())]
        raise AssertionError(f"missed {targets.missed}:\n" + "\n".join(stories))
