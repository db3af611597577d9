"""Building a submission: the loader, a site profile, overrides and the template together."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hpc_ddp.config_load import load_job_config, load_resolved_config
from hpc_ddp.slurm_client import CompletedCommand, SlurmClient
from hpc_ddp.submission import materialize, prepare, record, schedule_slurm

DATA = Path(__file__).parent / "data" / "config"
GOLDEN = Path(__file__).parent / "golden" / "site_profile_overrides.sbatch"
REPO = Path(__file__).parent.parent
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


class FakeRunner:
    """Answers sbatch like Slurm 22.05 does with --parsable; records every argv."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: object, *, timeout: float | None = None) -> CompletedCommand:
        del timeout
        args = tuple(argv)  # type: ignore[call-overload]
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
    first = _prepared(tmp_path, client)
    materialize(first)
    second = _prepared(tmp_path, client)
    assert first.paths.root != second.paths.root
