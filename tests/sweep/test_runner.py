"""The sweep layer's face of each backend: job arrays on Slurm, a sweep controller locally."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpc_ddp.backends.local.sweeps import ControllerSweeps
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.backend import SlurmBackend
from hpc_ddp.backends.slurm.sweeps import ArraySweeps
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.state.task import TaskState
from hpc_ddp.sweep.runner import SweepRunner
from tests.sweep.test_results import fabricate


def _manifest(path: Path, backend: str, job_id: str | None) -> None:
    write_manifest(
        RunPaths(path),
        Manifest(name="demo", backend=backend, job_id=job_id, submitted_at="2026-01-01T00:00:00",
                 command=[], config_source="/x/sweep.yaml", run_dir=str(path)),
    )  # fmt: skip


@pytest.mark.parametrize("runner", [ArraySweeps, ControllerSweeps])
def test_each_runner_implements_every_member(runner: type) -> None:
    for name, member in vars(SweepRunner).items():
        if name.startswith("_") or not (callable(member) or isinstance(member, property)):
            continue
        mine = inspect.getattr_static(runner, name)
        if isinstance(member, property):
            assert isinstance(mine, property), name
            continue
        assert list(inspect.signature(mine).parameters) == list(
            inspect.signature(member).parameters
        ), name


def test_the_registry_picks_the_runner_the_sweeps_manifest_names(tmp_path: Path) -> None:
    sweep = fabricate(tmp_path)
    assert isinstance(Registry().sweeps_of(sweep), ArraySweeps)  # no manifest: Slurm's, as always
    _manifest(sweep, "slurm", None)
    assert isinstance(Registry().sweeps_of(sweep), ArraySweeps)
    _manifest(sweep, "local", "4711")
    assert isinstance(Registry().sweeps_of(sweep), ControllerSweeps)
    assert Registry().sweeps_of(sweep).backend == "local"


def test_the_job_of_each_point(tmp_path: Path) -> None:
    """An array task from arrays.json; a local run's job id from its own manifest."""
    sweep = fabricate(tmp_path, n=3)
    assert ArraySweeps(SlurmBackend()).task_jobs(sweep, [0, 1, 2]) == {
        0: "10_0",
        1: "10_1",
        2: "10_2",
    }
    _manifest(sweep / "tasks" / "1", "local", "99")
    assert ControllerSweeps(Registry()).task_jobs(sweep, [0, 1, 2]) == {1: "99"}


def test_a_local_sweeps_points_are_judged_without_a_queue(tmp_path: Path) -> None:
    """No controller runs, nothing was cancelled: a point never started failed (the controller
    died), whatever squeue says of array job 10."""
    sweep = fabricate(tmp_path, n=2)
    _manifest(sweep, "local", "4711")
    words = ControllerSweeps(Registry()).task_words(sweep, [0, 1], {}, {})
    assert words == [(TaskState.FAILED, None, None), (TaskState.FAILED, None, None)]
    assert ControllerSweeps(Registry()).settled(sweep)
    assert "local sweep controller" in str(ControllerSweeps(Registry()).busy(sweep, {0: "1"}))
    assert "array job(s) 10" in str(ArraySweeps(SlurmBackend()).busy(sweep, {0: "10_0"}))


def test_a_new_sweep_runs_as_many_points_at_once_as_its_backend_allows() -> None:
    """Slurm's arrays are throttled by max_parallel alone (None: no throttle); the local
    controller runs max_parallel at once, or its default when none is given."""
    from hpc_ddp.backends.local.sweep_controller import DEFAULT_LOCAL_PARALLEL

    throttled = SimpleNamespace(max_parallel=3)
    free = SimpleNamespace(max_parallel=None)
    assert isinstance(Registry().sweeps("slurm"), ArraySweeps)
    assert isinstance(Registry().sweeps("local"), ControllerSweeps)
    assert Registry().sweeps("slurm").at_once(throttled) == 3  # type: ignore[arg-type]
    assert Registry().sweeps("slurm").at_once(free) is None  # type: ignore[arg-type]
    assert Registry().sweeps("local").at_once(throttled) == 3  # type: ignore[arg-type]
    assert Registry().sweeps("local").at_once(free) == DEFAULT_LOCAL_PARALLEL  # type: ignore[arg-type]
