"""The backends' catalog: one row names a backend everywhere.

A third backend (``toy``, a package written into a temporary directory: a login face and a node
face, as ``backends/<name>/`` would hold them) is added to the catalog by one row and nothing
else; every place that names a backend then knows it: ``auto`` and ``--backend``, a manifest's
check, the login registry (by name, with its client), the node registry (by the environment),
the distributed environment a task derives, and ``hpc-ddp supervise``'s launcher. This is the
PBS backend's path in ``docs/architecture.md``, proven without PBS.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpc_ddp.backends import catalog
from hpc_ddp.backends.catalog import (
    CATALOG,
    Row,
    auto_backend,
    backend_names,
    is_backend,
    is_scheduler,
    row_of,
)
from hpc_ddp.backends.registry import Registry
from hpc_ddp.errors import BackendError, ConfigError, RunDirError
from hpc_ddp.rundir.layout import TASK_LAUNCHER_ENV, RunPaths
from hpc_ddp.rundir.manifest import Manifest, read_manifest, write_manifest
from hpc_ddp.submission.submit import choose_backend

TOY_LOGIN = """
def backend(registry):
    return ("toy backend", registry.client("toy"))

def sweeps(registry):
    return ("toy sweeps", registry.client("toy"))

def postmortem():
    return "toy postmortem"
"""

TOY_NODE = """
from hpc_ddp.backends.allocation import NO_GRANT, JobIdentity, Placement, env_int

def owns_env(env):
    return "TOY_JOB_ID" in env

def allocation_of(env, client=None):
    return ToyAllocation(env, client)

def supervise_launcher(env, argv, client=None):
    return allocation_of(env, client), ("toy launcher", list(argv), client)

class ToyAllocation:
    name = "toy"

    def __init__(self, env, client):
        self.env, self.client = env, client

    def placement(self):
        if "TOY_RANK" not in self.env:
            return None
        world = env_int(self.env, "TOY_SIZE", minimum=1)
        rank = env_int(self.env, "TOY_RANK")
        return Placement(rank, rank, world, world, 0, "toy-node-0", ("toy-node-0",))

    def nodes(self):
        return ("toy-node-0",)

    def check_launcher(self, placement):
        pass

    def identity(self):
        return JobIdentity(self.env["TOY_JOB_ID"], None, None, 0, "toy-node-0")

    def array_point(self):
        return None

    def gpu_grant(self, rank, world):
        return NO_GRANT

    def cpus_per_task(self):
        return int(self.env.get("TOY_CPUS", 0)) or None

    def pool(self):
        return self.env.get("TOY_QUEUE")

    def standing(self, job_ref):
        raise NotImplementedError

    def requeue(self, job_ref):
        raise NotImplementedError

    def down(self, nodes):
        return {}
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Row]:
    """The toy backend's package on the path and its one row in the catalog, before the row
    without a scheduler (which must stay last)."""
    package = tmp_path / "toy_backend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "login_face.py").write_text(textwrap.dedent(TOY_LOGIN))
    (package / "node_face.py").write_text(textwrap.dedent(TOY_NODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    row = Row(
        "toy",
        submit_command="toysub",
        login_face="toy_backend.login_face",
        node_face="toy_backend.node_face",
    )
    monkeypatch.setattr(catalog, "CATALOG", (*CATALOG[:-1], row, CATALOG[-1]))
    yield row
    for name in [m for m in sys.modules if m.split(".")[0] == "toy_backend"]:
        del sys.modules[name]


def _on_path(*found: str) -> Callable[[str], str | None]:
    return lambda command: f"/usr/bin/{command}" if command in found else None


def test_the_catalog_names_slurm_and_this_machine_last() -> None:
    assert backend_names() == ("slurm", "local")
    assert row_of("slurm").submit_command == "sbatch"
    assert row_of("local").submit_command is None
    assert (is_backend("slurm"), is_backend("pbs"), is_backend(None)) == (True, False, False)
    assert (is_scheduler("slurm"), is_scheduler("local"), is_scheduler("torchrun")) == (
        True,
        False,
        False,
    )
    with pytest.raises(KeyError, match="backend 'pbs' is not one of slurm, local"):
        row_of("pbs")


def test_auto_picks_the_first_backend_whose_command_is_found_else_this_machine() -> None:
    asked: list[str] = []

    def on_path(command: str) -> str | None:
        asked.append(command)
        return None

    assert auto_backend(on_path) == "local"
    assert asked == ["sbatch"]
    assert auto_backend(_on_path("sbatch")) == "slurm"


def test_a_backend_added_by_one_row_is_chosen_by_name_and_by_auto(toy: Row) -> None:
    assert backend_names() == ("slurm", "toy", "local")
    assert choose_backend("toy") == "toy"
    assert choose_backend("auto", _on_path("toysub")) == "toy"
    assert choose_backend("auto", _on_path("toysub", "sbatch")) == "slurm"  # the catalog's order
    assert choose_backend("auto", _on_path()) == "local"
    with pytest.raises(ConfigError, match=r"'pbs' is not one of auto, slurm, toy, local\. HINT"):
        choose_backend("pbs")


def test_a_backend_added_by_one_row_is_a_choice_of_the_command_line(toy: Row) -> None:
    from hpc_ddp.cli.main import build_parser

    args = build_parser().parse_args(["submit", "jobs/quickstart.yaml", "--backend", "toy"])
    assert args.backend == "toy"


def test_a_backend_added_by_one_row_may_be_a_manifests(toy: Row, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    manifest = Manifest(
        name="demo",
        backend="toy",
        job_id="7",
        submitted_at="2026-11-29T00:00:00",
        command=[],
        config_source="jobs/quickstart.yaml",
        run_dir=str(run),
    )
    write_manifest(RunPaths(run), manifest)
    assert read_manifest(run).backend == "toy"
    text = (run / "manifest.json").read_text().replace('"toy"', '"pbs"')
    (run / "manifest.json").write_text(text)
    with pytest.raises(RunDirError, match="one of slurm, toy, local, whichever ran the run"):
        read_manifest(run)


def test_the_login_registry_makes_its_faces_with_its_own_client(toy: Row) -> None:
    client = object()
    registry = Registry(clients={"toy": client})
    assert registry.backend("toy") == ("toy backend", client)  # type: ignore[comparison-overlap]
    assert registry.sweeps("toy") == ("toy sweeps", client)  # type: ignore[comparison-overlap]
    assert registry.postmortem("toy") == "toy postmortem"  # type: ignore[comparison-overlap]
    assert registry.kill_wait_s("toy") is None  # no job of its is held by this process
    with pytest.raises(ValueError, match="held by its scheduler"):
        registry.held("toy", object(), Path("/nowhere"), "7")
    assert Registry().backend("toy") == ("toy backend", None)  # type: ignore[comparison-overlap]


def test_the_node_registry_picks_it_by_its_variables(toy: Row) -> None:
    from hpc_ddp.backends.local.allocation import LocalAllocation
    from hpc_ddp.backends.node_registry import allocation_for, launcher_for
    from hpc_ddp.backends.slurm.allocation import SlurmAllocation

    client = object()

    def clients(name: str) -> object | None:
        return client if name == "toy" else None

    mine = allocation_for({"TOY_JOB_ID": "7"}, clients=clients)
    assert (mine.name, getattr(mine, "client", None)) == ("toy", client)
    assert isinstance(allocation_for({"SLURM_JOB_ID": "3", "TOY_JOB_ID": "7"}), SlurmAllocation)
    assert isinstance(allocation_for({}), LocalAllocation)
    allocation, launcher = launcher_for({"TOY_JOB_ID": "7"}, ["toyrun", "x"], clients=clients)
    assert allocation.identity().job_id == "7"
    assert launcher == ("toy launcher", ["toyrun", "x"], client)  # type: ignore[comparison-overlap]


def test_a_task_it_placed_derives_its_place_and_passes_it_to_its_command(toy: Row) -> None:
    from hpc_ddp.runtime.distenv import derive_dist_env

    dist = derive_dist_env({"TOY_JOB_ID": "7", "TOY_RANK": "1", "TOY_SIZE": "2"})
    assert (dist.rank, dist.world_size, dist.launcher, dist.job_id) == (1, 2, "toy", "7")
    assert dist.master_addr == "toy-node-0"
    # `hpc-ddp run` hands its command child the task's place as RANK/WORLD_SIZE and says who
    # placed it: the child's place is the task's, not a torchrun's.
    child = {"TOY_JOB_ID": "7", **dist.as_environ(), TASK_LAUNCHER_ENV: "toy"}
    assert derive_dist_env(child).launcher == "toy"
    assert derive_dist_env({**child, TASK_LAUNCHER_ENV: "pbs"}).launcher == "torchrun"


def test_what_a_rank_asks_its_scheduler_comes_from_its_face(toy: Row) -> None:
    """The CPUs a task may use, the pool the save-time history is keyed by, the GPUs granted:
    each asked of the backend whose job it is, never read from Slurm's variables directly."""
    from hpc_ddp.runtime.distenv import derive_dist_env
    from hpc_ddp.runtime.procgroup import gpu_grant
    from hpc_ddp.sessions.autointerval import history_key
    from hpc_ddp.train.trainer import task_cpus

    env = {"TOY_JOB_ID": "7", "TOY_CPUS": "5", "TOY_QUEUE": "gpuq"}
    assert task_cpus(env, 1) == 5
    assert history_key(env) == "gpuq"
    assert gpu_grant(derive_dist_env(env), env).source == "no launcher says"
    assert history_key({"TOY_JOB_ID": "7"}) == "local"


def test_supervise_outside_any_schedulers_job_is_refused_with_a_hint() -> None:
    from hpc_ddp.backends.node_registry import launcher_for

    with pytest.raises(BackendError, match=r"no scheduler's job here to run srun.*HINT"):
        launcher_for({}, ["srun", "x"])
