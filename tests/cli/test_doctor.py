"""``hpc-ddp doctor``'s login side over a scripted Slurm whose "tasks" write their reports (one
rank reports, the other is killed): the job it submits, the table, the JSON, the node it
names, and that it imports no torch. The real run is in ``tests/test_e2e_doctor.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import CompletedCommand
from hpc_ddp.cli.main import main
from hpc_ddp.doctor.judgement import TOKEN_FILE, report_path
from tests.helpers.launch import REPO


class DoctorSlurm(FakeSlurm):
    """sbatch "runs" the doctor job at once: on n1 rank 0 writes its report (having read the
    login side's token), and srun reports rank 1 on n2 killed."""

    def _sbatch(self, args: tuple[str, ...]) -> CompletedCommand:
        done = super()._sbatch(args)
        job_id = done.stdout.strip()
        self.jobs[job_id].state = JobState.COMPLETED
        self.jobs[job_id].nodes = "n[1-2]"
        run_dir = Path(args[-1]).parent
        token = (run_dir / "doctor" / TOKEN_FILE).read_text().strip()
        report = {
            "rank": 0, "local_rank": 0, "node": "n1", "world_size": 2, "python": "3.11.7",
            "executable": "/venv/bin/python", "torch": "2.4.1", "backend": "gloo",
            "device": "cpu", "free_bytes": 5 << 30, "total_bytes": 9 << 30, "token": token,
            "port": 23456, "port_role": "listen", "reached": [], "group": "skipped: x",
        }  # fmt: skip
        report_path(run_dir / "doctor", 0).write_text(json.dumps(report))
        (run_dir / "logs" / f"batch-{job_id}.err").write_text(
            "srun: error: n2: task 1: Killed\nsrun: Force Terminated StepId=1000.0\n"
        )
        return done


def test_the_doctor_job_is_the_jobs_resources_with_the_checks_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = DoctorSlurm()
    argv = [
        "doctor", "jobs/quickstart.yaml", "slurm.partition=gpu", "--nodes", "2",
        "--backend", "slurm", "--runs-dir", str(tmp_path), "--json", "--timeout", "20",
    ]  # fmt: skip
    assert main(argv, backends=Registry(slurm.client())) == 1
    result = json.loads(capsys.readouterr().out)
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == tmp_path / "doctor"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["entrypoint"] == "hpc_ddp.doctor.exam:main"
    assert config["command"] is None
    assert config["name"] == "doctor-quickstart"
    assert (config["slurm"]["nodes"], config["slurm"]["partition"]) == (2, "gpu")
    assert config["slurm"]["time"] == "00:10:00"
    assert config["dist"]["timeout_s"] == 20
    assert (config["requeue"]["max_requeues"], config["requeue"]["on_crash"]) == (0, False)
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in script
    assert f"-m hpc_ddp run {run_dir}" in script  # the same task command a job runs
    assert slurm.commands("sbatch") == [f"sbatch --parsable {run_dir}/job.sbatch"]


def test_a_rank_that_left_no_report_is_named_with_srun_s_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["doctor", "slurm.nodes=2", "--backend", "slurm", "--runs-dir", str(tmp_path)]
    assert main([*argv, "--json"], backends=Registry(DoctorSlurm().client())) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is False
    assert result["culprits"] == {"n2": ["report"]}
    assert result["summary"] == "doctor: n2 is broken (report)"
    rows = {(f["rank"], f["check"]): f for f in result["findings"]}
    assert rows[(1, "report")]["note"] == "srun: Killed"
    assert rows[(0, "run dir shared")]["verdict"] == "ok"  # rank 0 read the token back
    assert main(argv, backends=Registry(DoctorSlurm().client())) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["node", "rank", "check", "value", "verdict"]
    assert "FAIL  n2 rank 1 report: srun: Killed" in out
    assert out.rstrip().endswith("doctor: n2 is broken (report)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes 0 is not a node count"),
        (["--timeout", "0"], "--timeout 0 is not positive"),
        (["slurm.nodess=2"], "slurm.nodess"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = ["doctor", *args, "--backend", "slurm", "--runs-dir", str(tmp_path)]
    assert main(argv, backends=Registry(DoctorSlurm().client())) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "doctor").exists()


def test_the_login_side_imports_no_torch(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from hpc_ddp.backends.registry import Registry\n"
        "from hpc_ddp.cli.main import main\n"
        "from tests.cli.test_doctor import DoctorSlurm\n"
        "argv = ['doctor', 'slurm.nodes=2', '--backend', 'slurm', '--runs-dir', sys.argv[-1]]\n"
        "assert main(argv, backends=Registry(DoctorSlurm().client())) == 1\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'submitit')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip().splitlines()[-1] == "[]"
