"""``requeue.lead_time: auto`` at submit: the history rank 0 writes, read and sized."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.rundir.savetimes import SaveTimes, history_path, read_save_times
from hpc_ddp.submission.leadtime import resolve_lead_time


def _cfg(lead: object = "auto", name: str = "big") -> JobConfig:
    data = {"name": name, "slurm": {"time": "01:00:00"}, "requeue": {"lead_time": lead}}
    return job_config_from_dict(data, "x")


def test_auto_without_history_is_the_prior(tmp_path: Path) -> None:
    cfg, lead = resolve_lead_time(_cfg(), {"XDG_STATE_HOME": str(tmp_path)}, time.time())
    assert lead is not None
    assert (lead.seconds, lead.source) == (120, "prior")
    assert cfg.requeue.lead_time == 120


def test_a_number_is_left_alone(tmp_path: Path) -> None:
    cfg = _cfg(300)
    assert resolve_lead_time(cfg, {"XDG_STATE_HOME": str(tmp_path)}, time.time()) == (cfg, None)


def test_saves_rank_0_records_size_the_next_submit(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    path = history_path(env, Path("/nonexistent"))
    assert path == tmp_path / "hpc-ddp" / "savetimes.json"
    big = SaveTimes(path, run_id="r1", name="big")
    for w in (2.0, 25.0, 3.0):
        big.saved(w)
    SaveTimes(path, run_id="r2", name="small").saved(0.5)
    SaveTimes(path, run_id="r1", name="big").saved(4.0)  # its next attempt adds to them
    assert read_save_times(env, Path("/x"), name="big", now=time.time()) == (
        [2.0, 25.0, 3.0, 4.0],
        None,
    )
    cfg, lead = resolve_lead_time(_cfg(), env, time.time())
    assert lead is not None
    assert (lead.seconds, lead.source, lead.saves) == (80, "history", 4)  # 2 x (25 + 15)
    assert cfg.requeue.lead_time == 80
    _, small = resolve_lead_time(_cfg(name="small"), env, time.time())
    assert small is not None
    assert small.seconds == 31  # its own run's saves: 2 x (0.5 + 15)


def test_a_damaged_history_warns_and_gives_the_prior(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    path = history_path(env, Path("/x"))
    path.parent.mkdir(parents=True)
    path.write_text("{damaged")
    with caplog.at_level(logging.WARNING):
        _, lead = resolve_lead_time(_cfg(), env, time.time())
    assert lead is not None
    assert lead.source == "prior"
    assert "not JSON" in caplog.text
    SaveTimes(path, run_id="r1", name="big").saved(10.0)  # rewritten from the next save on
    assert read_save_times(env, Path("/x"), name="big", now=time.time())[0] == [10.0]


def test_dry_run_says_what_auto_chose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # conftest gives every test an empty $XDG_STATE_HOME of its own: the history is this one.
    env = {"XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}
    argv = ["submit", "jobs/quickstart.yaml", "requeue.lead_time=auto", "--dry-run"]
    argv += ["--backend", "slurm", "--runs-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --signal=USR2@120\n" in out
    assert "# requeue.lead_time auto: 120 s (the prior: no save measured yet)" in out
    SaveTimes(history_path(env, Path("/x")), run_id="r1", name="quickstart").saved(20.0)
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "#SBATCH --signal=USR2@70\n" in shown["script"]
    assert shown["lead_time"] == {
        "seconds": 70, "source": "history", "saves": 1, "slowest_s": 20.0, "bound": None
    }  # fmt: skip
    assert main(argv[:2] + argv[3:]) == 0  # a number: nothing said
    assert "lead_time auto" not in capsys.readouterr().out


def test_a_dry_run_warns_of_a_grace_time_shorter_than_the_measured_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ddp.backends.registry import Registry
    from hpc_ddp.backends.slurm.fake import FakeSlurm

    slurm = FakeSlurm()
    argv = ["submit", "jobs/quickstart.yaml", "slurm.partition=low", "--dry-run"]
    argv += ["--backend", "slurm", "--runs-dir", str(tmp_path)]
    assert main(argv, backends=Registry(slurm=slurm.client())) == 0
    assert "warning" not in capsys.readouterr().out
    assert slurm.calls == []  # nothing measured: Slurm is not asked
    env = {"XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}
    SaveTimes(history_path(env, Path("/x")), run_id="r1", name="quickstart").saved(20.0)
    slurm.script("scontrol show config", "KillWait = 5 sec\nPreemptType = preempt/partition_prio")
    slurm.script("scontrol show partition", "PartitionName=low PreemptMode=REQUEUE GraceTime=10")
    assert main(argv, backends=Registry(slurm=slurm.client())) == 0
    out = capsys.readouterr().out
    assert "# warning: a preemption gives 15 s from SIGTERM to SIGKILL (GraceTime 10 s" in out
    slurm.fail("scontrol show config")
    assert main(argv, backends=Registry(slurm=slurm.client())) == 0  # unknown: no warning
    assert "warning" not in capsys.readouterr().out


def test_a_sweeps_points_resolve_auto_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}
    SaveTimes(history_path(env, Path("/x")), run_id="r1", name="quickstart").saved(5.0)
    argv = ["sweep", "jobs/sweep-lr.yaml", "requeue.lead_time=auto", "--dry-run"]
    assert main([*argv, "--backend", "slurm", "--runs-dir", str(tmp_path)]) == 0
    assert "#SBATCH --signal=USR2@40\n" in capsys.readouterr().out  # 2 x (5 + 15)
