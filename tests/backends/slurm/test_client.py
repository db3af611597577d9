"""Tests of the Slurm client: output parsers on captured Slurm output, and SlurmClient's commands
through a fake runner that records argv and replays canned output.

The squeue sample is captured from ``squeue -h -t all -j IDS -O <SQUEUE_FORMAT>`` on the dev
cluster (Debian's 22.05.8). ``subprocess_runner`` is tested on real processes.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hpc_ddp.backends.jobs import JOB_REF, JobState, is_job_ref
from hpc_ddp.backends.slurm.client import SlurmClient, subprocess_runner
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import (
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    CompletedCommand,
    parse_job_state,
    parse_max_array_size,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_oneliner,
    parse_squeue,
)
from hpc_ddp.errors import (
    RunDirError,
    SlurmError,
    SlurmUnavailableError,
    SubmissionError,
    TargetError,
)

SCRIPT = Path("/runs/demo/job.sbatch")


class FakeRunner:
    """A Runner that records every argv and answers with the next canned (rc, stdout, stderr)."""

    def __init__(self, *replies: tuple[int, str, str]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[tuple[str, ...], float | None]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        self.calls.append((tuple(argv), timeout))
        rc, out, err = self.replies.pop(0)
        return CompletedCommand(tuple(argv), rc, out, err)

    @property
    def argvs(self) -> list[tuple[str, ...]]:
        return [argv for argv, _ in self.calls]


def client(*replies: tuple[int, str, str]) -> tuple[SlurmClient, FakeRunner]:
    runner = FakeRunner(*replies)
    return SlurmClient(runner, timeout=7.0), runner


# Captured on the dev cluster: a job requeued once (held, BeginTime), a two-task-at-a-time
# array (two running tasks and the pending range), a finished and a cancelled job, a script
# path with a space and a '|', and a pending job with no nodes yet.
SQUEUE_2205 = """\
1|1|N/A|CANCELLED|n1|0:22|0|None|(null)
6|6|N/A|COMPLETED|n1|0:00|0|None|/runs/b/job.sbatch
4|4|N/A|PENDING||0:00|1|BeginTime|/runs/a/job.sbatch
5|5|2-7%2|PENDING||0:00|0|JobArrayTaskLimit|/runs/sweep/job.sbatch
7|5|0|RUNNING|n1|0:03|0|None|/runs/sweep/job.sbatch
8|5|1|RUNNING|n2|1-02:03:04|0|None|/runs/sweep/job.sbatch
9|9|N/A|COMPLETING|n[1-2]|1:02:03|2|None|/tmp/sq/a b|c.sh
"""


# --- sbatch -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("123\n", ("123", None)),
        ("123;cluster-a\n", ("123", "cluster-a")),
        ("  42  \n\n", ("42", None)),
        ("sbatch: note from a site wrapper\n77\n", ("77", None)),
    ],
)
def test_parse_sbatch_parsable(stdout: str, expected: tuple[str, str | None]) -> None:
    assert parse_sbatch_parsable(stdout) == expected


@pytest.mark.parametrize(
    "stdout", ["", "\n", "Submitted batch job 12\n", "12;\n", "12 extra\n", "abc;cl\n"]
)
def test_parse_sbatch_parsable_quotes_what_it_could_not_parse(stdout: str) -> None:
    with pytest.raises(SubmissionError, match="HINT:") as info:
        parse_sbatch_parsable(stdout)
    assert repr(stdout) in str(info.value)


def test_submit_runs_sbatch_parsable_and_returns_the_job_id() -> None:
    slurm, runner = client((0, "4242;hpcddp-dev\n", ""))
    result = slurm.submit(SCRIPT, extra_args=["--dependency=afterok:1"])
    assert runner.calls == [(("sbatch", "--parsable", "--dependency=afterok:1", str(SCRIPT)), 7.0)]
    assert (result.job_id, result.cluster) == ("4242", "hpcddp-dev")
    assert result.command == runner.argvs[0]
    assert slurm.submit_command(SCRIPT) == ["sbatch", "--parsable", str(SCRIPT)]


def test_submit_refused_quotes_the_command_and_sbatch_stderr_as_it_came() -> None:
    stderr = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    slurm, _ = client((1, "", stderr))
    with pytest.raises(SubmissionError) as info:
        slurm.submit(SCRIPT)
    message = str(info.value)
    assert f"command: sbatch --parsable {SCRIPT}" in message
    assert stderr.rstrip("\n") in message
    assert "exit 1" in message
    assert message.splitlines()[-1].startswith("HINT:")


def test_submit_with_unparsable_output_is_a_submission_error() -> None:
    slurm, _ = client((0, "Submitted batch job 5\n", ""))
    with pytest.raises(SubmissionError, match="Submitted batch job 5"):
        slurm.submit(SCRIPT)


def test_test_only_returns_sbatch_message_and_no_job_id() -> None:
    said = "sbatch: Job 15 to start at 2026-11-22T08:00:00 using 2 processors on nodes n[1-2]"
    slurm, runner = client((0, "", said + "\n"))
    result = slurm.submit(SCRIPT, test_only=True)
    assert runner.argvs == [("sbatch", "--test-only", str(SCRIPT))]
    assert result.job_id is None
    assert result.message == said


def test_test_only_refusal_carries_sbatch_reason() -> None:
    reason = (
        "allocation failure: Requested node configuration is not available\n"
        "sbatch: error: Job submit/allocate failed: Requested node configuration is not available"
    )
    slurm, _ = client((1, "", reason + "\n"))
    with pytest.raises(SubmissionError) as info:
        slurm.submit(SCRIPT, test_only=True)
    assert reason in str(info.value)
    assert f"sbatch --test-only {SCRIPT}" in str(info.value)


@pytest.mark.parametrize(
    "stderr",
    [
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)\n",
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n",
    ],
)
def test_unreachable_controller_is_slurm_unavailable(stderr: str) -> None:
    slurm, _ = client((1, "", stderr))
    with pytest.raises(SlurmUnavailableError, match="HINT:"):
        slurm.submit(SCRIPT)


# --- squeue -------------------------------------------------------------------------------------


def test_squeue_format_asks_every_field_unpadded_with_command_last() -> None:
    assert SQUEUE_FORMAT.split(",")[0] == "JobID:0|"
    assert SQUEUE_FORMAT.endswith(",Command:0")
    assert len(SQUEUE_FORMAT.split(",")) == len(SQUEUE_FIELDS) == 9


def test_parse_squeue_captured_sample() -> None:
    infos = {info.ref: info for info in parse_squeue(SQUEUE_2205)}
    assert sorted(infos) == ["1", "4", "5_0", "5_1", "5_[2-7%2]", "6", "9"]
    assert (infos["1"].state, infos["1"].elapsed_s, infos["1"].command) == (
        JobState.CANCELLED,
        22,
        "",
    )
    assert infos["1"].array_job_id is None
    held = infos["4"]
    assert (held.state, held.reason, held.restart_count, held.elapsed_s, held.nodes) == (
        JobState.PENDING,
        "BeginTime",
        1,
        None,  # a pending job's TimeUsed is no run time
        "",
    )
    assert held.command == "/runs/a/job.sbatch"
    pending = infos["5_[2-7%2]"]
    assert (pending.job_id, pending.array_job_id, pending.array_task_id) == ("5", "5", "[2-7%2]")
    assert pending.reason == "JobArrayTaskLimit"
    task = infos["5_0"]
    assert (task.job_id, task.array_job_id, task.array_task_id, task.state) == (
        "7",
        "5",
        "0",
        JobState.RUNNING,
    )
    assert (task.elapsed_s, task.reason) == (3, "")
    assert infos["5_1"].elapsed_s == ((24 + 2) * 60 + 3) * 60 + 4
    last = infos["9"]
    assert (last.state, last.elapsed_s, last.restart_count, last.nodes) == (
        JobState.COMPLETING,
        3723,
        2,
        "n[1-2]",
    )
    assert last.command == "/tmp/sq/a b|c.sh"  # the '|' in a path does not split it


@pytest.mark.parametrize(
    "text", ["JOBID STATE\n", '{"jobs": []}\n', "1|1|N/A|RUNNING\n", "x|1|N/A|R|n1|0:01|0|None|s\n"]
)
def test_parse_squeue_rejects_other_output_and_quotes_it(text: str) -> None:
    with pytest.raises(SlurmError, match="HINT:") as info:
        parse_squeue(text)
    assert repr(text.splitlines()[0]) in str(info.value)


@pytest.mark.parametrize(
    ("wanted", "refs"),
    [
        (["4"], ["4"]),
        (["5"], ["5_0", "5_1", "5_[2-7%2]"]),
        (["7"], ["5_0"]),
        (["5_1"], ["5_1"]),
        (["1", "6", "999"], ["1", "6"]),
    ],
)
def test_job_states_asks_squeue_for_those_ids_only(wanted: list[str], refs: list[str]) -> None:
    slurm, runner = client((0, SQUEUE_2205, ""))
    states = slurm.job_states(wanted)
    # squeue filters by id (-j) in every state (-t all: finished jobs within MinJobAge too);
    # rows it adds beyond them (another array's tasks) are dropped here.
    assert runner.argvs == [
        ("squeue", "-h", "-t", "all", "-j", ",".join(wanted), "-O", SQUEUE_FORMAT)
    ]
    assert sorted(states) == sorted(refs)
    assert all(states[ref].ref == ref for ref in refs)


def test_job_states_without_ids_or_with_bad_ids_asks_nothing() -> None:
    slurm, runner = client()
    assert slurm.job_states([]) == {}
    # A local backend's pid is a number, but "12x" or "" would make squeue refuse every id.
    assert slurm.job_states(["12x", "", "1;rm -rf /"]) == {}
    assert runner.argvs == []


def test_job_states_of_vanished_jobs_is_empty_not_an_error() -> None:
    slurm, _ = client((1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    assert slurm.job_states(["999999"]) == {}


def test_job_states_asks_in_chunks() -> None:
    ids = [str(i) for i in range(1, 1202)]
    row = "700|700|N/A|RUNNING|n1|0:01|0|None|/r/job.sbatch\n"
    slurm, runner = client((0, "", ""), (0, row, ""), (1, "", "Invalid job id specified\n"))
    assert list(slurm.job_states(ids)) == ["700"]
    assert [len(a[5].split(",")) for a in runner.argvs] == [500, 500, 201]
    assert runner.argvs[1][5].startswith("501,")


def test_job_states_failure_is_a_slurm_error() -> None:
    slurm, _ = client((1, "", "squeue: error: Invalid user\n"))
    with pytest.raises(SlurmError, match="squeue: error: Invalid user"):
        slurm.job_states(["1"])


@pytest.mark.parametrize(
    ("value", "state"),
    [
        ("RUNNING", JobState.RUNNING),
        ("CANCELLED by 1000", JobState.CANCELLED),
        ("PD", JobState.PENDING),
        ("OOM", JobState.OUT_OF_MEMORY),
        ("out_of_memory", JobState.OUT_OF_MEMORY),
        (["PENDING"], JobState.PENDING),
        (["RUNNING", "COMPLETING"], JobState.COMPLETING),
        (["PENDING", "REQUEUED"], JobState.REQUEUED),
        (["FAILED", "LAUNCH_FAILED"], JobState.FAILED),
        ("BOGUS", JobState.UNKNOWN),
        ([], JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
    ],
)
def test_parse_job_state(value: str | list[str] | None, state: JobState) -> None:
    assert parse_job_state(value) is state


def test_finished_states() -> None:
    finished = {s for s in JobState if s.finished}
    assert finished == {
        JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
        JobState.PREEMPTED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.BOOT_FAIL,
        JobState.DEADLINE, JobState.REVOKED,
    }  # fmt: skip
    assert JobState("RUNNING") == "RUNNING"


# --- scontrol -----------------------------------------------------------------------------------

# Captured from `scontrol show job -o 1` on the dev cluster (22.05.8).
SHOW_JOB_1 = (
    "JobId=1 JobName=t.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 "
    "TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-22T07:49:41 "
    "EligibleTime=2026-11-22T07:49:41 AccrueTime=2026-11-22T07:49:41 "
    "StartTime=2026-11-22T07:49:42 EndTime=2026-11-22T07:49:42 Deadline=N/A "
    "PreemptEligibleTime=2026-11-22T07:49:42 PreemptTime=None SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-22T07:49:42 Scheduler=Backfill Partition=debug "
    "AllocNode:Sid=localhost:1098 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] "
    "BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/sj/t.sh "
    "WorkDir=/tmp StdErr=/tmp/sj/out-1.txt StdIn=/dev/null StdOut=/tmp/sj/out-1.txt Power= \n"
)


def test_parse_scontrol_oneliner_captured_line() -> None:
    fields = parse_scontrol_oneliner(SHOW_JOB_1)
    assert fields["JobId"] == "1"
    assert fields["JobState"] == "COMPLETED"
    assert fields["Restarts"] == "0"
    assert fields["NumTasks"] == "2"
    assert fields["CPUs/Task"] == "1"
    assert fields["AllocNode:Sid"] == "localhost:1098"
    assert fields["ReqB:S:C:T"] == "0:0:*:*"
    assert fields["TRES"] == "cpu=2,node=2,billing=2"
    assert fields["StdOut"] == "/tmp/sj/out-1.txt"
    assert fields["Power"] == ""
    # No value in this line holds a space: every token is one pair.
    assert len(fields) == len(SHOW_JOB_1.split()) == 62


def test_parse_scontrol_oneliner_values_with_spaces() -> None:
    line = (
        "JobId=7 JobName=my job Comment=lr sweep, take 2 Command=/home/a b/run.sh --lr 0.1 "
        "WorkDir=/home/a b StdOut=/runs/x y/logs/batch-7.out"
    )
    assert parse_scontrol_oneliner(line) == {
        "JobId": "7",
        "JobName": "my job",
        "Comment": "lr sweep, take 2",
        "Command": "/home/a b/run.sh --lr 0.1",
        "WorkDir": "/home/a b",
        "StdOut": "/runs/x y/logs/batch-7.out",
    }


def test_show_job_returns_the_first_line() -> None:
    slurm, runner = client((0, SHOW_JOB_1 + SHOW_JOB_1.replace("JobId=1 ", "JobId=2 "), ""))
    assert slurm.show_job("1")["JobId"] == "1"
    assert runner.argvs == [("scontrol", "show", "job", "-o", "1")]


def test_show_job_of_unknown_job_is_a_slurm_error_with_hint() -> None:
    slurm, _ = client((1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    with pytest.raises(SlurmError, match="Invalid job id specified") as info:
        slurm.show_job("99999")
    assert "MinJobAge" in str(info.value)


SHOW_CONFIG = """Configuration data as of 2026-11-22T07:54:20
AccountingStorageType   = accounting_storage/none
MaxArraySize            = 1001
MaxJobCount             = 10000
SLURM_VERSION           = 22.05.8
"""


def test_max_array_size() -> None:
    slurm, runner = client((0, SHOW_CONFIG, ""))
    assert slurm.max_array_size() == 1001
    assert runner.argvs == [("scontrol", "show", "config")]


def test_max_array_size_missing_line() -> None:
    with pytest.raises(SlurmError, match="MaxArraySize"):
        parse_max_array_size("MaxJobCount = 10000\n")


def test_requeue_and_cancel_argv() -> None:
    slurm, runner = client((0, "", ""), (0, "", ""), (0, "", ""))
    slurm.requeue("12_3")
    slurm.cancel("12")
    slurm.cancel("12_3", signal="USR2", full=True)
    assert runner.argvs == [
        ("scontrol", "requeue", "12_3"),
        ("scancel", "12"),
        ("scancel", "--signal=USR2", "--full", "12_3"),
    ]


# What a damaged manifest or arrays.json may hold where a job id belongs: each would make a
# Slurm command act on other jobs (`scancel --me`: every job of the user) or on none.
NOT_JOB_IDS = ["--me", "1,2,3", "12_[1-3]", "12 13", "-1", "0", "", "12x", "1;rm -rf /",
               "12_", "_3", "12_03", "12.batch", "+12", "１２"]  # fmt: skip


@pytest.mark.parametrize("text", ["1", "123", "4294967295", "12_0", "12_3", "1001_999"])
def test_job_ids_slurm_names_are_accepted(text: str) -> None:
    assert is_job_ref(text)


@pytest.mark.parametrize("text", NOT_JOB_IDS)
def test_anything_else_is_not_a_job_id(text: str) -> None:
    assert not is_job_ref(text)
    assert JOB_REF.fullmatch(text) is None


@pytest.mark.parametrize("bad", NOT_JOB_IDS)
def test_acting_commands_refuse_a_bad_id_naming_its_file_and_run_nothing(bad: str) -> None:
    slurm = FakeSlurm()
    victim = slurm.add_job("12", state=JobState.RUNNING)
    client = slurm.client()
    source = "/runs/demo/manifest.json"
    calls: list[Callable[[], object]] = [
        lambda: client.cancel(bad, source=source),
        lambda: client.cancel(bad, signal="USR2", source=source),
        lambda: client.requeue(bad, source=source),
        lambda: client.show_job(bad, source=source),
    ]
    for call in calls:
        with pytest.raises(RunDirError) as info:
            call()
        assert type(info.value) is RunDirError
        message = str(info.value)
        assert message.startswith(f"{source}: job id {bad!r} is not a Slurm job id")
        assert "nothing was sent to Slurm. HINT: the file is damaged" in message
    # Typed by a person (no file): a usage error.
    with pytest.raises(TargetError, match=r"is not a Slurm job id.*HINT: pass one job id"):
        client.cancel(bad)
    assert slurm.calls == []
    assert victim.state is JobState.RUNNING


def test_queries_leave_bad_ids_out_and_send_the_good_ones() -> None:
    slurm = FakeSlurm()
    slurm.add_job("12", state=JobState.RUNNING)
    slurm.add_job("13", state=JobState.COMPLETED, in_queue=False)
    client = slurm.client()
    assert list(client.job_states([*NOT_JOB_IDS, "12"])) == ["12"]
    records = client.sacct_states([*NOT_JOB_IDS, "13"])
    assert records is not None
    assert list(records) == ["13"]
    assert slurm.commands() == [
        f"squeue -h -t all -j 12 -O {SQUEUE_FORMAT}",
        "sacct -n -P -X -D -o JobID,State,ExitCode,Elapsed,Submit,SubmitLine -j 13",
    ]
    assert client.sacct_states(NOT_JOB_IDS) == {}  # nothing left to ask about
    assert len(slurm.calls) == 2


def test_the_fake_cancels_every_job_for_scancel_me_as_slurm_does() -> None:
    """The fake answers the dangerous argv as Slurm would, so a regression shows as harm."""
    slurm = FakeSlurm()
    jobs = [slurm.add_job(j, state=JobState.RUNNING) for j in ("12", "13")]
    assert slurm(["scancel", "--me"]).returncode == 0
    assert [j.state for j in jobs] == [JobState.CANCELLED, JobState.CANCELLED]


def test_requeue_refused_is_a_slurm_error() -> None:
    stderr = "Requested operation is presently disabled for job 5\n"
    slurm, _ = client((1, "", stderr))
    with pytest.raises(SlurmError, match="presently disabled") as info:
        slurm.requeue("5")
    assert "command: scontrol requeue 5" in str(info.value)


# --- sacct --------------------------------------------------------------------------------------


def test_sacct_disabled_returns_none() -> None:
    slurm, runner = client((1, "", "sacct: error: Slurm accounting storage is disabled\n"))
    assert slurm.sacct_states(["1", "2"]) is None
    assert runner.argvs == [
        ("sacct", "-n", "-P", "-X", "-D", "-o", ",".join(SACCT_FIELDS), "-j", "1,2")
    ]


def test_sacct_records() -> None:
    out = (
        "8|CANCELLED by 0|0:15|00:00:17\n"
        "8.batch|CANCELLED|0:15|00:00:17\n"
        "12_1|COMPLETED|0:0|1-02:03:04\n"
        "9.0|FAILED|127:0|00:00:01\n"
        "garbage line\n"
    )
    slurm, _ = client((0, out, ""))
    records = slurm.sacct_states(["8", "9", "12"])
    assert records is not None
    assert sorted(records) == ["12_1", "8", "8.batch", "9.0"]
    assert records["8"].state is JobState.CANCELLED
    assert records["8"].raw_state == "CANCELLED by 0"
    assert records["8"].elapsed_s == 17
    assert records["12_1"].elapsed_s == ((24 + 2) * 60 + 3) * 60 + 4
    assert (records["9.0"].state, records["9.0"].exit_code) == (JobState.FAILED, "127:0")
    assert parse_sacct("1|RUNNING|0:0|INVALID\n")["1"].elapsed_s is None


# sacct -X -D of Slurm 22.05 (dev cluster): job 7 requeued once, then completed; job 9 run twice
# under the same id, the controller's state wiped between them; an array's tasks.
_SACCT_D = """\
7|REQUEUED|0:0|00:00:03|2026-11-24T06:02:49|sbatch --parsable /runs/a/job.sbatch
9|COMPLETED|0:0|00:01:00|2026-11-24T06:04:02|sbatch --parsable /runs/x|y/job.sbatch
7|COMPLETED|0:0|00:00:00|2026-11-24T06:02:50|sbatch --parsable /runs/a/job.sbatch
9|FAILED|1:0|00:00:01|2026-11-24T07:10:00|sbatch --parsable /runs/second/job.sbatch
12_0|COMPLETED|0:0|00:00:09|2026-11-24T06:05:00|sbatch --parsable /sweeps/s/array-0.sbatch
12_2|CANCELLED by 0|0:0|00:00:00|2026-11-24T06:05:00|sbatch --parsable /sweeps/s/array-0.sbatch
"""


def test_sacct_keeps_every_run_of_an_id_the_newest_first() -> None:
    records = parse_sacct(_SACCT_D)
    assert sorted(records) == ["12_0", "12_2", "7", "9"]
    requeued = records["7"]
    assert (requeued.state, requeued.submitted) == (JobState.COMPLETED, "2026-11-24T06:02:50")
    assert [r.state for r in requeued.earlier] == [JobState.REQUEUED]
    assert requeued.submitted_with(["/runs/a/job.sbatch"]) is requeued
    # The newest job 9 is another run's: each run finds its own by the script sbatch ran.
    reused = records["9"]
    assert reused.state is JobState.FAILED
    mine = reused.submitted_with(["/runs/x|y/job.sbatch"])  # `|` in a path stays in its field
    assert mine is not None
    assert (mine.state, mine.elapsed_s) == (JobState.COMPLETED, 60)
    assert reused.submitted_with(["/runs/second/job.sbatch"]) is reused
    assert reused.submitted_with(["/runs/other/job.sbatch"]) is None
    assert reused.submitted_with(["second/job.sbatch"]) is None  # whole paths only
    assert records["12_2"].state is JobState.CANCELLED


def test_sacct_lines_without_a_submit_line_match_any_script() -> None:
    """An older sacct's four fields: no command line to tell jobs apart, so the newest line."""
    records = parse_sacct("5|FAILED|1:0|00:00:02\n5|COMPLETED|0:0|00:00:03\n")
    assert records["5"].state is JobState.COMPLETED  # the same Submit (none): the later line
    assert records["5"].submitted_with(["/runs/a/job.sbatch"]) is records["5"]


def test_sacct_other_failure_raises() -> None:
    slurm, _ = client((1, "", "sacct: error: Problem talking to the database\n"))
    with pytest.raises(SlurmError, match="Problem talking to the database"):
        slurm.sacct_states(["1"])


# --- the real runner ----------------------------------------------------------------------------


def test_subprocess_runner_captures_output_and_never_uses_a_shell(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    code = "import sys; print(sys.argv[1]); print('err', file=sys.stderr); sys.exit(3)"
    hostile = f"$(touch {sentinel}); `touch {sentinel}`"
    result = subprocess_runner([sys.executable, "-c", code, hostile], timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (3, hostile + "\n", "err\n")
    assert result.argv == (sys.executable, "-c", code, hostile)
    assert not sentinel.exists()


def test_a_command_finishes_through_the_sigterm_its_own_request_brings() -> None:
    """A rank's ``scontrol requeue`` is in the job's step: the SIGTERM its accepted requeue
    sends the step reaches it too. It must still finish and exit 0 (a real signal, sent to the
    real child), and this process hears SIGTERM again afterwards."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('finished')"
    result = subprocess_runner([sys.executable, "-c", code], timeout=30)
    assert (result.returncode, result.stdout) == (0, "finished\n")
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_subprocess_runner_missing_command_is_slurm_unavailable() -> None:
    with pytest.raises(SlurmUnavailableError, match=r"not on PATH.*HINT:"):
        subprocess_runner(["hpc-ddp-no-such-sbatch", "--parsable"])


def test_subprocess_runner_timeout_is_slurm_unavailable() -> None:
    with pytest.raises(SlurmUnavailableError, match=r"did not finish within 0\.2 s"):
        subprocess_runner([sys.executable, "-c", "import time; time.sleep(10)"], timeout=0.2)


# --- the real cluster (read-only) ---------------------------------------------------------------


@pytest.mark.slurm
def test_real_cluster_read_only_commands() -> None:
    slurm = SlurmClient()
    assert slurm.max_array_size() > 1
    states = slurm.job_states([])
    assert states == {}


@pytest.mark.slurm
def test_real_squeue_filters_by_id_and_keeps_finished_jobs(tmp_path: Path) -> None:
    """squeue -j -t all on 22.05: the job (also once finished), its script path, nothing else."""
    script = tmp_path / "a b|c.sh"
    script.write_text("#!/bin/sh\nsleep 1\n")
    slurm = SlurmClient()
    extra = ["-o", str(tmp_path / "out-%j.txt"), "--array=0-2%1"]
    array = slurm.submit(script, extra_args=extra).job_id
    plain = slurm.submit(script, extra_args=["-o", str(tmp_path / "out-%j.txt")]).job_id
    assert array is not None
    assert plain is not None
    states = slurm.job_states([plain])
    assert list(states) == [plain]
    assert states[plain].command == str(script)
    assert states[plain].array_job_id is None
    # An array id matches each task and the pending range; finished jobs stay listed.
    deadline = time.monotonic() + 60
    while True:
        states = slurm.job_states([array, plain])
        if len(states) == 4 and all(i.state.finished for i in states.values()):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.5)
    assert sorted(states) == sorted([plain, f"{array}_0", f"{array}_1", f"{array}_2"])
    assert {i.state for i in states.values()} == {JobState.COMPLETED}
    assert all(i.elapsed_s is not None for i in states.values())
    # A vanished or never-seen id is no error, and does not hide the known ones.
    assert list(slurm.job_states(["99999999", plain])) == [plain]
    assert slurm.job_states(["99999999"]) == {}
