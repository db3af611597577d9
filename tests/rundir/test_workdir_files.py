"""What a command wrote where it ran, and the warning the next submit from there gives
(issue 39 item 12: a fresh run never silently continues another run's files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_ddp.rundir.workdir_files import files_written, leftovers, read_written, record_written


def test_the_files_an_attempt_wrote_are_recorded_and_found_while_they_stay(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "old.txt").write_text("before")
    os.utime(work / "old.txt", (time.time() - 60, time.time() - 60))
    began = time.time() - 1
    (work / "snapshot.pt").write_text("s")
    (work / "ckpt" / "last.pt").write_text("c")
    assert files_written(work, began) == ["ckpt/last.pt", "snapshot.pt"]
    runs = tmp_path / "runs"
    first, second = runs / "a-20261128-100000", runs / "a-20261128-110000"
    first.mkdir(parents=True)
    second.mkdir()
    record_written(first, work, ["snapshot.pt"])
    record_written(first, work, ["ckpt/last.pt"])  # a later attempt adds to it
    assert read_written(first) == (str(work), ["ckpt/last.pt", "snapshot.pt"])
    record_written(second, tmp_path / "elsewhere", ["snapshot.pt"])  # another directory
    found = leftovers(runs, work)
    assert [(f.run_dir.name, f.name) for f in found] == [
        ("a-20261128-100000", "ckpt/last.pt"),
        ("a-20261128-100000", "snapshot.pt"),
    ]
    (work / "snapshot.pt").unlink()
    assert [f.name for f in leftovers(runs, work)] == ["ckpt/last.pt"]
    (first / "workdir_files.json").write_text("{not json")
    assert leftovers(runs, work) == []  # a damaged record warns of nothing, fails nothing


def test_a_submit_from_where_a_program_left_its_snapshot_warns_of_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = work / "snap.py"
    script.write_text("open('snapshot.pt', 'w').write('epoch 3')\n")
    (work / "job.yaml").write_text("name: snap\ncommand: [python, snap.py]\n")
    hpc = [sys.executable, "-m", "hpc_ddp"]
    run = subprocess.run(
        [*hpc, "submit", "job.yaml", "--backend", "local", "--wait", "--json"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "snapshot.pt" not in run.stderr  # the first run met nothing
    run_dir = Path(json.loads(run.stdout.splitlines()[0])["run_dir"])
    assert read_written(run_dir) == (str(work), ["snapshot.pt"])
    again = subprocess.run(
        [*hpc, "submit", "job.yaml", "--backend", "local", "--dry-run"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert f"left snapshot.pt (run {run_dir.name})" in again.stderr
    assert "HINT: move or delete them" in again.stderr
