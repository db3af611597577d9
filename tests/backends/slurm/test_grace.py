"""The preemption grace a submit checks the measured stop against: Slurm's answers parsed
(partition, QOS, KillWait) and the warning it gives."""

from __future__ import annotations

import pytest

from hpc_ddp.backends.base import Grace
from hpc_ddp.backends.slurm.backend import SlurmBackend
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import parse_seconds, parse_show_config
from hpc_ddp.config.leadtime import grace_warning, stop_needs_s
from hpc_ddp.errors import SlurmError

CONFIG = """Configuration data as of 2026-11-29T06:00:00
KillWait                = 5 sec
MaxArraySize            = 1001
PreemptMode             = REQUEUE
PreemptType             = {kind}
"""
LOW = "PartitionName=low AllowGroups=ALL Nodes=n[1-2] PreemptMode=REQUEUE GraceTime=10 State=UP"
HIGH = "PartitionName=high Nodes=n[1-2] PreemptMode=OFF GraceTime=0 State=UP"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30 sec", 30), ("10", 10), ("00:05:00", 300), ("1-00:00:01", 86401), ("", 0)],
)
def test_slurm_durations(text: str, seconds: int) -> None:
    assert parse_seconds(text) == seconds


def test_a_duration_slurm_never_prints_is_an_error() -> None:
    with pytest.raises(SlurmError, match="not a Slurm duration"):
        parse_seconds("soon")


def test_show_config_lines() -> None:
    fields = parse_show_config(CONFIG.format(kind="preempt/partition_prio"))
    assert fields["KillWait"] == "5 sec"
    assert fields["PreemptType"] == "preempt/partition_prio"


def _grace(kind: str, partition: str, *answers: str, qos: str | None = None) -> Grace | None:
    slurm = FakeSlurm()
    slurm.script("scontrol show config", CONFIG.format(kind=kind))
    for answer in answers:
        slurm.script(answer.split(" ", 1)[0], answer.split(" ", 1)[1])
    return SlurmBackend(slurm.client()).preemption_grace(partition, qos)


def test_a_preemptible_partition_gives_its_grace_time_plus_kill_wait() -> None:
    grace = _grace("preempt/partition_prio", "low", f"scontrol {LOW}")
    assert grace == Grace(10, 5, "partition low")
    assert grace.total_s == 15


def test_no_grace_where_nothing_is_preempted() -> None:
    assert _grace("preempt/partition_prio", "high", f"scontrol {HIGH}") is None
    assert _grace("preempt/none", "low") is None


def test_under_preempt_qos_the_qos_grace_time_counts() -> None:
    grace = _grace("preempt/qos", "low", "sacctmgr 00:02:00", qos="normal")
    assert grace == Grace(120, 5, "QOS normal")


def test_the_warning_compares_the_grace_with_the_measured_stop() -> None:
    needs = stop_needs_s([2.0, 20.0])
    assert needs == 35.0
    words = grace_warning(10, 5, "partition low", needs)
    assert words is not None
    assert "15 s from SIGTERM to SIGKILL" in words
    assert "HINT:" in words
    assert grace_warning(30, 5, "partition low", needs) is None
    assert stop_needs_s([]) is None
