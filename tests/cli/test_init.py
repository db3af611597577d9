"""``hpc-ddp init [--byo] [DIR]``: the files it writes pass a local run as they are, and it never
overwrites a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.checkpoint.format import list_checkpoints
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger


def _submit_local(directory: Path, *overrides: str) -> Path:
    """``hpc-ddp submit job.yaml --backend local --wait`` from ``directory``, as a user types
    it; the one run directory it made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "job.yaml", "--backend", "local", "--wait",
         "--runs-dir", "runs", *overrides],
        cwd=directory, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [run] = (directory / "runs").iterdir()
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    return run


@pytest.mark.torch
def test_init_byo_writes_a_job_and_a_script_that_pass_a_local_run(tmp_path: Path) -> None:
    """Two local ranks run the written train.py through the written job.yaml: it ends at its
    last step, with the best checkpoint by val_loss recorded (the job's keep_best)."""
    target = tmp_path / "my proj"
    assert main(["init", "--byo", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["job.yaml", "train.py"]
    assert "name: my-proj\n" in (target / "job.yaml").read_text()
    run = _submit_local(target, "params.steps=60")
    [*_, newest] = list_checkpoints(run)
    assert newest.step == 60
    assert "best val_loss so far" in (run / "logs" / "rank-0.err").read_text()


@pytest.mark.torch
def test_init_writes_a_builtin_trainer_job_that_passes_a_local_run(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]
    run = _submit_local(tmp_path)
    assert list_checkpoints(run)[-1].step == 16  # 1024 samples / (32 x 2 ranks), one epoch


def test_init_never_overwrites_and_writes_nothing_then(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("mine\n")
    assert main(["init", "--byo", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "train.py exists already: nothing was written. HINT:" in err
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no job.yaml either
    assert (tmp_path / "train.py").read_text() == "mine\n"
    assert main(["init", str(tmp_path)]) == 0  # job.yaml alone is free
    assert main(["init", str(tmp_path)]) == 2
