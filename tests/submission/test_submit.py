"""Launching a run: claiming its directory (threads and processes racing on the same second),
building it from the loader, a site profile, overrides and the template, and starting it."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.jobstate import CompletedCommand
from hpc_ddp.backends.slurm.sweeps import submit_sweep
from hpc_ddp.cli.main import main
from hpc_ddp.config.load import load_job_config, load_resolved_config
from hpc_ddp.errors import RunsDirError
from hpc_ddp.submission.submit import (
    check_runs_dir,
    create_run_dir,
    launch,
    materialize,
    new_run_dir,
    prepare,
    record,
)
from hpc_ddp.sweep.spec import load_sweep
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


def _prepared(runs: Path):  # type: ignore[no-untyped-def]
    cfg = load_job_config(
        Path("jobs/quickstart.yaml"),
        ["train.lr=0.01", "slurm.nodes=1", "env.vars={EXTRA: 'a b'}"],
        site_profile=DATA / "site.yaml",
    )
    return prepare(
        cfg,
        backend=Registry().backend("slurm"),
        config_path=Path("jobs/quickstart.yaml"),
        runs_dir=runs,
        python="/opt/venv/bin/python",
        invocation=["hpc-ddp", "submit", "jobs/quickstart.yaml", "train.lr=0.01"],
        now=NOW,
    )


def test_site_profile_plus_overrides_golden(tmp_path: Path) -> None:
    """Pins the script for quickstart + site profile + overrides, run dir normalised."""
    prepared = _prepared(tmp_path)
    text = prepared.script.replace(str(tmp_path.resolve()), "/RUNS")
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    # Layers: the site's partition/account/modules, the job's shape, the override's lr.
    assert prepared.cfg.slurm.partition == "site-part"
    assert prepared.cfg.slurm.nodes == 1
    assert prepared.cfg.train.lr == 0.01
    assert prepared.cfg.train.momentum == 0.8


def test_launch_writes_the_run_dir_and_manifest(tmp_path: Path) -> None:
    runner = FakeRunner()
    prepared = _prepared(tmp_path)
    manifest = launch(
        replace(prepared, face=Registry(SlurmClient(runner)).backend(prepared.backend))
    ).manifest
    assert manifest.job_id == "4242"
    assert runner.calls == [("sbatch", "--parsable", str(prepared.paths.script))]
    assert prepared.paths.script.read_text() == prepared.script
    assert load_resolved_config(prepared.paths.config) == prepared.cfg
    assert prepared.paths.logs.is_dir()
    again = record(prepared, job_id="4242", command=prepared.sbatch_argv)
    assert again.run_dir == str(prepared.paths.root)


def test_two_submissions_in_the_same_second_get_distinct_dirs(tmp_path: Path) -> None:
    first = materialize(_prepared(tmp_path))
    second = _prepared(tmp_path)
    assert first.paths.root != second.paths.root


def test_dry_run_creates_nothing_and_shows_the_would_be_path(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    prepared = _prepared(runs)
    assert prepared.paths.root == runs.resolve() / "quickstart-20260101-120000"
    assert not runs.exists()
    assert not prepared.created


def test_prepared_twice_then_materialized_moves_the_second_and_renders_it_again(
    tmp_path: Path,
) -> None:
    """Both prepared before either wrote (the race): the loser gets -2, and its script, sbatch
    argv and files name -2, never the winner's directory."""
    a, b = _prepared(tmp_path), _prepared(tmp_path)
    assert a.paths.root == b.paths.root  # the same forecast
    a, b = materialize(a), materialize(b)
    assert (a.paths.root.name, b.paths.root.name) == (
        "quickstart-20260101-120000",
        "quickstart-20260101-120000-2",
    )
    assert b.created
    assert b.sbatch_argv == ("sbatch", "--parsable", str(b.paths.script))
    assert a.script is not None
    assert b.script is not None
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
        prepared = _prepared(tmp_path)
        manifest = launch(
            replace(prepared, face=Registry(client).backend(prepared.backend))
        ).manifest
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


def test_launch_materializes_once(tmp_path: Path) -> None:
    runner = FakeRunner()
    client = SlurmClient(runner)
    prepared = materialize(_prepared(tmp_path))
    manifest = launch(replace(prepared, face=Registry(client).backend(prepared.backend))).manifest
    assert manifest.run_dir == str(prepared.paths.root)
    assert [p.name for p in tmp_path.iterdir()] == [prepared.paths.root.name]


def test_runs_dir_that_is_a_file_fails_before_anything_is_written(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.write_text("x")
    with pytest.raises(RunsDirError, match=r"is a file, not a directory.*HINT:") as info:
        _prepared(runs)
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
        assert f"--output={d}/logs/batch-%A_%a.out" in (d / "job.sbatch").read_text()
        packed = (d / "task_configs.jsonl").read_text().splitlines()
        assert [json.loads(line)["index"] for line in packed] == [0, 1, 2]
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
            backend=Registry().backend("slurm"),
            config_path=Path("jobs/quickstart.yaml"),
            runs_dir=runs,
            python=sys.executable,
            invocation=["test"],
            now=NOW,
        )

    first, second = prepared(1), prepared(2)
    assert first.paths.root == second.paths.root  # the same forecast: the same second
    manifests = [
        launch(replace(first, face=Registry(client).backend(first.backend))).manifest,
        launch(replace(second, face=Registry(client).backend(second.backend))).manifest,
    ]
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


STAMP = "20260101-120000"


# --- claiming a run directory -------------------------------------------------------------------


def test_create_run_dir_takes_the_next_suffix(tmp_path: Path) -> None:
    assert new_run_dir(tmp_path, "job", STAMP) == tmp_path / f"job-{STAMP}"
    first = create_run_dir(tmp_path, "job", STAMP)
    second = create_run_dir(tmp_path, "job", STAMP)
    assert (first.name, second.name) == (f"job-{STAMP}", f"job-{STAMP}-2")
    assert new_run_dir(tmp_path, "job", STAMP) == tmp_path / f"job-{STAMP}-3"
    assert first.is_dir()
    assert second.is_dir()


def test_create_run_dir_makes_the_runs_dir(tmp_path: Path) -> None:
    base = tmp_path / "a" / "b"
    assert create_run_dir(base, "job", STAMP).parent == base


def test_create_run_dir_never_reuses_a_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / f"job-{STAMP}").symlink_to(tmp_path / "nowhere")
    assert new_run_dir(tmp_path, "job", STAMP).name == f"job-{STAMP}-2"
    assert create_run_dir(tmp_path, "job", STAMP).name == f"job-{STAMP}-2"


def _claim_and_write(base: str, marker: str) -> str:
    """One submit: claim a directory, then write what only this submit would write there."""
    run_dir = create_run_dir(Path(base), "job", STAMP)
    (run_dir / "config.yaml").write_text(marker)
    return str(run_dir)


def test_threads_racing_on_the_same_second_each_get_their_own_dir(tmp_path: Path) -> None:
    markers = [f"submit {i}" for i in range(64)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        dirs = list(pool.map(lambda m: _claim_and_write(str(tmp_path), m), markers))
    assert len(set(dirs)) == len(markers)
    for run_dir, marker in zip(dirs, markers, strict=True):
        assert Path(run_dir, "config.yaml").read_text() == marker  # nothing overwritten


def test_processes_racing_on_the_same_second_each_get_their_own_dir(tmp_path: Path) -> None:
    markers = [f"submit {i}" for i in range(24)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        dirs = pool.starmap(_claim_and_write, [(str(tmp_path), m) for m in markers])
    assert len(set(dirs)) == len(markers)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(d).name for d in dirs)
    for run_dir, marker in zip(dirs, markers, strict=True):
        assert Path(run_dir, "config.yaml").read_text() == marker


# --- a runs directory that cannot hold runs -------------------------------------------------------


def test_runs_dir_that_is_a_file_is_an_exit_2_error(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.write_text("not a directory")
    for call in (
        lambda: check_runs_dir(runs, write=False),
        lambda: new_run_dir(runs, "job", STAMP),
        lambda: create_run_dir(runs, "job", STAMP),
    ):
        with pytest.raises(RunsDirError, match="is a file, not a directory") as info:
            call()
        assert str(runs) in str(info.value)
        assert "HINT: pass an existing, writable directory with --runs-dir" in str(info.value)
        assert info.value.exit_code == 2
    assert runs.read_text() == "not a directory"


def test_runs_dir_under_a_file_is_an_exit_2_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunsDirError, match=r"cannot create --runs-dir .*HINT:") as info:
        create_run_dir(tmp_path / "file" / "runs", "job", STAMP)
    assert info.value.exit_code == 2


def test_unwritable_runs_dir_is_an_exit_2_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root ignores permission bits, so ask the question the code asks and answer it "no".
    runs = tmp_path / "runs"
    runs.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == runs else real_access(p, mode)
    )
    with pytest.raises(RunsDirError, match="is not writable by this user") as info:
        create_run_dir(runs, "job", STAMP)
    assert info.value.exit_code == 2
    with pytest.raises(RunsDirError, match="is not readable by this user"):
        check_runs_dir(runs, write=False)
    assert list(runs.iterdir()) == []


def test_mkdir_refused_is_an_exit_2_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(RunsDirError, match=r"cannot create .*Permission denied.*HINT:"):
        create_run_dir(tmp_path, "job", STAMP)


def test_missing_runs_dir_is_fine_to_read(tmp_path: Path) -> None:
    check_runs_dir(tmp_path / "none", write=False)  # nothing submitted yet: no error
