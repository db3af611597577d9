"""A sweep's job arrays leave the lemon record's nodes out (``#SBATCH --exclude``) by a
submit's rule: only the partition's lemons, only while the partition keeps each point's
smallest ``--nodes`` besides them; ``sweep --dry-run`` says which and why, as ``submit
--dry-run`` does. The record is the test's own (conftest's ``$XDG_STATE_HOME``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.lemons.store import where
from hpc_ddp.rundir.endcause import EndCause
from tests.helpers.cli import run_cli
from tests.submission.test_lemon_exclusion import cluster, lost
from tests.sweep.test_submit import _ledger, set_queue, squeue_row, write_sweep

GRID: dict[str, Any] = {"grid": {"train.seed": [0, 1, 2]}, "max_parallel": 2}


@pytest.fixture(autouse=True)
def _no_site_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_DDP_SITE", raising=False)
    monkeypatch.delenv("HPC_DDP_RUNS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def sweep(tmp_path: Path, slurm: FakeSlurm, *extra: str, grid: dict[str, Any] = GRID) -> str:
    """``hpc-ddp sweep SWEEP --backend slurm EXTRA``'s output (a dry run with --dry-run)."""
    path = write_sweep(tmp_path, grid)  # 2 nodes a point
    argv = ["sweep", str(path), "--backend", "slurm", "--runs-dir", str(tmp_path / "runs"),
            *extra]  # fmt: skip
    code, out = run_cli(*argv, backends=Registry(slurm.client()))
    assert code == 0
    return out


def test_a_clean_record_changes_nothing_and_asks_slurm_no_more(tmp_path: Path) -> None:
    slurm = cluster("n1", "n2", "n3")
    shown = sweep(tmp_path, slurm, "--dry-run")
    assert "--exclude" not in shown
    assert "lemon" not in shown
    assert not [c for c in slurm.calls if c[0] == "sinfo"]


def test_dry_run_shows_the_exclusion_and_why(tmp_path: Path) -> None:
    lost("n2")
    slurm = cluster("n1", "n2", "n3")
    shown = sweep(tmp_path, slurm, "--dry-run")
    assert "#SBATCH --array=0-2%2\n" in shown
    assert "#SBATCH --exclude=n2\n" in shown
    assert "# lemon node n2: excluding (lost in run mnist-a (job 41) at " in shown
    assert "hpc-ddp nodes --forget NODE" in shown
    assert not [c for c in slurm.calls if c[0] == "sbatch"]
    # One sinfo for the default partition's name, one for its nodes: not one per point.
    assert len([c for c in slurm.calls if c[0] == "sinfo"]) == 2


def test_dry_run_json_names_the_lemons_of_each_array(tmp_path: Path) -> None:
    lost("n2")
    shown = json.loads(sweep(tmp_path, cluster("n1", "n2", "n3"), "--dry-run", "--json"))
    [array] = shown["arrays"]
    assert array["lemons"]["excluded"] == ["n2"]
    assert array["lemons"]["lemons"][0]["node"] == "n2"
    assert "#SBATCH --exclude=n2\n" in array["script"]


def test_a_partition_too_small_keeps_the_lemon(tmp_path: Path) -> None:
    lost("n2")
    shown = sweep(tmp_path, cluster("n1", "n2"), "--dry-run")
    assert "--exclude" not in shown
    assert "# lemon node n2: not excluding" in shown
    assert "would keep 1 node(s) without n2, for a job of 2" in shown


def test_each_point_is_judged_by_its_own_nodes(tmp_path: Path) -> None:
    """A point of 1 node leaves n2 out of a 3-node partition; a point of 3 cannot."""
    lost("n2")
    grid = {"grid": {"slurm.nodes": [1, 3]}}
    shown = sweep(tmp_path, cluster("n1", "n2", "n3"), "--dry-run", grid=grid)
    first, second = shown.split("# ---- job-1.sbatch")
    assert "#SBATCH --nodes=1\n" in first
    assert "#SBATCH --exclude=n2\n" in first
    assert "#SBATCH --nodes=3\n" in second
    assert "--exclude" not in second
    assert "would keep 2 node(s) without n2, for a job of 3" in second


def test_points_that_turn_the_record_off_get_an_array_of_their_own(tmp_path: Path) -> None:
    lost("n2")
    grid = {"grid": {"fault.lemon_nodes": [True, False]}}
    shown = json.loads(sweep(tmp_path, cluster("n1", "n2", "n3"), "--dry-run", "--json",
                             grid=grid))  # fmt: skip
    on, off = shown["arrays"]
    assert (on["points"], off["points"]) == ([0], [1])
    assert "#SBATCH --exclude=n2\n" in on["script"]
    assert "--exclude" not in off["script"]
    assert "lemons" not in off


def test_the_submitted_script_excludes_the_lemon_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost("n3")
    slurm = cluster("n1", "n2", "n3")
    with caplog.at_level(logging.WARNING):
        shown = json.loads(sweep(tmp_path, slurm, "--json"))
    sweep_dir = Path(shown["sweep_dir"])
    assert "#SBATCH --exclude=n3\n" in (sweep_dir / "job.sbatch").read_text()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("lemon node n3: excluding (lost in run ") for m in said), said


def test_resubmit_failed_excludes_the_lemon_too(tmp_path: Path) -> None:
    slurm = cluster("n1", "n2", "n3")
    sweep_dir = Path(json.loads(sweep(tmp_path, slurm, "--json"))["sweep_dir"])
    assert "--exclude" not in (sweep_dir / "job.sbatch").read_text()
    lost("n3")
    _ledger(sweep_dir, 0, EndCause.FINISHED)
    _ledger(sweep_dir, 1, EndCause.CRASH)
    set_queue(slurm, [squeue_row(101, 2, "RUNNING")])
    argv = ["sweep", "--resubmit-failed", str(sweep_dir), "--dry-run"]
    code, out = run_cli(*argv, backends=Registry(slurm.client()))
    assert code == 0
    assert "#SBATCH --exclude=n3\n" in out
    assert "# lemon node n3: excluding" in out
    assert run_cli(*argv[:-1], backends=Registry(slurm.client()))[0] == 0
    assert "#SBATCH --exclude=n3\n" in (sweep_dir / "job-1.sbatch").read_text()


def test_a_dry_run_away_from_slurm_excludes_nothing_and_says_why(tmp_path: Path) -> None:
    lost("n2")
    slurm = cluster("n1", "n2", "n3")
    slurm.fail("sinfo", times=5)
    slurm.fail("scontrol", times=5)
    shown = sweep(tmp_path, slurm, "--dry-run")
    assert "--exclude" not in shown
    assert "# lemon node n2: not excluding" in shown
    assert "# the nodes of partition (default) are not known: " in shown
    assert "assumed MaxArraySize=1001" in shown


def test_a_damaged_record_warns_and_the_sweep_is_submitted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost("n3")
    (where() / "123-n9-x.json").write_text('{"node": "n9", "kind": "maybe"}')
    slurm = cluster("n1", "n2", "n3")
    shown = json.loads(sweep(tmp_path, slurm, "--json"))
    assert shown["array_jobs"]
    assert "#SBATCH --exclude=n3\n" in (Path(shown["sweep_dir"]) / "job.sbatch").read_text()
    assert any("damaged entry" in r.getMessage() for r in caplog.records)
