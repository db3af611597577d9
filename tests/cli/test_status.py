"""``hpc-ddp status`` (and ``cancel``'s target lookup, and ``submit --wait``): the verdict table,
damaged runs among good ones, plain runs beside sweeps, where Slurm's word comes from, polling
with back-off, and a runs directory that cannot be read.

Unit tests answer for Slurm with a fake runner (squeue text in the client's own format); the
tests marked ``slurm`` run real jobs on the dev cluster and read them through the real CLI.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp.cli.main as cli_main
from hpc_ddp.api.targets import resolve_targets
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.local.process import identify, identify_started, write_identity
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import CompletedCommand, parse_job_state
from hpc_ddp.backends.slurm.postmortem import has_logs, startup_failure
from hpc_ddp.cli.main import main
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.state.verdict import Source, judge
from hpc_ddp.submission import wait
from hpc_ddp.submission.wait import wait_for_jobs
from tests import e2e_util as e2e
from tests.conftest import Cluster
from tests.ledgers import record_end, record_start

T0 = 1_767_268_800.0


def attempt(number: int = 0, cause: EndCause | None = None, **kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "attempt": number, "started": T0 + number, "ended": None if cause is None else T0 + 9,
        "cause": cause, "steps_done": None, "checkpoint": None, "nodelist": "n[1-2]",
        "job_ref": "11", "resumed_from_step": None,
    }  # fmt: skip
    return Attempt(**{**fields, **kw})


def no_logs() -> str | None:
    return None


def logs_say(line: str) -> Callable[[], str | None]:
    return lambda: line


def never() -> str | None:
    raise AssertionError("the logs were read although Slurm's word and the ledger sufficed")


CRASHED = attempt(0, EndCause.CRASH, message="rank 1 on n2: RuntimeError: boom")
REQUEUE_ASKED = attempt(0, EndCause.TIME_LIMIT, steps_done=7, requeue_requested=True)
FINISHED = attempt(0, EndCause.FINISHED, steps_done=64)
OPEN = attempt(0)
CKPT_ERROR = "rank-0.err: hpc-ddp run: error: none of 2 checkpoints loads"

S = JobState

# (Slurm's state, where from, ledger, what the logs say) -> (state shown, words in the note)
VERDICTS: list[tuple[JobState | None, Source, list[Attempt], Callable[[], str | None], str, str]]
VERDICTS = [
    # Slurm still has it running or queued: its word stands.
    (S.RUNNING, Source.SQUEUE, [OPEN], never, "RUNNING", ""),
    (S.PENDING, Source.SQUEUE, [], never, "PENDING", ""),
    (S.PENDING, Source.SQUEUE, [REQUEUE_ASKED], never, "PENDING", ""),
    (S.COMPLETING, Source.SQUEUE, [FINISHED], never, "COMPLETING", ""),
    # COMPLETED is only believed when the ledger says finished (item 4).
    (S.COMPLETED, Source.SQUEUE, [FINISHED], never, "COMPLETED", ""),
    (S.COMPLETED, Source.SACCT, [FINISHED], never, "COMPLETED", ""),
    (S.COMPLETED, Source.SQUEUE, [REQUEUE_ASKED], no_logs, "INCOMPLETE",
     "attempt 0 ended 'time_limit' at step 7 and asked for a requeue that never ran"),
    (S.COMPLETED, Source.SACCT, [attempt(0, EndCause.BUDGET_EXHAUSTED, steps_done=3)], no_logs,
     "INCOMPLETE", "ended 'budget_exhausted' at step 3"),
    (S.COMPLETED, Source.SQUEUE, [attempt(0, EndCause.UNKNOWN, message="requeue refused")],
     no_logs, "INCOMPLETE", "ended 'unknown' (requeue refused)"),
    (S.COMPLETED, Source.SQUEUE, [OPEN], no_logs, "INCOMPLETE", "never recorded its end"),
    (S.COMPLETED, Source.SQUEUE, [CRASHED], never, "FAILED", "RuntimeError: boom"),
    (S.COMPLETED, Source.SQUEUE, [], logs_say(CKPT_ERROR), "FAILED",
     f"Slurm says COMPLETED, but no attempt started: {CKPT_ERROR}"),
    (S.COMPLETED, Source.SQUEUE, [], no_logs, "INCOMPLETE", "no attempt is recorded"),
    (S.COMPLETED, Source.SQUEUE, [FINISHED, REQUEUE_ASKED], no_logs, "INCOMPLETE", "attempt 0"),
    # Slurm's failures stand; the note says what the ledger and logs add.
    (S.FAILED, Source.SQUEUE, [CRASHED], never, "FAILED", ""),
    (S.FAILED, Source.SQUEUE, [], logs_say(CKPT_ERROR), "FAILED",
     f"no attempt started: {CKPT_ERROR}"),
    (S.FAILED, Source.SACCT, [], no_logs, "FAILED", "no attempt started: the logs say nothing"),
    (S.FAILED, Source.SQUEUE, [REQUEUE_ASKED], logs_say(CKPT_ERROR), "FAILED",
     f"asked for a requeue that never ran; then: {CKPT_ERROR}"),
    (S.NODE_FAIL, Source.SQUEUE, [OPEN], no_logs, "NODE_FAIL", "never recorded its end"),
    (S.TIMEOUT, Source.SQUEUE, [FINISHED], never, "TIMEOUT", "training finished"),
    (S.CANCELLED, Source.SQUEUE, [attempt(0, EndCause.CANCELLED)], never, "CANCELLED", ""),
    (S.CANCELLED, Source.SQUEUE, [], never, "CANCELLED", ""),
    # Slurm has forgotten the job and there is no accounting (item 6): never RUNNING? forever.
    (None, Source.GONE_NO_ACCOUNTING, [FINISHED], never, "COMPLETED", ""),
    (None, Source.GONE_NO_ACCOUNTING, [OPEN], no_logs, "GONE?",
     "no accounting (sacct) to say how it ended; last ledger entry: attempt 0 (started"),
    (None, Source.GONE_NO_ACCOUNTING, [REQUEUE_ASKED], no_logs, "GONE?", "'time_limit'"),
    (None, Source.GONE_NO_ACCOUNTING, [CRASHED], never, "FAILED", "RuntimeError: boom"),
    (None, Source.GONE_NO_ACCOUNTING, [], logs_say(CKPT_ERROR), "FAILED", CKPT_ERROR),
    (None, Source.GONE_NO_ACCOUNTING, [], no_logs, "GONE?", "no attempt is recorded"),
    (None, Source.GONE_UNACCOUNTED, [OPEN], no_logs, "GONE?", "neither in squeue nor in sacct"),
    (None, Source.REUSED, [OPEN], no_logs, "GONE?", "now names another job"),
    # Lost by the controller: sacct's last word never ended; the ledger settles what it can.
    (None, Source.LOST, [OPEN], no_logs, "GONE?", "never ended: the controller lost it"),
    (None, Source.LOST, [FINISHED], never, "COMPLETED", ""),
    (None, Source.LOST, [CRASHED], never, "FAILED", "the controller lost it"),
    # Slurm did not answer: the ledger's guess, marked as a guess.
    (None, Source.UNREACHABLE, [OPEN], never, "RUNNING?", "shown from the ledger"),
    (None, Source.UNREACHABLE, [REQUEUE_ASKED], never, "TIME_LIMIT?", "Slurm did not answer"),
    (None, Source.UNREACHABLE, [], never, "UNKNOWN?", "Slurm did not answer"),
    (None, Source.UNREACHABLE, [FINISHED], never, "COMPLETED", ""),
    # The local backend: the process is the witness.
    (None, Source.LOCAL_RUNNING, [OPEN], never, "RUNNING", ""),
    (None, Source.LOCAL_ENDED, [OPEN], no_logs, "GONE?", "the local job's process has exited"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("slurm", "source", "attempts", "startup", "state", "note"),
    VERDICTS,
    ids=[f"{v[0] and v[0].value}-{v[1].name}-{v[4]}-{i}" for i, v in enumerate(VERDICTS)],
)
def test_verdict_table(
    slurm: JobState | None,
    source: Source,
    attempts: list[Attempt],
    startup: Callable[[], str | None],
    state: str,
    note: str,
) -> None:
    verdict = judge(slurm, source, attempts, startup)
    assert verdict.state == state
    if note:
        assert verdict.note is not None
        assert note in verdict.note
    else:
        assert verdict.note is None


LEDGERS = [[], [OPEN], [FINISHED], [CRASHED], [REQUEUE_ASKED], [FINISHED, OPEN],
           *([attempt(0, cause)] for cause in EndCause)]  # fmt: skip


def test_nothing_is_ever_called_completed_unless_the_ledger_says_finished() -> None:
    for slurm, source, attempts, logs in itertools.product(
        [None, *JobState], list(Source), LEDGERS, [no_logs, logs_say(CKPT_ERROR)]
    ):
        verdict = judge(slurm, source, attempts, logs)
        if verdict.state == "COMPLETED":
            assert attempts[-1].cause is EndCause.FINISHED, (slurm, source, attempts)


# --- why a job died without a ledger entry (postmortem.startup_failure) ------------------------

NOTE = "srun: cluster configuration lacks support for cpu binding\n"
EXITED = "srun: error: n1: task 0: Exited with exit code 1\n"


@pytest.mark.parametrize(
    ("logs", "expected"),
    [
        ({}, None),
        ({"batch-9.err": NOTE}, None),  # srun's note is no error
        ({"batch-9.err": NOTE + EXITED, "rank-0.err": "rank 0/1\n"},
         "rank 0 on n1: Exited with exit code 1"),
        ({"batch-9.err": NOTE + EXITED, "rank-1.err": "x\nhpc-ddp run: error: bad. HINT: h\n",
          "rank-0.err": "rank 0/2\nall good\n"},
         "rank-1.err: hpc-ddp run: error: bad. HINT: h"),
        ({"rank-10.err": "ValueError: ten\n", "rank-2.err": "Traceback (most recent call last):\n"
          '  File "x.py", line 1\ntorch.distributed.DistBackendError: gloo died\n'},
         "rank-2.err: torch.distributed.DistBackendError: gloo died"),
        ({"batch-9.err": "srun: error: n2: task 1: Killed\n",
          "rank-0.err": "RuntimeError: Connection reset by peer\n"},
         "rank 1 on n2: Killed"),  # the peer's complaint names the wrong rank
        ({"batch-9.err": NOTE + "/r/job.sbatch: line 9: /nope/python: No such file or directory\n"},
         "batch-9.err: /r/job.sbatch: line 9: /nope/python: No such file or directory"),
    ],
)  # fmt: skip
def test_startup_failure_table(tmp_path: Path, logs: dict[str, str], expected: str | None) -> None:
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
    assert startup_failure(tmp_path) == expected
    assert has_logs(tmp_path) is bool(logs)


# --- run directories and a fake Slurm -------------------------------------------------------


class StatusSlurm:
    """The package's :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm` with this file's shorthands:
    ``rows`` (ref -> (state, script)) in squeue, ``sacct`` (ref -> state, purged from the
    queue; None: accounting disabled), ``squeue_fails``; ``commands(name)`` as argv tuples."""

    def __init__(self) -> None:
        self.slurm = FakeSlurm()

    @property
    def argvs(self) -> list[tuple[str, ...]]:
        return self.slurm.calls

    def commands(self, name: str) -> list[tuple[str, ...]]:
        return [a for a in self.slurm.calls if a[0] == name]

    def _set_rows(self, rows: dict[str, tuple[str, str]]) -> None:
        for job, (state, script) in rows.items():
            self.slurm.add_job(
                job, state=parse_job_state(state), command=script, nodes="n1", elapsed="0:05"
            )

    def _set_sacct(self, states: dict[str, str] | None) -> None:
        self.slurm.accounting = states is not None
        for job, state in (states or {}).items():
            self.slurm.add_job(
                job, state=parse_job_state(state), in_queue=False, elapsed="00:00:05"
            )

    def _set_squeue_fails(self, fails: bool) -> None:
        if fails:
            self.slurm.fail("squeue", "squeue: error: Unable to contact slurm controller", times=9)

    rows = property(fset=_set_rows)
    sacct = property(fset=_set_sacct)
    squeue_fails = property(fset=_set_squeue_fails)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> StatusSlurm:
    """A fake Slurm behind every ``main([...])`` of these tests: the CLI's one seam that
    would build the real backends answers with it (``main(argv, backends=...)`` is the same)."""
    slurm = StatusSlurm()
    monkeypatch.setattr(cli_main, "_real_backends", lambda: Registry(slurm.slurm.client()))
    return slurm


def make_run(
    runs: Path, name: str, job_id: str | None, causes: Sequence[EndCause | None] = (), **kw: Any
) -> Path:
    """A submitted run: manifest, and one ledger attempt per cause (None: still open)."""
    run_dir = runs / name
    paths = RunPaths(run_dir)
    run_dir.mkdir(parents=True)
    paths.logs.mkdir()
    manifest = Manifest(name, kw.get("backend", "slurm"), job_id, "2026-01-01T12:00:00+00:00",
                        ["sbatch"], "job.yaml", str(run_dir))  # fmt: skip
    write_manifest(paths, manifest)
    for number, cause in enumerate(causes):
        record_start(paths.ledger, attempt=number, job_id=job_id, job_ref=job_id,
                     nodelist="n[1-2]", world_size=2, resumed_from_step=None, checkpoint=None,
                     now=T0 + number)  # fmt: skip
        if cause is not None:
            record_end(paths.ledger, attempt=number, cause=cause, steps_done=5 * (number + 1),
                       checkpoint=None, requeue_requested=cause is EndCause.TIME_LIMIT,
                       now=T0 + number + 0.5)  # fmt: skip
    return run_dir


def status_json(
    capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0
) -> list[dict[str, Any]]:
    assert main(["status", *argv, "--json"]) == code
    shown = json.loads(capsys.readouterr().out)
    assert shown["schema"] == "hpc-ddp.status/1"
    rows: list[dict[str, Any]] = [*shown["runs"], *shown["sweeps"]]
    return rows


def script(run_dir: Path) -> str:
    return str(run_dir / "job.sbatch")


def test_one_damaged_run_among_many_is_a_damaged_row_and_the_rest_are_shown(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    good = make_run(tmp_path, "a-good", "11", [EndCause.FINISHED])
    (good / "metrics.jsonl").write_bytes(b'{"loss": 0.25}\n\xff\x00binary\n[1]\n"loss"\n')
    bad = make_run(tmp_path, "b-bad-manifest", "12")
    (bad / "manifest.json").write_bytes(b'{"name": "b", "job_id": ')
    binary = make_run(tmp_path, "c-binary-manifest", "13")
    (binary / "manifest.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    metrics_dir = make_run(tmp_path, "d-metrics-is-a-dir", "14", [EndCause.FINISHED])
    (metrics_dir / "metrics.jsonl").mkdir()
    running = make_run(tmp_path, "e-running", "15", [None])
    fake.rows = {"11": ("COMPLETED", script(good)), "14": ("COMPLETED", script(metrics_dir)),
                 "15": ("RUNNING", script(running))}  # fmt: skip
    rows = {
        Path(r["run_dir"]).name: r for r in status_json(capsys, "--runs-dir", str(tmp_path), code=1)
    }
    assert {n: r["state"] for n, r in rows.items()} == {
        "a-good": "COMPLETED",
        "b-bad-manifest": "DAMAGED",
        "c-binary-manifest": "DAMAGED",
        "d-metrics-is-a-dir": "DAMAGED",
        "e-running": "RUNNING",
    }
    assert rows["a-good"]["loss"] == 0.25
    assert "damaged manifest (JSONDecodeError" in rows["b-bad-manifest"]["note"]
    assert "damaged manifest (UnicodeDecodeError" in rows["c-binary-manifest"]["note"]
    assert "unreadable metrics" in rows["d-metrics-is-a-dir"]["note"]
    # Only the readable manifests' jobs were asked about, in one filtered squeue.
    [squeue] = fake.commands("squeue")
    assert squeue[squeue.index("-j") + 1] == "11,14,15"
    # The table says the same, and the exit status says something is damaged.
    assert main(["status", "--runs-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("DAMAGED") == 3
    assert f"{bad}: {bad / 'manifest.json'}: damaged manifest" in out


def test_job_id_lookup_skips_damaged_manifests_for_status_and_cancel(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    (make_run(tmp_path, "a-bad", "21") / "manifest.json").write_text("[]")
    target = make_run(tmp_path, "b-target", "22", [None])
    fake.rows = {"22": ("RUNNING", script(target))}
    assert resolve_targets(["22"], tmp_path) == [target]
    [row] = status_json(capsys, "22", "--runs-dir", str(tmp_path))
    assert (row["run_dir"], row["state"]) == (str(target), "RUNNING")
    assert main(["cancel", "22", "--runs-dir", str(tmp_path)]) == 0
    assert fake.commands("scancel") == [("scancel", "22")]
    with pytest.raises(
        RunDirError, match=r"1 run\(s\) with a damaged manifest were skipped: a-bad"
    ):
        resolve_targets(["21"], tmp_path)


def make_sweep(tmp_path: Path, arrays: bytes) -> Path:
    """A one-point sweep ``b-sweep`` (array job 40) whose ``arrays.json`` holds ``arrays``."""
    sweep = make_run(tmp_path, "b-sweep", "40")
    (sweep / "sweep.yaml").write_text(
        "name: b\nsweep_file: s.yaml\nbase: j.yaml\nmetric: {name: val_loss, mode: min}\n"
        'max_parallel: null\nkeys: [train.lr]\npoints:\n- {"index": 0, "name": "b-0", '
        '"overrides": {"train.lr": 0.1}}\n'
    )
    (sweep / "arrays.json").write_bytes(arrays)
    (sweep / "tasks" / "0").mkdir(parents=True)
    return sweep


def test_plain_runs_are_shown_beside_sweeps(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = make_run(tmp_path, "a-plain", "31", [EndCause.FINISHED])
    sweep = make_sweep(
        tmp_path,
        b'[{"job_id": "40", "points": "0", "offset": 0, "array": "0", "script": "job.sbatch",'
        b' "submitted_at": "", "reason": "sweep", "command": []}]\n',
    )
    data = json.loads((sweep / "manifest.json").read_text())
    (sweep / "manifest.json").write_text(json.dumps({**data, "array_jobs": ["40"]}))
    fake.rows = {"31": ("COMPLETED", script(plain))}
    out = status_json(capsys, "--runs-dir", str(tmp_path))
    assert [r.get("run_dir") or r.get("sweep_dir") for r in out] == [str(plain), str(sweep)]
    assert out[0]["state"] == "COMPLETED"
    assert out[1]["summary"]["failed"] == 1  # left the queue without finishing
    [squeue] = fake.commands("squeue")
    assert squeue[squeue.index("-j") + 1] == "31,40"
    assert main(["status", "--runs-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "a-plain" in text
    assert f"{sweep}: 1 tasks: 1 failed" in text


@pytest.mark.parametrize(
    ("arrays", "why"),
    [
        ('[{"job_id": "40", "points": "abc", "offset": 0, "array": "0", "script": "j",'
         ' "submitted_at": ""}]', "points 'abc' are not array indices"),
        ('[{"job_id": "40", "points": null, "offset": 0, "array": "0", "script": "j",'
         ' "submitted_at": ""}]', "points is None, expected str"),
        ('[{"job_id": 40, "points": "0", "offset": 0, "array": "0", "script": "j",'
         ' "submitted_at": ""}]', "job_id is 40, expected str"),
        ("{}", "a JSON dict, not a list of arrays"),
        ("\udcff[", "UnicodeDecodeError"),
    ],
    ids=["points-abc", "points-null", "job-id-int", "object", "undecodable"],
)  # fmt: skip
def test_a_sweep_with_a_damaged_arrays_json_is_one_damaged_row(
    tmp_path: Path,
    fake: StatusSlurm,
    capsys: pytest.CaptureFixture[str],
    arrays: str,
    why: str,
) -> None:
    plain = make_run(tmp_path, "a-plain", "31", [EndCause.FINISHED])
    sweep = make_sweep(tmp_path, arrays.encode("utf-8", "surrogateescape"))
    fake.rows = {"31": ("COMPLETED", script(plain))}
    rows = status_json(capsys, "--runs-dir", str(tmp_path), code=1)
    assert [(r["run_dir"], r["state"]) for r in rows] == [
        (str(plain), "COMPLETED"), (str(sweep), "DAMAGED")
    ]  # fmt: skip
    assert rows[1]["note"].startswith(f"{sweep / 'arrays.json'}: damaged array record (")
    assert why in rows[1]["note"]
    assert "HINT:" in rows[1]["note"]
    assert main(["status", "--runs-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("DAMAGED") == 1
    assert "COMPLETED" in out


def test_slurm_forgot_the_job_sacct_decides_or_status_says_it_cannot(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    done = make_run(tmp_path, "a-done", "51", [EndCause.TIME_LIMIT, EndCause.FINISHED])
    unfinished = make_run(tmp_path, "b-unfinished", "52", [EndCause.TIME_LIMIT])
    open_run = make_run(tmp_path, "c-open", "53", [None])
    fake.sacct = {"51": "COMPLETED", "52": "COMPLETED", "53": "NODE_FAIL"}
    rows = status_json(capsys, "--runs-dir", str(tmp_path))
    assert [r["state"] for r in rows] == ["COMPLETED", "INCOMPLETE", "NODE_FAIL"]
    assert "asked for a requeue that never ran" in rows[1]["note"]
    assert rows[2]["elapsed_s"] == 5  # sacct's Elapsed
    [sacct] = fake.commands("sacct")
    assert sacct[-1] == "51,52,53"
    # Without accounting: never "RUNNING?" forever, and never a guess sold as a fact.
    fake.sacct = None
    rows = status_json(capsys, "--runs-dir", str(tmp_path))
    assert [r["state"] for r in rows] == ["COMPLETED", "GONE?", "GONE?"]
    assert "no accounting (sacct)" in rows[2]["note"]
    assert "attempt 0 (started" in rows[2]["note"]
    assert rows[2]["nodes"] == "n[1-2]"
    # An open attempt of a job that is gone is not still counting: no elapsed time to now,
    # only up to its last sign of life, as the goodput account has it (here its start).
    assert [r["elapsed_s"] for r in rows] == [1.5, 0.5, 0.0]  # seconds, not "0:00:01"
    del done, unfinished, open_run


@pytest.mark.parametrize(
    ("slurm_says", "shown"), [("COMPLETED", "INCOMPLETE"), ("FAILED", "FAILED")]
)
def test_an_earlier_jobs_crash_never_speaks_for_the_current_job(
    tmp_path: Path,
    fake: StatusSlurm,
    capsys: pytest.CaptureFixture[str],
    slurm_says: str,
    shown: str,
) -> None:
    """Job 90 crashed; the run was resumed as job 91, which left no ledger entry. Its verdict
    rests on its own attempts (none), never on job 90's crash."""
    run_dir = make_run(tmp_path, "a", "90", [EndCause.CRASH])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(
        json.dumps({**manifest, "job_id": "91", "previous_jobs": ["90"]})
    )
    fake.rows = {"91": (slurm_says, script(run_dir))}
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == shown
    assert "ended 'crash'" not in (row["note"] or "")
    assert "no attempt" in row["note"]
    assert (row["attempts"], row["causes"]) == (1, ["crash"])  # the run's history is all shown


def test_a_job_id_that_now_names_another_script_is_not_this_run(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path, "a", "61", [None])
    fake.rows = {"61": ("RUNNING", "/elsewhere/other.sbatch")}
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "GONE?"
    assert "/elsewhere/other.sbatch" in row["note"]


def test_squeue_unreachable_gives_marked_guesses(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path, "a", "71", [None])
    fake.squeue_fails = True
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "RUNNING?"
    assert "Unable to contact slurm controller" in row["note"]


def test_crash_before_any_attempt_is_failed_with_the_reason_from_the_logs(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "a", "81")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step-00000005.pt").write_bytes(b"")
    (run_dir / "checkpoints" / "step-00000010.pt").write_bytes(b"garbage")
    (run_dir / "logs" / "rank-1.err").write_text("rank 1/2 on n2\nhpc-ddp run: error: lost\n")
    (run_dir / "logs" / "rank-0.err").write_text(
        "rank 0/2 on n1\nskipping checkpoint ...\nhpc-ddp run: error: /r/checkpoints: none of "
        "2 checkpoints loads (newest: step-00000010.pt: damaged). HINT: move it aside.\n"
    )
    (run_dir / "logs" / "batch-81.err").write_text(
        "srun: error: n1: task 0: Exited with exit code 1\nsrun: error: n2: task 1: Exited with"
        " exit code 1\n"
    )
    fake.rows = {"81": ("FAILED", script(run_dir))}
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "FAILED"
    assert (
        "no attempt started: rank-0.err: hpc-ddp run: error: /r/checkpoints: none of 2"
        in (row["note"])
    )
    assert row["checkpoint_step"] is None
    assert "all 2 checkpoint(s) damaged (newest step 10: not a torch zip archive)" in row["note"]


def test_a_fifo_named_like_a_checkpoint_is_never_opened(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 13: open() on a FIFO named step-00000130.pt blocked `status` of every run
    (and `resume`, which asks status) for ever."""
    import threading

    run_dir = make_run(tmp_path, "a", "82", [EndCause.CANCELLED])
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step-00000120.pt").write_bytes(b"garbage")
    os.mkfifo(run_dir / "checkpoints" / "step-00000130.pt")
    fake.sacct = {"82": "CANCELLED"}
    rows: list[list[dict[str, Any]]] = []
    worker = threading.Thread(
        target=lambda: rows.append(status_json(capsys, "--runs-dir", str(tmp_path))), daemon=True
    )
    worker.start()
    worker.join(30)
    assert rows, "status still blocked after 30 s"
    [[row]] = rows
    assert row["checkpoint_step"] is None
    assert "(newest step 130: not a regular file (a FIFO))" in row["note"]


def test_a_job_that_never_wrote_a_log(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "a", "82")
    fake.rows = {"82": ("FAILED", script(run_dir))}
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "FAILED"
    assert "no attempt started: the logs say nothing" in row["note"]
    assert "left no log in logs/" in row["note"]


def test_local_run_is_running_only_while_its_own_controller_is(
    tmp_path: Path,
    fake: StatusSlurm,
    capsys: pytest.CaptureFixture[str],
    run_sleeper: Callable[[Path], subprocess.Popen[bytes]],
) -> None:
    """The pid in a local manifest may belong to any later process: this test's own pid
    stands in for such a stranger, even once recorded in local.json (its command line names
    no run directory); then a process whose command line names the run's does, recorded."""
    run_dir = make_run(tmp_path, "a", str(os.getpid()), [None], backend="local")
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "GONE?"
    assert "the local job's process has exited" in row["note"]
    me = identify(os.getpid())
    assert me is not None
    write_identity(run_dir, me)
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert row["state"] == "GONE?"
    controller = identify_started(run_sleeper(run_dir).pid)
    assert controller is not None
    write_identity(run_dir, controller)
    [row] = status_json(capsys, "--runs-dir", str(tmp_path))
    assert (row["state"], row["note"]) == ("RUNNING", None)
    assert fake.argvs == []  # a local run's pid is never sent to squeue


@pytest.mark.parametrize("command", ["status", "cancel"])
def test_runs_dir_that_is_a_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    runs = tmp_path / "runs"
    runs.write_text("x")
    args = [] if command == "status" else ["123"]
    assert main([command, *args, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"--runs-dir '{runs}' is a file, not a directory" in err
    assert "HINT:" in err


def test_missing_runs_dir_is_no_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--runs-dir", str(tmp_path / "none")]) == 0
    assert "no runs under" in capsys.readouterr().err


# --- waiting ----------------------------------------------------------------------------------


class Polls:
    """squeue answers: RUNNING ``running`` times, then ``final``; sleeps are recorded."""

    def __init__(self, running: int, final: str, script: str = "") -> None:
        self.left = running
        self.final = final
        self.script = script
        self.sleeps: list[float] = []
        self.argvs: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float | None = None) -> CompletedCommand:
        args = tuple(argv)
        self.argvs.append(args)
        if args[0] == "sacct":
            return CompletedCommand(args, 1, "", "Slurm accounting storage is disabled\n")
        state = "RUNNING" if self.left > 0 else self.final
        self.left -= 1
        return CompletedCommand(args, 0, f"5|5|N/A|{state}|n1|0:01|0|None|{self.script}\n", "")


def test_wait_backs_off_and_asks_for_its_job_only(capsys: pytest.CaptureFixture[str]) -> None:
    polls = Polls(running=12, final="COMPLETED")
    code = wait_for_jobs(Registry(SlurmClient(polls)), ["5"], sleep=polls.sleeps.append)
    assert code == 0
    assert polls.sleeps[:4] == [0.5, 0.75, 1.125, 1.6875]
    assert polls.sleeps[-1] == wait.MAX_POLL_S
    assert all(b >= a for a, b in itertools.pairwise(polls.sleeps))
    assert len(polls.sleeps) == 12
    assert {a[:6] for a in polls.argvs} == {("squeue", "-h", "-t", "all", "-j", "5")}
    assert "finished: 5 COMPLETED" in capsys.readouterr().err


def test_wait_with_the_run_dir_does_not_call_an_unfinished_run_completed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "a", "5", [EndCause.TIME_LIMIT])
    polls = Polls(running=1, final="COMPLETED", script=script(run_dir))
    code = wait_for_jobs(
        Registry(SlurmClient(polls)), ["5"], run_dirs=[run_dir], sleep=polls.sleeps.append
    )
    assert code == 1
    assert "finished: 5 INCOMPLETE" in capsys.readouterr().err


# --- on the dev cluster ---------------------------------------------------------------------------

PYTHON = sys.executable


def command_job(tmp_path: Path, name: str, code: str) -> Path:
    """A job file whose one task runs ``code`` (a BYO ``command:`` job: no torch)."""
    script_path = tmp_path / f"{name}.py"
    script_path.write_text(code)
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        f"name: {name}\ncommand: [{PYTHON}, {script_path}]\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    return job


# The trainer's last words before a requeue that Slurm then never did (issue 11, item 4).
ASKED_FOR_REQUEUE = """\
import os
from pathlib import Path
from hpc_ddp.durable import append_line
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger_events import LaunchId, end_event, start_event
ledger = Path(os.environ["HPC_DDP_RUN_DIR"]) / "ledger.jsonl"
job = os.environ["SLURM_JOB_ID"]
append_line(ledger, start_event(attempt=0, launch_id=LaunchId(job, job, 0), world_size=1,
            nodelist=os.environ["SLURM_NODELIST"], resumed_from_step=None, checkpoint=None))
append_line(ledger, end_event(attempt=0, cause=EndCause.TIME_LIMIT, steps_done=7, checkpoint=None,
            requeue_requested=True, message="time-limit warning signal"))
"""


@pytest.mark.slurm
def test_real_completed_job_whose_ledger_did_not_finish_is_incomplete(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    job = command_job(tmp_path, "asked", ASKED_FOR_REQUEUE)
    waited = e2e.hpc(slurm_cluster, "submit", str(job), "--runs-dir", str(runs), "--wait",
                     check=False)  # fmt: skip
    assert waited.returncode == 1, waited.stderr
    assert "INCOMPLETE" in waited.stderr
    [run_dir] = runs.iterdir()
    job_id = json.loads((run_dir / "manifest.json").read_text())["job_id"]
    assert e2e.job_fields(slurm_cluster, job_id)["JobState"] == "COMPLETED"  # Slurm's word
    row = e2e.status(slurm_cluster, run_dir)
    assert row["state"] == "INCOMPLETE"
    assert "Slurm says COMPLETED, but attempt 0 ended 'time_limit' at step 7" in row["note"]
    assert "asked for a requeue that never ran" in row["note"]


PLAIN = "import sys\nprint('point', sys.argv[1])\nraise SystemExit(int(sys.argv[2]))\n"
"""A plain `command:` program (no session): prints its point, exits with its second argument."""


def plain_job(tmp_path: Path) -> Path:
    script_path = tmp_path / "plain.py"
    script_path.write_text(PLAIN)
    job = tmp_path / "plain.yaml"
    job.write_text(
        f"name: plain\ncommand: [{PYTHON}, {script_path}, '{{params.x}}', '{{params.code}}']\n"
        "params: {x: 0, code: 0}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    return job


@pytest.mark.slurm
def test_real_plain_command_jobs_get_their_verdict_from_their_exit_status(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A command without a session that exits 0 was INCOMPLETE (`--wait` rc 1), a sweep of
    three "3 failed" with all three resubmitted; after a resume with a fixed command `status`
    said FAILED, quoting the earlier job's crash. Now its exit status is its verdict, and only
    the current job's attempts count."""
    runs = tmp_path / "runs"
    job = plain_job(tmp_path)
    # Exits 0: COMPLETED everywhere.
    waited = e2e.hpc(slurm_cluster, "submit", str(job), "--runs-dir", str(runs), "--wait")
    assert "finished: " in waited.stderr
    assert " COMPLETED" in waited.stderr.splitlines()[-1], waited.stderr
    [ok_dir] = runs.iterdir()
    row = e2e.status(slurm_cluster, ok_dir)
    assert (row["state"], row["causes"], row["note"]) == ("COMPLETED", ["finished"], None)
    # Fails (exit 1), then resumed with the fix: COMPLETED, the old crash quoted nowhere.
    failing = e2e.submit(slurm_cluster, tmp_path / "failing", str(job), "params.code=1")
    assert e2e.wait_done(slurm_cluster, failing.job_id)["JobState"] == "FAILED"
    assert e2e.status(slurm_cluster, failing.run_dir)["state"] == "FAILED"
    resumed = e2e.hpc(slurm_cluster, "resume", str(failing.run_dir), "params.code=0", "--wait")
    assert " COMPLETED" in resumed.stderr.splitlines()[-1], resumed.stderr
    row = e2e.status(slurm_cluster, failing.run_dir)
    # The failing job was restarted once in its allocation (fault.max_restarts), then stopped
    # as a crash loop (no checkpoint between the two), and resumed: three attempts in all.
    assert (row["state"], row["causes"], row["note"]) == (
        "COMPLETED",
        ["crash", "no_progress", "finished"],
        None,
    )
    assert [a["attempt"] for a in row["attempt_list"]] == [0, 1, 2]  # across the run's jobs
    # A sweep of three: three finished, none to resubmit, the same in results and status.
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"base: {job}\nsweep:\n  grid:\n    params.x: [1, 2, 3]\n")
    swept = e2e.sweep(slurm_cluster, tmp_path / "sweeps", sweep_file)
    sweep_dir = Path(swept["sweep_dir"])
    [array] = swept["array_jobs"]
    e2e.wait_all_done(slurm_cluster, [f"{array}_{i}" for i in range(3)])
    results = json.loads(e2e.hpc(slurm_cluster, "results", str(sweep_dir), "--json").stdout)
    assert [r["state"] for r in results["rows"]] == ["finished"] * 3
    shown = json.loads(e2e.hpc(slurm_cluster, "status", str(sweep_dir), "--json").stdout)
    [entry] = shown["sweeps"]
    assert entry["summary"]["finished"] == 3
    # Goodput covers sweep tasks too: each task's account, and the sweep's sum of them.
    shown = e2e.hpc(slurm_cluster, "status", str(sweep_dir), "--json", "--goodput").stdout
    [entry] = json.loads(shown)["sweeps"]
    tasks = [t["goodput"] for t in entry["tasks"]]
    assert [g["launches"] for g in tasks] == [1, 1, 1]
    assert entry["goodput"]["launches"] == 3
    assert entry["goodput"]["wall_s"] == pytest.approx(sum(g["wall_s"] for g in tasks))
    text = e2e.hpc(slurm_cluster, "status", str(sweep_dir), "--goodput").stdout
    assert "ETTR" in text
    assert "task 2: ETTR" in text
    again = e2e.hpc(slurm_cluster, "sweep", "--resubmit-failed", str(sweep_dir), "--dry-run")
    assert "nothing to resubmit" in again.stdout


@pytest.mark.slurm
def test_real_goodput_of_a_running_sweep_task_counts_up_to_now(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A sweep task's state is a TaskState ("running"), a run's Slurm's word ("RUNNING"):
    `status --goodput` compared the task's with "RUNNING", so a running task's account ended
    at its last ledger event (its wall stuck at 0 s) instead of now."""
    job = tmp_path / "long.yaml"
    job.write_text(
        "name: long\nslurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
        'train: {model: mlp, dataset: "tests.e2e_util:io_bound_synthetic", max_steps: 100000,\n'
        "        batch_size: 32, synthetic_samples: 4096, checkpoint_every: 0, eval_every: 0,\n"
        "        log_every: 100000}\n"  # no metrics rows: no sign of life but the clock
    )
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"base: {job}\nsweep:\n  grid:\n    train.seed: [1]\n")
    swept = e2e.sweep(slurm_cluster, tmp_path / "sweeps", sweep_file)
    sweep_dir = Path(swept["sweep_dir"])
    [array] = swept["array_jobs"]
    try:
        ledger = sweep_dir / "tasks" / "0" / "ledger.jsonl"
        e2e.wait_for(
            "the task's training",
            lambda: ledger.exists() and "attempt_start" in ledger.read_text(),
            timeout_s=120,
        )

        def task_goodput() -> dict[str, Any]:
            out = e2e.hpc(slurm_cluster, "status", str(sweep_dir), "--json", "--goodput").stdout
            [entry] = json.loads(out)["sweeps"]
            [task] = entry["tasks"]
            assert task["state"] == "running", task
            goodput: dict[str, Any] = task["goodput"]
            return goodput

        first = task_goodput()
        time.sleep(2.0)
        second = task_goodput()
        assert second["wall_s"] >= first["wall_s"] + 1.5, (first, second)
    finally:
        slurm_cluster.run("scancel", f"{array}_0", check=False)


@pytest.mark.slurm
@pytest.mark.torch
def test_real_job_dying_before_its_first_attempt_is_failed_with_why(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Held at submit, given only damaged checkpoints, released: every rank stops in restore
    before the ledger's first start; their crash ends still count as the attempt. Status:
    FAILED, the error, and that no checkpoint can be resumed from."""
    job = e2e.submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", "slurm.extra={hold: null}",
        "fault.max_restarts=0",  # a restart would die alike (a crash loop, tested elsewhere)
    )  # fmt: skip
    checkpoints = job.run_dir / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    (checkpoints / "step-00000004.pt").write_bytes(b"")
    (checkpoints / "step-00000008.pt").write_bytes(b"PK\x03\x04 torn")
    slurm_cluster.run("scontrol", "release", job.job_id)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "FAILED"
    (crash,) = e2e.ledger(job.run_dir)  # the ranks' crash ends, without a start
    assert crash.cause is EndCause.CRASH
    assert crash.steps_done == 0
    row = e2e.status(slurm_cluster, job.run_dir)
    assert row["state"] == "FAILED"
    assert row["attempts"] == 1
    assert row["causes"] == ["crash"]
    assert "ended 'crash' at step 0" in row["note"]
    assert "none of 2 checkpoints loads" in row["note"]
    assert "all 2 checkpoint(s) damaged (newest step 8: truncated" in row["note"]
    assert row["checkpoint_step"] is None


def test_sacct_speaks_only_for_the_runs_own_job_and_never_for_a_lost_one(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """sacct's newest line of an id may be another job's (the cluster's ids started again), and
    a line that never ended belongs to a job the controller lost: neither is the run's state."""
    make_run(tmp_path, "a-reused", "61", [EndCause.FINISHED])
    lost = make_run(tmp_path, "b-lost", "62", [None])
    mine = make_run(tmp_path, "c-mine", "63", [None])
    fake.slurm.accounting = True
    other = str(tmp_path / "elsewhere" / "job.sbatch")
    fake.slurm.add_job("61", state=JobState.FAILED, in_queue=False, command=other)
    fake.slurm.add_job("62", state=JobState.RUNNING, in_queue=False,
                       command=str(lost / "job.sbatch"))  # fmt: skip
    fake.slurm.add_job("63", state=JobState.TIMEOUT, in_queue=False,
                       command=str(mine / "job.sbatch"))  # fmt: skip
    rows = {Path(r["run_dir"]).name: r for r in status_json(capsys, "--runs-dir", str(tmp_path))}
    assert rows["a-reused"]["state"] == "COMPLETED"  # not job 61's FAILED: the ledger's word
    assert rows["b-lost"]["state"] == "GONE?"
    assert "sacct's last record of it says RUNNING and never ended" in rows["b-lost"]["note"]
    assert rows["c-mine"]["state"] == "TIMEOUT"


@pytest.mark.slurm
def test_real_forgotten_and_reused_job_ids_without_accounting(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """This cluster has no slurmdbd: a job id squeue does not know is said to be gone, with
    the ledger's last entry; a job id that now runs another script is not taken for the run."""
    gone = make_run(tmp_path, "a-gone", "99999999", [None])
    other = e2e.submit(slurm_cluster, tmp_path / "other", str(command_job(tmp_path, "o", "pass\n")))
    reused = make_run(tmp_path, "b-reused", other.job_id, [None])
    out = e2e.hpc(slurm_cluster, "status", "--runs-dir", str(tmp_path), "--json").stdout
    rows = {Path(r["run_dir"]).name: r for r in json.loads(out)["runs"]}
    assert rows["a-gone"]["state"] == "GONE?"
    assert "no accounting (sacct) to say how it ended" in rows["a-gone"]["note"]
    assert "last ledger entry: attempt 0 (started" in rows["a-gone"]["note"]
    assert rows["b-reused"]["state"] == "GONE?"
    assert str(other.run_dir / "job.sbatch") in rows["b-reused"]["note"]
    del gone, reused


@pytest.mark.slurm
def test_real_cancel_by_job_id_past_a_damaged_run(slurm_cluster: Cluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    sleeper = command_job(tmp_path, "sleeper", "import time\ntime.sleep(300)\n")
    job = e2e.submit(slurm_cluster, runs, str(sleeper))
    (make_run(runs, "damaged", "1") / "manifest.json").write_bytes(b"\x00\xff{")
    e2e.wait_state(slurm_cluster, job.job_id, ["RUNNING"])
    shown = e2e.hpc(slurm_cluster, "status", "--runs-dir", str(runs), "--json", check=False)
    assert shown.returncode == 1  # the damaged run is listed, and the exit status says so
    states = {Path(r["run_dir"]).name: r["state"] for r in json.loads(shown.stdout)["runs"]}
    assert states == {job.run_dir.name: "RUNNING", "damaged": "DAMAGED"}
    e2e.hpc(slurm_cluster, "cancel", job.job_id, "--runs-dir", str(runs))
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "CANCELLED"
    assert e2e.status(slurm_cluster, job.run_dir)["state"] == "CANCELLED"


def _first_attempt(
    ledger: Path,
    job: str,
    cause: EndCause,
    steps: int | None,
    *,
    requeued: bool,
    then: str,
    now: float | None = None,
) -> None:
    """Job ``job``'s first attempt, started 100 s before ``now`` and ended with ``cause`` 40 s
    later, and its launch's end with the supervisor's ``then``."""
    from hpc_ddp.durable import append_line
    from hpc_ddp.rundir.ledger_events import LaunchId, launch_end_event

    now = time.time() if now is None else now
    record_start(ledger, attempt=0, job_id=job, job_ref=job, nodelist="n1", world_size=2,
                 resumed_from_step=None, checkpoint=None, now=now - 100)  # fmt: skip
    record_end(ledger, attempt=0, job_id=job, job_ref=job, cause=cause, steps_done=steps,
               checkpoint=None, requeue_requested=requeued, now=now - 60)  # fmt: skip
    append_line(ledger, launch_end_event(
        attempt=0, launch_id=LaunchId(job, job, 0), launched_at=now - 100,
        cause=cause, blame=None, steps_reached=steps, checkpoint=None, next_step=then,
        now=now - 59,
    ))  # fmt: skip


def test_elapsed_is_the_runs_wall_time_over_every_attempt_as_goodput_counts_it(
    tmp_path: Path, fake: StatusSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 (Low): `elapsed` was Slurm's time of the job's latest start (5 s here), the
    last attempt's alone after a requeue; the goodput account's wall time had the truth. A
    requeued attempt says `requeue` where the supervisor saw its launch end cleanly (`stop`)."""
    run = make_run(tmp_path, "a-requeued", "61")
    ledger = RunPaths(run).ledger
    now = time.time()
    _first_attempt(ledger, "61", EndCause.TIME_LIMIT, None, requeued=True, then="stop", now=now)
    record_start(ledger, attempt=1, restart=1, job_id="61", job_ref="61", nodelist="n1",
                 world_size=2, resumed_from_step=None, checkpoint=None, now=now - 4)  # fmt: skip
    fake.rows = {"61": ("RUNNING", script(run))}  # squeue's elapsed: 0:05, since the requeue
    assert main(["status", str(run), "--json", "--goodput"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["state"] == "RUNNING"
    assert 100 <= row["elapsed_s"] < 160, row
    assert abs(row["elapsed_s"] - row["goodput"]["wall_s"]) < 5, row
    assert [a["next"] for a in row["attempt_list"]] == ["requeue", None]
    assert main(["status", str(run), "--attempts"]) == 0
    out = capsys.readouterr().out
    [first] = [line for line in out.splitlines() if line.split()[:2] == ["0", "61"]]
    assert " requeue" in first, first  # `then`
    assert " stop" not in first, first


@pytest.mark.parametrize(("state", "then"), [("FAILED", "stop"), ("RUNNING", "restart")])
def test_a_restart_the_job_never_began_is_said_as_a_stop(
    tmp_path: Path,
    fake: StatusSlurm,
    capsys: pytest.CaptureFixture[str],
    state: str,
    then: str,
) -> None:
    """Issue 39 (Low): after a full disk the ledger said `restart` while the supervisor had died
    and the job had ended FAILED. A job still running may be about to relaunch: `restart`."""
    run = make_run(tmp_path, "a-full", "62")
    ledger = RunPaths(run).ledger
    _first_attempt(ledger, "62", EndCause.CRASH, 10, requeued=False, then="restart")
    if state == "RUNNING":
        fake.rows = {"62": ("RUNNING", script(run))}
    else:
        fake.sacct = {"62": state}
    assert main(["status", str(run), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert [a["next"] for a in row["attempt_list"]] == [then], row
    said = "the supervisor chose to restart, but the job ended before a new launch began"
    assert (said in (row["note"] or "")) is (state == "FAILED"), row["note"]
