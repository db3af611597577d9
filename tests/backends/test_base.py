"""The backend interface: both backends implement both faces, and the registry picks the one a
run's manifest names. Real backend objects throughout (Slurm's commands go to FakeSlurm, the
scripted runner, which is a runner, not the backend)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from hpc_ddp.backends.base import Backend, Cancel, Held, Launcher, PlanRequest, Postmortem, Word
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.local.backend import LocalBackend
from hpc_ddp.backends.local.launcher import LocalLauncher
from hpc_ddp.backends.local.login_face import LocalHeld
from hpc_ddp.backends.ranklogs import RankLogsOnly
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.backends.slurm.backend import SlurmBackend
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.postmortem import SrunPostmortem
from hpc_ddp.backends.slurm.step import SrunLauncher
from hpc_ddp.config.load import load_job_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest

REPO = Path(__file__).parents[2]


def _members(protocol: type) -> dict[str, object]:
    """The protocol's own methods and properties, by name."""
    return {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def _parameters(member: object) -> list[str]:
    function = member.fget if isinstance(member, property) else member
    assert callable(function)
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize(
    ("face", "some", "implementations"),
    [
        (Backend, {"plan", "start", "states", "cancel", "name"}, (SlurmBackend, LocalBackend)),
        (Launcher, {"start", "nodes", "down", "requeue"}, (SrunLauncher, LocalLauncher)),
        (Postmortem, {"failed_rank", "no_log"}, (SrunPostmortem, RankLogsOnly)),
        (Held, {"started", "ended", "wait", "stop", "force"}, (LocalHeld,)),
    ],
)
def test_each_backend_implements_each_face_member_by_member(
    face: type, some: set[str], implementations: tuple[type, ...]
) -> None:
    """mypy checks the types (the registry returns each as a Backend; the supervisor takes each
    launcher as a Launcher); this checks that no member is missing or takes other arguments."""
    members = _members(face)
    assert some <= set(members)
    for cls in implementations:
        for name, member in members.items():
            mine = inspect.getattr_static(cls, name, None)
            assert mine is not None, f"{cls.__name__} lacks {name}"
            assert isinstance(mine, property) == isinstance(member, property), (cls, name)
            assert _parameters(mine) == _parameters(member), (cls, name)


def _manifest(backend: str, job_id: str | None = "123", **more: object) -> Manifest:
    return Manifest(
        name="demo", backend=backend, job_id=job_id, submitted_at="", command=[],
        config_source="jobs/quickstart.yaml", run_dir="/nowhere", **more,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_registry_picks_the_manifests_backend_and_hands_slurm_the_client() -> None:
    fake = FakeSlurm()
    client = fake.client()
    local = Registry(client).backend(_manifest("local"))
    slurm = Registry(client).backend(_manifest("slurm"))
    assert isinstance(local, LocalBackend)
    assert local.name == "local"
    assert isinstance(slurm, SlurmBackend)
    assert slurm.name == "slurm"
    assert slurm.client is client
    assert isinstance(Registry().backend("local"), LocalBackend)
    assert isinstance(Registry().backend("slurm"), SlurmBackend)


def test_the_registry_picks_what_each_backends_logs_say_and_what_it_holds(tmp_path: Path) -> None:
    """srun's words for a Slurm job; a local run's tasks leave only their rank logs. Only a
    local run is held by this process (waited on and stopped here), with its cancel's grace."""
    registry = Registry()
    assert isinstance(registry.postmortem(_manifest("slurm")), SrunPostmortem)
    assert isinstance(registry.postmortem("local"), RankLogsOnly)
    assert registry.postmortem("slurm").no_log(tmp_path) is not None  # no batch log at all
    (tmp_path / "batch-7.err").write_text("srun: error: n2: task 1: Killed\n")
    assert registry.postmortem("slurm").no_log(tmp_path) is None
    failed = registry.postmortem("slurm").failed_rank(tmp_path)
    assert failed is not None
    assert failed.describe() == "rank 1 on n2: Killed"
    assert registry.postmortem("local").failed_rank(tmp_path) is None
    assert registry.postmortem("local").no_log(tmp_path) is None
    assert isinstance(registry.held("local", object(), tmp_path, "1"), LocalHeld)
    with pytest.raises(ValueError, match="held by its scheduler"):
        registry.held("slurm", None, tmp_path, "1")
    assert registry.kill_wait_s("local") == 30.0  # as Slurm's KillWait
    assert registry.kill_wait_s("slurm") is None  # the cluster's own


def test_the_apis_older_slurm_spelling_builds_the_same_registry() -> None:
    client = FakeSlurm().client()
    assert registry_of(None, client).slurm is client
    given = Registry(client)
    assert registry_of(given) is given
    assert registry_of(None).slurm is None
    with pytest.raises(TypeError, match="backends= and slurm= both given"):
        registry_of(given, client)


def test_a_slurm_backend_without_a_client_makes_the_real_one_when_first_needed() -> None:
    from hpc_ddp.backends.slurm.client import SlurmClient, subprocess_runner

    backend = Registry().backend("slurm")
    assert isinstance(backend, SlurmBackend)
    made = backend.client
    assert isinstance(made, SlurmClient)
    assert made._runner is subprocess_runner
    assert backend.client is made  # made once


def _cfg() -> JobConfig:
    return load_job_config(REPO / "jobs/quickstart.yaml", [])


def _request() -> PlanRequest:
    return PlanRequest(
        "/opt/venv/bin/python", REPO / "jobs/quickstart.yaml", "hpc-ddp submit x", "2026-01-01"
    )


def test_the_slurm_plan_is_a_script_and_its_sbatch_command_and_moves_with_the_run(
    tmp_path: Path,
) -> None:
    backend = Registry().backend("slurm")
    paths = RunPaths(tmp_path / "run-a")
    plan = backend.plan(_cfg(), paths, _request())
    assert plan.command == ("sbatch", "--parsable", str(paths.script))
    assert plan.summary == f"# backend: slurm; would run: sbatch --parsable {paths.script}"
    assert plan.script is not None
    assert str(paths.root) in plan.script
    assert not paths.root.exists()  # a plan writes nothing
    moved = backend.moved(plan, _cfg(), RunPaths(tmp_path / "run-b"))
    assert moved.script is not None
    assert str(tmp_path / "run-b") in moved.script
    assert str(paths.root) not in moved.script
    assert moved.command[-1] == str(tmp_path / "run-b" / "job.sbatch")


def test_the_local_plan_renders_nothing_and_runs_submitits_controller(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run-a")
    plan = Registry().backend("local").plan(_cfg(), paths, _request())
    assert plan.script is None
    assert plan.command[1:] == ("-m", "submitit.local._local", str(paths.root / "submitit"))
    assert plan.summary.startswith("# backend: local; would start 2 process(es) on this machine")
    assert not paths.root.exists()


def test_only_slurm_jobs_are_asked_of_a_queue(tmp_path: Path) -> None:
    fake = FakeSlurm()
    fake.add_job("123", state=JobState.RUNNING)
    slurm = Registry(fake.client()).backend("slurm")
    local = Registry().backend("local")
    assert slurm.job_refs(tmp_path, _manifest("slurm", array_jobs=["124"])) == ["123", "124"]
    assert local.job_refs(tmp_path, _manifest("local")) == []
    assert set(slurm.states(["123"])) == {"123"}
    assert local.states(["123"]) == {}
    assert local.accounting(["123"]) == {}
    assert len(fake.commands("squeue")) == 1  # asked once, by the Slurm backend only
    with pytest.raises(RunDirError, match="not a Slurm job id"):
        slurm.job_refs(tmp_path, _manifest("slurm", job_id="--me"))


def test_each_backend_says_what_it_can_of_a_job_itself(tmp_path: Path) -> None:
    """Slurm leaves it to the queue; a local run's processes speak (none run here)."""
    assert Registry().backend("slurm").word(tmp_path, "123") is None
    assert Registry().backend("local").word(tmp_path, "123") == Word(running=False, cancelled=False)
    assert Registry().backend("slurm").settled(tmp_path, "123")
    assert Registry().backend("local").settled(tmp_path, "123")
    assert Registry().backend("slurm").ledger_since_submit is False
    assert Registry().backend("local").ledger_since_submit is True


def test_the_ids_a_cancel_acts_on(tmp_path: Path) -> None:
    slurm = Registry().backend("slurm")
    assert Registry().backend("local").cancel_ids(tmp_path, _manifest("local", "4711")) == ["4711"]
    assert slurm.cancel_ids(tmp_path, _manifest("slurm", "12")) == ["12"]
    with pytest.raises(RunDirError, match="no job id; nothing to cancel"):
        slurm.cancel_ids(tmp_path, _manifest("slurm", None))


def test_a_slurm_cancel_goes_through_the_client_it_was_given(tmp_path: Path) -> None:
    fake = FakeSlurm()
    run = tmp_path / "run"
    run.mkdir()
    fake.add_job("12", state=JobState.RUNNING, command=str(run / "job.sbatch"))
    backend = Registry(fake.client()).backend("slurm")
    done = backend.cancel(Cancel(run, run / "manifest.json", ("12",)))
    assert done.outcome == "cancelled", done.message
    assert fake.commands("scancel") == ["scancel 12"]
