"""A submission leaves the lemon record's nodes out (``#SBATCH --exclude``) while the partition
keeps enough others, says so in ``--dry-run``, and never fails for a damaged record."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import pytest

import hpc_ddp
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, where
from hpc_ddp.rundir.layout import RunPaths

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "jobs" / "quickstart.yaml"  # 2 nodes


@pytest.fixture(autouse=True)
def _no_site_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_DDP_SITE", raising=False)
    monkeypatch.delenv("HPC_DDP_RUNS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def lost(node: str, age_s: float = 3600.0) -> None:
    """A previous run's supervisor recorded ``node`` lost, ``age_s`` ago."""
    add_entry(where(), LemonEntry(node, "lost", "node_fail", f"srun: Node failure on {node}",
                                  "run-a", "/runs/mnist-a", "41", time.time() - age_s))  # fmt: skip


def cluster(*nodes: str) -> FakeSlurm:
    slurm = FakeSlurm()
    slurm.node_states = dict.fromkeys(nodes, "idle")
    return slurm


def dry_run(tmp_path: Path, slurm: FakeSlurm, *extra: str) -> str:
    out = io.StringIO()
    argv = ["submit", str(QUICKSTART), "--backend", "slurm", "--dry-run",
            "--runs-dir", str(tmp_path / "runs"), *extra]  # fmt: skip
    with contextlib.redirect_stdout(out):
        assert main(argv, backends=Registry(slurm.client())) == 0
    return out.getvalue()


def test_the_conftest_gives_every_test_an_empty_record() -> None:
    assert str(where()).startswith(os.environ["XDG_STATE_HOME"])
    assert not where().exists()


def test_a_clean_record_asks_slurm_nothing(tmp_path: Path) -> None:
    slurm = cluster("n1", "n2", "n3")
    shown = dry_run(tmp_path, slurm)
    assert "--exclude" not in shown
    assert "lemon" not in shown
    assert slurm.calls == []


def test_dry_run_shows_the_exclusion_and_why(tmp_path: Path) -> None:
    lost("n2")
    shown = dry_run(tmp_path, cluster("n1", "n2", "n3"))
    assert "#SBATCH --exclude=n2\n" in shown
    assert "# lemon node n2: excluding (lost in run mnist-a (job 41) at " in shown
    assert "hpc-ddp nodes --forget NODE" in shown


def test_dry_run_json_names_the_lemons(tmp_path: Path) -> None:
    lost("n2")
    shown = json.loads(dry_run(tmp_path, cluster("n1", "n2", "n3"), "--json"))
    assert shown["lemons"]["excluded"] == ["n2"]
    assert shown["lemons"]["lemons"][0]["node"] == "n2"
    assert "#SBATCH --exclude=n2" in shown["script"]


def test_a_partition_too_small_keeps_the_lemon(tmp_path: Path) -> None:
    lost("n2")
    shown = dry_run(tmp_path, cluster("n1", "n2"))
    assert "--exclude" not in shown
    assert "# lemon node n2: not excluding" in shown
    assert "would keep 1 node(s) without n2, for a job of 2" in shown


def test_an_old_fault_is_forgotten(tmp_path: Path) -> None:
    lost("n2", age_s=8 * 86400)
    assert "--exclude" not in dry_run(tmp_path, cluster("n1", "n2", "n3"))


def test_a_lemon_of_another_cluster_is_not_named_to_slurm(tmp_path: Path) -> None:
    lost("other7")
    shown = dry_run(tmp_path, cluster("n1", "n2", "n3"))
    assert "--exclude" not in shown
    assert "not in partition debug: other7" in shown


def test_lemon_nodes_false_turns_it_off(tmp_path: Path) -> None:
    lost("n2")
    assert "--exclude" not in dry_run(
        tmp_path, cluster("n1", "n2", "n3"), "fault.lemon_nodes=false"
    )


def test_the_submitted_script_excludes_the_lemon(tmp_path: Path) -> None:
    lost("n3")
    slurm = cluster("n1", "n2", "n3")
    job = hpc_ddp.submit(QUICKSTART, backend="slurm", runs_dir=tmp_path / "runs",
                         backends=Registry(slurm.client()))  # fmt: skip
    assert "#SBATCH --exclude=n3\n" in RunPaths(job.run_dir).script.read_text()


def test_a_damaged_record_warns_and_submits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost("n3")
    (where() / "123-n9-x.json").write_text('{"node": "n9", "kind": "lost", "time": "soon"}')
    (where() / "124-n8-x.json").write_bytes(b"\xff\xfe garbage")
    slurm = cluster("n1", "n2", "n3")
    job = hpc_ddp.submit(QUICKSTART, backend="slurm", runs_dir=tmp_path / "runs",
                         backends=Registry(slurm.client()))  # fmt: skip
    assert job.job_id
    assert "#SBATCH --exclude=n3\n" in RunPaths(job.run_dir).script.read_text()
    damaged = [r.getMessage() for r in caplog.records if "damaged entry" in r.getMessage()]
    assert len(damaged) == 2
    assert "time 'soon'" in " ".join(damaged)


def test_a_resume_excludes_the_lemon_too(tmp_path: Path) -> None:
    from tests.cli.test_resume import _slurm_run

    run_dir = _slurm_run(tmp_path / "runs", "77")  # forgotten by the fake Slurm: resumable
    assert "--exclude" not in RunPaths(run_dir).script.read_text()
    lost("n3")
    slurm = cluster("n1", "n2", "n3")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["resume", str(run_dir), "--dry-run"]
        assert main(argv, backends=Registry(slurm.client())) == 0
    assert "#SBATCH --exclude=n3\n" in out.getvalue()
    assert "# lemon node n3: excluding" in out.getvalue()
    assert main(["resume", str(run_dir)], backends=Registry(slurm.client())) == 0
    assert "#SBATCH --exclude=n3\n" in RunPaths(run_dir).script.read_text()


def test_a_local_run_reads_no_partition(tmp_path: Path) -> None:
    lost("n3")
    slurm = cluster("n1", "n2", "n3")
    out = io.StringIO()
    argv = ["submit", str(QUICKSTART), "--backend", "local", "--dry-run",
            "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    with contextlib.redirect_stdout(out):
        assert main(argv, backends=Registry(slurm.client())) == 0
    assert "lemon" not in out.getvalue()
    assert slurm.calls == []
