"""Shared fixtures: the real dev clusters for tests marked ``slurm``.

A cluster is brought up when a test first needs it (``hpc-ddp dev-cluster up``) and taken down
at the end of the session unless it was already running before the tests started: the machine
is left as it was found. Under ``CI=true`` a Slurm test that cannot get its cluster fails;
elsewhere it skips.

Under pytest-xdist (``make test`` runs ``-n``), each worker is a session of its own with
clusters of its own (:func:`state_dir_for`): their tests wait on Slurm's clock side by side. The
tests of the accounting cluster, which is heavy (MariaDB, slurmdbd, three nodes), all run on one
worker (``xdist_group``), so one such cluster comes up per run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import ClusterSpec
from hpc_ddp.errors import HpcDdpError

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""This process's pytest-xdist worker (``gw0``, ``gw1``, ...); empty in a serial run."""
ACCOUNTING_GROUP = "accounting-cluster"
"""The ``xdist_group`` of every test of the accounting cluster: one worker runs them all."""


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster and the environment its clients need."""

    state_dir: Path
    conf: Path
    base_env: dict[str, str]
    hosts_before: str

    @property
    def env(self) -> dict[str, str]:
        """The clients' environment, with the running test's own ``$XDG_STATE_HOME``
        (:func:`_own_state_dir`): the cluster outlives a test, a lemon record must not (a
        node one test killed would be excluded from the next test's jobs)."""
        state = os.environ.get("XDG_STATE_HOME")
        return {**self.base_env, "XDG_STATE_HOME": state} if state else dict(self.base_env)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check)

    def wait_gone(self, job_id: str, timeout_s: float = 60.0) -> None:
        """Wait until ``job_id`` has left squeue (finished in any state)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout
            if not out.strip():
                return
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still queued after {timeout_s} s")


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"CI=true and the dev Slurm cluster is unavailable: {reason}")
    pytest.skip(f"dev Slurm cluster unavailable: {reason}")


def state_dir_for(kind: str = "") -> Path:
    """The state dir of this test process's dev cluster of ``kind`` (``""``: the two-node one;
    ``"acct"``, ``"gpu"``: the others, named by a suffix).

    A serial run uses the developer's dir (``$HPC_DDP_DEV_CLUSTER_DIR`` or the default) and
    its suffixed twins; xdist worker ``gwN`` adds ``-gwN`` to the name, so workers never share
    a cluster, nor a developer's.
    """
    home = devcluster.state_dir_from(os.environ)
    suffix = "".join(f"-{part}" for part in (WORKER, kind) if part)
    return home.with_name(home.name + suffix)


def bring_up(state_dir: Path, spec: ClusterSpec) -> devcluster.UpResult:
    """Bring the cluster up with ``spec``: on its own slot in a serial run (as ``hpc-ddp
    dev-cluster up`` would), on a free one under xdist (several come up at once)."""
    if os.geteuid() != 0:
        _unavailable("the dev cluster needs root")
    try:
        if WORKER:
            return devcluster.up_on_free_slot(state_dir, os.environ, spec)
        return devcluster.up(state_dir, os.environ, spec)
    except HpcDdpError as exc:
        _unavailable(str(exc))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """The two-node dev cluster (n1, n2), up for the whole session.

    Always of the shape the tests assume (:func:`shape_for_tests`), whatever shape a
    developer's running cluster had: a test that needs accounting asks for
    :func:`accounting_cluster`. A running cluster of another shape gets its own back at the
    end."""
    state_dir = state_dir_for()
    spec = shape_for_tests(state_dir)
    found = devcluster.saved_spec(state_dir)
    layout = devcluster.layout_for(state_dir, spec)
    was_running = devcluster.pid_alive(layout.ctld_pid) is not None
    hosts_before = devcluster.HOSTS_FILE.read_text()
    result = bring_up(state_dir, spec)
    previous_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(result.conf)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    yield Cluster(state_dir, result.conf, env, hosts_before)
    if previous_conf is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous_conf
    if not was_running:
        devcluster.down(state_dir)
    elif found is not None and found != spec:
        devcluster.up(state_dir, os.environ, found)  # as it was found


def shape_for_tests(state_dir: Path) -> ClusterSpec:
    """The default dev cluster's shape that every test of it assumes: two nodes of two fake
    GPUs, no accounting (tests of ``squeue`` alone), Slurm's own ``SlurmdTimeout``, a 10 s
    credential lifetime (a requeued job is held 11 s); its slot stays the state dir's."""
    return devcluster.resolve_spec(
        state_dir,
        nodes=2,
        gpus_per_node=2,
        accounting=False,
        slurmd_timeout_s=300,
        cred_expire_s=10,
    )


@pytest.fixture(scope="session")
def slurm_commands() -> None:
    """Slurm's client commands (sbatch, scontrol) on PATH, installed if missing, for tests that
    run them without a cluster (parsing only). Under ``CI=true`` their absence fails."""
    try:
        devcluster.ensure_installed(os.environ)
    except HpcDdpError as exc:
        _unavailable(str(exc))


@pytest.fixture(scope="session")
def accounting_cluster() -> Iterator[Cluster]:
    """A second dev cluster beside the default one, for accounting and node-loss tests: its
    own state dir (:func:`state_dir_for` ``"acct"``), ports, job ids and daemons. Three
    nodes (n1..n3), MariaDB and slurmdbd (``sacct`` works), and a 5 s ``SlurmdTimeout``: a node
    that stops answering is DOWN in about 10 s (Slurm's default is 300 s). Up once per
    session; taken down at the end unless it already ran.

    Its :attr:`Cluster.env` points ``SLURM_CONF`` at it; ``os.environ`` keeps the default one.
    """
    state_dir = state_dir_for("acct")
    spec = devcluster.resolve_spec(state_dir, nodes=3, accounting=True, slurmd_timeout_s=5)
    was_running = devcluster.pid_alive(devcluster.layout_for(state_dir, spec).ctld_pid) is not None
    hosts_before = devcluster.HOSTS_FILE.read_text()
    result = bring_up(state_dir, spec)
    env = {
        **os.environ,
        "SLURM_CONF": str(result.conf),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    yield Cluster(state_dir, result.conf, env, hosts_before)
    if not was_running:
        devcluster.down(state_dir)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slurm tests get the cluster fixture without naming it; the tests of the accounting
    cluster join its ``xdist_group`` (:data:`ACCOUNTING_GROUP`).

    The tests of a module that share a module-scoped fixture of its own join the module's
    ``xdist_group`` (:func:`_shares_a_module_fixture`). Modules with real-cluster or slow tests
    run first, each module's tests kept together and in order: the quick tests then fill the
    workers' last minutes, instead of one worker finishing a two-minute job after the others
    ran out of tests."""
    del config
    slow_modules: set[str] = set()
    for item in items:
        names: list[str] = item.fixturenames  # type: ignore[attr-defined]
        if item.get_closest_marker("slurm") and "slurm_cluster" not in names:
            names.insert(0, "slurm_cluster")
        if "accounting_cluster" in names:
            item.add_marker(pytest.mark.xdist_group(ACCOUNTING_GROUP))
        elif item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        if item.get_closest_marker("slurm") or item.get_closest_marker("slow"):
            slow_modules.add(item.nodeid.split("::", 1)[0])
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow_modules)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """The item uses a module-scoped fixture of its own module (an uninterrupted twin's job,
    a reference run): all such tests of a module run on one worker, so that the fixture runs
    once a suite, not once on each worker that got one of them (up to 4 times: the twins were
    a few % of the suite's CPU)."""
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        d.scope == "module" and d.baseid == module
        for defs in info.name2fixturedefs.values()
        for d in defs
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under ``CI=true`` a test that needs Slurm never skips: whatever skipped it (a check at
    collection time, a missing command) fails it instead."""
    report: pytest.TestReport = yield
    needs_slurm = item.get_closest_marker("slurm") is not None or any(
        name in getattr(item, "fixturenames", ())
        for name in ("slurm_cluster", "slurm_commands", "accounting_cluster")
    )
    if IN_CI and needs_slurm and report.skipped and call.when in ("setup", "call"):
        report.outcome = "failed"
        report.longrepr = f"CI=true and a Slurm-backed test skipped: {report.longrepr}"
    return report


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real, unrelated process (``sleep 120``) for tests of what may be signalled: it stands
    in for a rank or a process that took a recorded pid; killed at the end if still there."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def run_sleeper() -> Iterator[Callable[[Path], subprocess.Popen[bytes]]]:
    """Start real processes that stand in for a local run's controller or rank: like theirs,
    their command line names ``RUN_DIR/submitit`` (the argument of a 120 s Python sleep), so
    they are provably that run directory's; killed at the end if still there."""
    started: list[subprocess.Popen[bytes]] = []

    def start(run_dir: Path) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(120)"
        folder = str(run_dir.resolve() / "submitit")
        started.append(subprocess.Popen([sys.executable, "-c", code, folder]))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# What a task's start-up writes into its own environment (the env:// rendezvous, the local
# backend's rank set-up, GPUs, the run's identity). Any test may run such code in this process;
# whatever it leaves there would reach every later srun or sbatch the suite starts (srun passes
# the environment on), and a task that finds RANK=0, WORLD_SIZE=1 takes itself for a torchrun
# worker.
TASK_ENV_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG",
)  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def _suite_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's ``$XDG_STATE_HOME``, for what runs before a test's own
    (:func:`_own_state_dir`): a module-scoped fixture's job (a twin's) would otherwise write
    its save times, or a lemon record, into the developer's ``~/.local/state/hpc-ddp`` (seen:
    13 save-time entries a suite run)."""
    state = tmp_path_factory.mktemp("xdg-state-suite")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(state))
        yield state


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets an empty ``$XDG_STATE_HOME`` of its own (what the lemon record,
    :mod:`hpc_ddp.lemons`, lives in), so that the developer's own record never excludes a
    node from a golden script or a dry run, and no test's faults reach another's."""
    state = tmp_path_factory.mktemp("xdg-state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


KILL_TASK_FAILED = "Kill task failed"
"""The reason slurmd drains a node whose step did not end within ``UnkillableStepTimeout``."""


@pytest.fixture(autouse=True)
def _no_node_drained_by_an_earlier_test(request: pytest.FixtureRequest) -> None:
    """A node an earlier test's job left drained for "Kill task failed" (a step that did not
    end in time at its job's end; seen once under load, after an in-job restart) is put back,
    with a warning: otherwise every later test of the worker's cluster waits for a node that
    never comes (three failed that way in one run), while the test that caused it passed.
    (A warning would fail the test: the suite's warnings are errors.)"""
    for name in ("slurm_cluster", "accounting_cluster"):
        if name not in request.fixturenames:
            continue
        cluster: Cluster = request.getfixturevalue(name)
        layout = devcluster.layout_for(cluster.state_dir)
        for node, why in devcluster.resume_drained_nodes(layout, KILL_TASK_FAILED).items():
            print(f"{cluster.state_dir.name}: {node} was drained ({why}) earlier; resumed",
                  file=sys.stderr)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_task_env_leaks() -> Iterator[None]:
    """Put back, after every test, the task variables (``TASK_ENV_KEYS``, ``HPC_DDP_*`` but
    the user's own settings, ``SLURM_*`` but ``SLURM_CONF``) as they were before it."""

    def task_keys() -> set[str]:
        return {
            k
            for k in os.environ
            if k in TASK_ENV_KEYS
            or (k.startswith("HPC_DDP_") and k not in USER_SETTINGS)
            or (k.startswith(("SLURM_", "SLURMD_")) and k != "SLURM_CONF")
        }

    before = {k: os.environ[k] for k in task_keys()}
    yield
    for key in task_keys() - before.keys():
        del os.environ[key]
    os.environ.update(before)


USER_SETTINGS = frozenset(
    {
        "HPC_DDP_RUNS_DIR",
        "HPC_DDP_SITE",
        "HPC_DDP_DEV_CLUSTER_DIR",
        "HPC_DDP_TEST_NO_PDEATHSIG",
        "HPC_DDP_TEST_FRESH_RANKS",
    }
)
"""``HPC_DDP_*`` variables a user (or CI) sets for the whole suite, never a task."""


@pytest.fixture
def own_process() -> Iterator[None]:
    """Give the test the process's environment and stop-signal handlers back as they were.

    Code under test writes RANK, MASTER_PORT, OMP_NUM_THREADS ... into ``os.environ`` (the
    ``env://`` rendezvous, a task's start-up, as on a node) and installs stop handlers (a
    session); none of it may leak into later tests (an srun they start would inherit RANK=0).
    """
    saved = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
