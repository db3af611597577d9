"""Building a submission: the loader, a site profile, overrides and the template together."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.config.load import load_job_config, load_resolved_config
from hpc_ddp.errors import RunsDirError
from hpc_ddp.slurm.client import CompletedCommand, SlurmClient
from hpc_ddp.slurm.submission import materialize, prepare, record, schedule_slurm
from hpc_ddp.sweep.spec import load_sweep
from hpc_ddp.sweep.submit import submit_sweep
from tests import e2e_util as e2e
from tests.conftest import Cluster

DATA = Path(__file__).parents[1] / "data" / "config"
GOLDEN = Path(__file__).parents[1] / "golden" / "site_profile_overrides.sbatch"
REPO = Path(__file__).parents[2]
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


class FakeRunner:
    """Answers sbatch like Slurm 22.05 does with --parsable; records every argv."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        del timeout
        args = tuple(argv)
        self.calls.append(args)
        return CompletedCommand(args, 0, "4242\n", "")


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # job paths are relative to the repo, as a user types them


def _prepared(runs: Path, client: SlurmClient):  # type: ignore[no-untyped-def]
    cfg = load_job_config(
        Path("jobs/quickstart.yaml"),
        ["train.lr=0.01", "slurm.nodes=1", "env.vars={EXTRA: 'a b'}"],
        site_profile=DATA / "site.yaml",
    )
    return prepare(
        cfg,
        config_path=Path("jobs/quickstart.yaml"),
        runs_dir=runs,
        python="/opt/venv/bin/python",
        invocation=["hpc-ddp", "submit", "jobs/quickstart.yaml", "train.lr=0.01"],
        client=client,
        now=NOW,
    )


def test_site_profile_plus_overrides_golden(tmp_path: Path) -> None:
    """Pins the script for quickstart + site profile + overrides, run dir normalised."""
    prepared = _prepared(tmp_path, SlurmClient(FakeRunner()))
    text = prepared.script.replace(str(tmp_path.resolve()), "/RUNS")
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    # Layers: the site's partition/account/modules, the job's shape, the override's lr.
    assert prepared.cfg.slurm.partition == "site-part"
    assert prepared.cfg.slurm.nodes == 1
    assert prepared.cfg.train.lr == 0.01
    assert prepared.cfg.train.momentum == 0.8


def test_schedule_writes_the_run_dir_and_manifest(tmp_path: Path) -> None:
    runner = FakeRunner()
    prepared = _prepared(tmp_path, SlurmClient(runner))
    manifest = schedule_slurm(prepared, SlurmClient(runner))
    assert manifest.job_id == "4242"
    assert runner.calls == [("sbatch", "--parsable", str(prepared.paths.script))]
    assert prepared.paths.script.read_text() == prepared.script
    assert load_resolved_config(prepared.paths.config) == prepared.cfg
    assert prepared.paths.logs.is_dir()
    again = record(prepared, backend="slurm", job_id="4242", command=prepared.sbatch_argv)
    assert again.run_dir == str(prepared.paths.root)


def test_two_submissions_in_the_same_second_get_distinct_dirs(tmp_path: Path) -> None:
    client = SlurmClient(FakeRunner())
    first = materialize(_prepared(tmp_path, client))
    second = _prepared(tmp_path, client)
    assert first.paths.root != second.paths.root


def test_dry_run_creates_nothing_and_shows_the_would_be_path(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    prepared = _prepared(runs, SlurmClient(FakeRunner()))
    assert prepared.paths.root == runs.resolve() / "quickstart-20260101-120000"
    assert not runs.exists()
    assert not prepared.created


def test_prepared_twice_then_materialized_moves_the_second_and_renders_it_again(
    tmp_path: Path,
) -> None:
    """Both prepared before either wrote (the race): the loser gets -2, and its script, sbatch
    argv and files name -2, never the winner's directory."""
    client = SlurmClient(FakeRunner())
    a, b = _prepared(tmp_path, client), _prepared(tmp_path, client)
    assert a.paths.root == b.paths.root  # the same forecast
    a, b = materialize(a), materialize(b)
    assert (a.paths.root.name, b.paths.root.name) == (
        "quickstart-20260101-120000",
        "quickstart-20260101-120000-2",
    )
    assert b.created
    assert b.sbatch_argv == ("sbatch", "--parsable", str(b.paths.script))
    assert str(a.paths.root) not in b.script.replace(str(b.paths.root), "")
    assert f"--output={b.paths.root}/logs/batch-%j.out" in b.script
    assert b.paths.script.read_text() == b.script
    assert a.paths.script.read_text() == a.script
    # Apart from the directory, the same script.
    assert b.script.replace(str(b.paths.root), "RUN") == a.script.replace(str(a.paths.root), "RUN")
    with pytest.raises(ValueError, match="already materialized"):
        materialize(b)


def test_many_concurrent_submits_in_one_second_each_get_their_own_run(tmp_path: Path) -> None:
    """32 submits of the same job with the same stamp, in threads: 32 run directories, each
    submitted with its own script, none overwritten."""
    runner = FakeRunner()
    client = SlurmClient(runner)

    def submit(i: int) -> tuple[Path, str]:
        prepared = _prepared(tmp_path, client)
        manifest = schedule_slurm(prepared, client)
        return Path(manifest.run_dir), prepared.script

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(submit, range(32)))
    dirs = [d for d, _ in results]
    assert len(set(dirs)) == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(d.name for d in dirs)
    submitted = sorted(argv[-1] for argv in runner.calls)
    assert submitted == sorted(str(d / "job.sbatch") for d in dirs)
    for d in dirs:
        script = (d / "job.sbatch").read_text()
        assert f"--output={d}/logs/batch-%j.out" in script  # its own directory, no other
        assert json.loads((d / "manifest.json").read_text())["run_dir"] == str(d)


def test_schedule_slurm_materializes_once(tmp_path: Path) -> None:
    runner = FakeRunner()
    client = SlurmClient(runner)
    prepared = materialize(_prepared(tmp_path, client))
    manifest = schedule_slurm(prepared, client)
    assert manifest.run_dir == str(prepared.paths.root)
    assert [p.name for p in tmp_path.iterdir()] == [prepared.paths.root.name]


def test_runs_dir_that_is_a_file_fails_before_anything_is_written(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.write_text("x")
    with pytest.raises(RunsDirError, match=r"is a file, not a directory.*HINT:") as info:
        _prepared(runs, SlurmClient(FakeRunner()))
    assert info.value.exit_code == 2


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_cli_submit_to_a_runs_dir_that_is_a_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    runs = tmp_path / "runs"
    runs.write_text("x")
    argv = ["submit", "jobs/quickstart.yaml", "--backend", backend, "--runs-dir", str(runs)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--runs-dir '{runs}' is a file" in err
    assert "HINT:" in err
    assert main([*argv, "--dry-run"]) == 2


class SweepSlurm:
    """sbatch hands out ids, scontrol says MaxArraySize; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_id = 100

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        del timeout
        args = tuple(argv)
        if args[0] == "scontrol":
            return CompletedCommand(args, 0, "MaxArraySize            = 1001\n", "")
        with self.lock:
            self.next_id += 1
            return CompletedCommand(args, 0, f"{self.next_id}\n", "")


def test_concurrent_sweeps_in_one_second_each_get_their_own_dir(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: demo\nslurm: {nodes: 1}\ntrain: {max_steps: 5}\n")
    path = tmp_path / "sweep.yaml"
    path.write_text("base: job.yaml\nsweep:\n  grid:\n    train.lr: [0.1, 0.01, 0.001]\n")
    spec = load_sweep(path)
    client = SlurmClient(SweepSlurm())

    def one(i: int) -> Path:
        return submit_sweep(
            spec,
            sweep_file=path,
            runs_dir=tmp_path / "runs",
            python="/venv/bin/python",
            invocation=["hpc-ddp", "sweep", str(path)],
            client=client,
            now=NOW,
        ).sweep_dir

    with ThreadPoolExecutor(max_workers=6) as pool:
        dirs = list(pool.map(one, range(12)))
    assert len(set(dirs)) == 12
    jobs = set()
    for d in dirs:
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["run_dir"] == str(d)
        jobs.add(manifest["job_id"])
        assert f"--output={d}/tasks/%a/logs/batch-%A_%a.out" in (d / "job.sbatch").read_text()
        assert sorted(p.name for p in (d / "tasks").iterdir()) == ["0", "1", "2"]
    assert len(jobs) == 12  # every sweep's manifest kept its own array job


@pytest.mark.slurm
def test_two_real_jobs_submitted_in_the_same_second_each_train_in_their_own_dir(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 11.2 on the dev cluster: two submissions of one job with the same clock second
    (pinned) get two run directories, and each job writes its config, manifest, ledger and
    checkpoints only into its own."""
    client = SlurmClient()  # the real sbatch, against the cluster the fixture exported
    runs = tmp_path / "runs"

    def prepared(seed: int):  # type: ignore[no-untyped-def]
        overrides = ["slurm.nodes=1", "train.max_steps=6", "train.checkpoint_every=3",
                     f"train.seed={seed}"]  # fmt: skip
        cfg = load_job_config(Path("jobs/quickstart.yaml"), overrides)
        return prepare(
            cfg,
            config_path=Path("jobs/quickstart.yaml"),
            runs_dir=runs,
            python=sys.executable,
            invocation=["test"],
            client=client,
            now=NOW,
        )

    first, second = prepared(1), prepared(2)
    assert first.paths.root == second.paths.root  # the same forecast: the same second
    manifests = [schedule_slurm(first, client), schedule_slurm(second, client)]
    dirs = [Path(m.run_dir) for m in manifests]
    assert [d.name for d in dirs] == ["quickstart-20260101-120000", "quickstart-20260101-120000-2"]
    for manifest, run_dir, seed in zip(manifests, dirs, (1, 2), strict=True):
        assert manifest.job_id is not None
        assert e2e.wait_done(slurm_cluster, manifest.job_id)["JobState"] == "COMPLETED"
        assert load_resolved_config(run_dir / "config.yaml").train.seed == seed
        assert json.loads((run_dir / "manifest.json").read_text())["job_id"] == manifest.job_id
        assert {a.job_id for a in e2e.ledger(run_dir)} == {manifest.job_id}
    digests = [e2e.final_digest(slurm_cluster, d) for d in dirs]
    assert [step for step, _ in digests] == [6, 6]
    assert digests[0][1] != digests[1][1]  # two seeds, two trainings, two sets of weights
