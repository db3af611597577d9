"""``hpc-ddp resume`` refuses a switch between ``ddp`` and ``fsdp`` (``train.strategy``) that the
run's checkpoints cannot follow, before anything is written or submitted.

A DDP run's checkpoints are ``step-N.pt`` files and an FSDP run's ``step-N/`` shard sets; the
ranks load only their own kind, so such a resume used to be submitted, refused by the ranks at
every launch and stopped as ``no_progress``. The runs here are a (fake) Slurm run of the
built-in trainer with a checkpoint that looks whole to the login side.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.rundir.manifest import read_manifest
from tests.cli.test_resume import _resume_out, _run_files, _trained_slurm_run


def _as_fsdp(run_dir: Path) -> None:
    """The run as an FSDP run: ``train.strategy: fsdp`` in its config, its checkpoint at step
    32 a shard set (a committed ``step-N/`` with its digest record) instead of a file."""
    config = run_dir / "config.yaml"
    text = config.read_text()
    assert "  strategy: ddp\n" in text
    config.write_text(text.replace("  strategy: ddp\n", "  strategy: fsdp\n"))
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "step-00000032.pt").unlink()
    (checkpoints / "step-00000032").mkdir()
    (checkpoints / "step-00000032" / "digests.json").write_text("{}")


@pytest.mark.parametrize(
    ("fsdp_run", "switch", "said"),
    [
        (False, "train.strategy=fsdp", "from ddp to fsdp on resume: the run's checkpoints are "
         "ddp's (1 step-N.pt file(s), newest step-00000032.pt)"),
        (True, "train.strategy=ddp", "from fsdp to ddp on resume: the run's checkpoints are "
         "fsdp's (1 step-N/ shard set(s), newest step-00000032)"),
    ],
)  # fmt: skip
def test_a_strategy_switch_the_checkpoints_cannot_follow_is_refused_before_submitting(
    tmp_path: Path, fsdp_run: bool, switch: str, said: str
) -> None:
    run_dir = _trained_slurm_run(tmp_path)
    if fsdp_run:
        _as_fsdp(run_dir)
    before = _run_files(run_dir)
    for dry in ([], ["--dry-run"]):
        code, out, err, sbatch = _resume_out(run_dir, switch, *dry)
        assert (code, sbatch, out) == (2, [], "")
        assert f"train.strategy cannot change {said}" in err
        back = "fsdp" if fsdp_run else "ddp"
        assert f"HINT: resume with train.strategy={back} (`hpc-ddp resume {run_dir} " in err
        assert "--export FILE`) and start a new run from them." in err
    assert _run_files(run_dir) == before
    assert read_manifest(run_dir).job_id == "77"


def test_a_hand_edit_of_the_built_in_trainers_strategy_is_refused_too(tmp_path: Path) -> None:
    run_dir = _trained_slurm_run(tmp_path)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("  strategy: ddp\n", "  strategy: fsdp\n"))
    code, _, err, sbatch = _resume_out(run_dir)
    assert (code, sbatch) == (2, [])
    assert "train.strategy cannot change from ddp to fsdp on resume" in err
    # Putting it back by override, as the HINT says, goes on.
    code, _, err, _ = _resume_out(run_dir, "train.strategy=ddp", "--dry-run")
    assert code == 0, err


def test_a_switch_with_no_checkpoint_or_with_the_new_kind_on_disk_goes_on(
    tmp_path: Path,
) -> None:
    fresh = _trained_slurm_run(tmp_path / "fresh", checkpoint=False)  # starts from step 0
    code, _, err, _ = _resume_out(fresh, "train.strategy=fsdp", "--dry-run")
    assert code == 0, err
    both = _trained_slurm_run(tmp_path / "both")
    (both / "checkpoints" / "step-00000016").mkdir()  # an FSDP save of its own
    (both / "checkpoints" / "step-00000016" / "digests.json").write_text("{}")
    code, _, err, _ = _resume_out(both, "train.strategy=fsdp", "--dry-run")
    assert code == 0, err


def test_the_same_strategy_goes_on(tmp_path: Path) -> None:
    run_dir = _trained_slurm_run(tmp_path)
    code, _, err, _ = _resume_out(run_dir, "train.strategy=ddp", "--dry-run")
    assert code == 0, err
