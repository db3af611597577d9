"""The Python API of the login side (issue 27) over :class:`FakeSlurm`: the same verdicts, rows
and refusals as the CLI, since the CLI now prints what these functions return.

Each test drives ``hpc_ddp.submit`` / ``Job`` / ``Sweep`` / ``runs`` with an injected client and
compares with what ``hpc-ddp ... --json`` says over the same fake, or with files written as the
runtime writes them. The whole loop on a real cluster is in ``test_api_e2e.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp
from hpc_ddp.api.arguments import override_args
from hpc_ddp.api.status import status_json
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.jobstate import CompletedCommand
from hpc_ddp.cli.main import main
from hpc_ddp.config.load import load_resolved_config
from hpc_ddp.durable import append_line
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.rundir.metrics import metrics_line, resume_marker
from hpc_ddp.rundir.taskconfig import load_task_config
from tests.cli.test_targets import write_sweep
from tests.helpers.cli import run_cli
from tests.ledgers import record_end, record_start

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "jobs" / "quickstart.yaml"


@pytest.fixture(autouse=True)
def _no_site_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPC_DDP_SITE", raising=False)
    monkeypatch.delenv("HPC_DDP_RUNS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/hpc-ddp/site.yaml


def cli_json(slurm: FakeSlurm, *argv: str) -> tuple[int, Any]:
    """``hpc-ddp ARGV`` (which must print JSON) over ``slurm``: (exit code, parsed output)."""
    code, out = run_cli(*argv, backends=Registry(slurm.client()))
    return code, json.loads(out)


def ended(job: hpc_ddp.Job, cause: EndCause, steps: int, message: str = "") -> None:
    """The run's ledger records one attempt of its job ending with ``cause``."""
    ledger = RunPaths(job.run_dir).ledger
    ids = {"job_id": job.job_id, "job_ref": job.job_id}
    record_start(ledger, attempt=0, **ids, nodelist="n[1-2]", world_size=2,
                 resumed_from_step=None, checkpoint=None)  # fmt: skip
    record_end(ledger, attempt=0, **ids, cause=cause, steps_done=steps, checkpoint=None,
               requeue_requested=False, message=message)  # fmt: skip


def submitted(tmp_path: Path, slurm: FakeSlurm, **overrides: Any) -> hpc_ddp.Job:
    return hpc_ddp.submit(QUICKSTART, overrides, backend="slurm", runs_dir=tmp_path / "runs",
                          backends=Registry(slurm.client()))  # fmt: skip


# --- submit -------------------------------------------------------------------------------------


def test_submit_writes_the_run_and_returns_its_job(tmp_path: Path) -> None:
    slurm = FakeSlurm(first_job_id=700)
    job = submitted(tmp_path, slurm, **{"train.lr": 0.125, "train.optimizer": "adamw"})
    assert (job.job_id, job.backend) == ("700", "slurm")
    assert job.run_dir.parent == (tmp_path / "runs").resolve()
    assert slurm.commands("sbatch") == [f"sbatch --parsable {job.run_dir / 'job.sbatch'}"]
    cfg = load_resolved_config(RunPaths(job.run_dir).config)
    assert (cfg.train.lr, cfg.train.optimizer) == (0.125, "adamw")  # values kept as they were
    manifest = read_manifest(job.run_dir)
    assert (manifest.job_id, manifest.config_source) == ("700", str(QUICKSTART))
    script = (job.run_dir / "job.sbatch").read_text()
    assert "hpc_ddp.submit" in script  # the header says how it was submitted


def test_the_older_slurm_spelling_still_reaches_the_same_fake(tmp_path: Path) -> None:
    """``slurm=`` (a Slurm client alone) is the deprecated spelling of
    ``backends=Registry(client)``: the same submit, job and listing, through that client."""
    slurm = FakeSlurm(first_job_id=710)
    client = slurm.client()
    job = hpc_ddp.submit(QUICKSTART, backend="slurm", runs_dir=tmp_path / "runs", slurm=client)
    assert job.job_id == "710"
    assert job.backends.slurm is client
    again = hpc_ddp.Job.from_run_dir(job.run_dir, slurm=client)
    assert again.status().state == "PENDING"
    assert len(hpc_ddp.runs(tmp_path / "runs", slurm=client)) == 1
    with pytest.raises(TypeError, match="backends= and slurm= both given"):
        hpc_ddp.runs(tmp_path / "runs", backends=Registry(client), slurm=client)


def test_submit_takes_a_job_config_object(tmp_path: Path) -> None:
    from hpc_ddp.config.load import load_job_config

    cfg = load_job_config(QUICKSTART, ["train.epochs=1"])
    job = hpc_ddp.submit(cfg, ["train.lr=0.3"], backend="slurm", runs_dir=tmp_path,
                         backends=Registry(FakeSlurm().client()))  # fmt: skip
    resolved = load_resolved_config(RunPaths(job.run_dir).config)
    assert (resolved.train.epochs, resolved.train.lr) == (1, 0.3)
    assert read_manifest(job.run_dir).config_source == "<JobConfig from Python>"


@pytest.mark.parametrize(
    "value",
    [1e-5, 0.1, 3, "a: b", "x\ny", " x", [1, "2"], {"a": 1}, None, True, "yes", "0x10", "25:99",
     "1e-5", "[1]", "'q'", "null", "~", Path("/data/x")],
)  # fmt: skip
def test_a_mapping_value_reaches_the_config_as_that_value(value: Any) -> None:
    """Each value is read back as itself: a string that YAML would read as something else
    (``null``, ``[1]``, a folded line break, ``1e-5``) is written as JSON."""
    from hpc_ddp.config.yaml_dialect import load_yaml_value

    [arg] = override_args({"params.v": value})
    key, _, text = arg.partition("=")
    assert key == "params.v"
    assert load_yaml_value(text) == (str(value) if isinstance(value, Path) else value)


def test_a_mapping_value_goes_through_the_config_checks() -> None:
    from hpc_ddp.config.load import apply_overrides

    args = override_args({"params.lr": 1e-5, "params.tag": "x: y", "slurm.time": "25:00"})
    assert args[2] == "slurm.time=25:00"  # quoted as typed: messages read as the CLI's
    assert apply_overrides({}, args) == {"params": {"lr": 1e-5, "tag": "x: y"},
                                         "slurm": {"time": "25:00"}}  # fmt: skip
    with pytest.raises(hpc_ddp.OverrideError, match=r"params\.v: expected a number"):
        apply_overrides({}, override_args({"params.v": [1, 2]}))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ("train.lr=0.1", "a single string, not a list or mapping. HINT: pass ['train.lr=0.1']"),
        ({"train.lr": float("inf")}, "override 'train.lr': inf cannot be a config value"),
        ({"train.lr": object()}, "HINT: use a number, string, bool, None"),
    ],
)
def test_overrides_that_cannot_be_values_are_refused(overrides: Any, words: str) -> None:
    with pytest.raises(hpc_ddp.OverrideError, match="HINT") as caught:
        hpc_ddp.submit(QUICKSTART, overrides, backends=Registry(FakeSlurm().client()))
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("api", "cli"),
    [
        ({"slurm.tasks_per_nod": 2}, ["slurm.tasks_per_nod=2"]),
        ({"slurm.time": "25:99"}, ["slurm.time=25:99"]),
        ({"requeue.lead_time": 900}, ["requeue.lead_time=900"]),
    ],
)
def test_a_bad_config_is_the_error_the_cli_prints_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], api: dict[str, Any], cli: list[str]
) -> None:
    runs = tmp_path / "runs"
    slurm = FakeSlurm()
    with pytest.raises(hpc_ddp.ConfigError) as caught:
        hpc_ddp.submit(
            QUICKSTART, api, backend="slurm", runs_dir=runs, backends=Registry(slurm.client())
        )
    code = main(["submit", str(QUICKSTART), *cli, "--backend", "slurm", "--runs-dir",
                 str(runs)], backends=Registry(slurm.client()))  # fmt: skip
    assert code == caught.value.exit_code == 2
    assert capsys.readouterr().err == f"hpc-ddp submit: error: {caught.value}\n"
    assert "HINT" in str(caught.value)
    assert not runs.exists()
    assert slurm.commands() == []


# --- one job ------------------------------------------------------------------------------------


def test_status_is_the_row_status_prints(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    job = submitted(tmp_path, slurm)
    assert job.status().state == "PENDING"
    slurm.jobs[job.job_id].state = JobState.FAILED
    ended(job, EndCause.CRASH, 12, "rank 1 on n2: RuntimeError: boom")
    status = job.status()
    code, shown = cli_json(slurm, "status", str(job.run_dir), "--json")
    assert code == 0
    assert shown["schema"] == "hpc-ddp.status/1"
    [row] = shown["runs"]
    assert status.to_dict() == row
    assert (status.state, status.attempts, status.causes) == ("FAILED", 1, ("crash",))
    assert (status.ended, status.succeeded) == (True, False)
    assert status.reasons == (
        f"{job.run_dir}: attempt 0 ended 'crash' at step 12 (rank 1 on n2: RuntimeError: boom)",
    )
    _, out = run_cli("status", str(job.run_dir), backends=Registry(slurm.client()))
    assert out.endswith("\n" + "\n".join(status.reasons) + "\n")  # under the table


class Stepping(FakeSlurm):
    """A fake whose job moves on by itself: ``at`` squeue calls in, ``then()`` runs."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.then: Any = None

    def __call__(self, argv: Any, *, timeout: float | None = None) -> CompletedCommand:
        if argv[0] == "squeue" and len(self.commands("squeue")) + 1 == self.at:
            self.then()
        return super().__call__(argv, timeout=timeout)


def test_wait_polls_until_the_run_completes(tmp_path: Path) -> None:
    slurm = Stepping(at=4)
    job = submitted(tmp_path, slurm)

    def finish() -> None:
        slurm.jobs[job.job_id].state = JobState.COMPLETED
        ended(job, EndCause.FINISHED, 96)

    slurm.then = finish
    status = job.wait(timeout=60, poll_s=0.01)
    assert (status.state, status.succeeded) == ("COMPLETED", True)
    assert len(slurm.commands("squeue")) == 4  # three looks at a PENDING job, then the end


def test_wait_raises_with_the_reason_lines_when_the_run_fails(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    job = submitted(tmp_path, slurm)
    slurm.jobs[job.job_id].state = JobState.FAILED
    ended(job, EndCause.CRASH, 12, "rank 1 on n2: RuntimeError: boom")
    with pytest.raises(hpc_ddp.RunFailedError) as caught:
        job.wait(timeout=60)
    err = caught.value
    assert isinstance(err, hpc_ddp.HpcDdpError)
    assert err.exit_code == 1
    assert isinstance(err.status, hpc_ddp.RunStatus)
    assert err.status.state == "FAILED"
    assert err.reasons == err.status.reasons
    assert err.reasons
    for line in err.reasons:
        assert line in str(err)
    assert "HINT:" in str(err)
    assert job.wait(check=False).state == "FAILED"  # or look without raising


def test_a_cancelled_or_incomplete_run_is_no_success_either(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    job = submitted(tmp_path, slurm)
    slurm.jobs[job.job_id].state = JobState.COMPLETED  # exit 0, but the ledger never finished
    ended(job, EndCause.TIME_LIMIT, 40)
    with pytest.raises(hpc_ddp.RunFailedError, match="ended INCOMPLETE"):
        job.wait()


def test_wait_gives_up_at_its_timeout_and_says_where_the_run_stands(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    job = submitted(tmp_path, slurm)
    with pytest.raises(hpc_ddp.WaitTimeoutError) as caught:
        job.wait(timeout=0.2, poll_s=0.05)
    assert "still PENDING after waiting 0.2 s; it goes on. HINT:" in str(caught.value)
    assert caught.value.status.state == "PENDING"  # type: ignore[attr-defined]
    assert slurm.commands("scancel") == []  # a wait that gives up cancels nothing


def test_metrics_count_each_step_once_after_a_resume(tmp_path: Path) -> None:
    job = submitted(tmp_path, FakeSlurm())
    lines = [*({"step": s, "loss": 1.0 / s} for s in (1, 2, 3, 4)), resume_marker(2, 9.0),
             *({"step": s, "loss": 0.5 / s} for s in (3, 4, 5))]  # fmt: skip
    for row in lines:
        append_line(RunPaths(job.run_dir).metrics, metrics_line(row).rstrip("\n"))
    with RunPaths(job.run_dir).metrics.open("a") as f:
        f.write('{"step": 6, "lo')  # torn: the task is writing it
    assert [(r["step"], r["loss"]) for r in job.metrics()] == [
        (1, 1.0), (2, 0.5), (3, 0.5 / 3), (4, 0.125), (5, 0.1)
    ]  # fmt: skip


def test_a_job_is_rebuilt_from_its_run_directory_in_a_new_process(tmp_path: Path) -> None:
    job = submitted(tmp_path, FakeSlurm(first_job_id=4242))
    append_line(RunPaths(job.run_dir).metrics, metrics_line({"step": 1, "loss": 2.5}).strip())
    probe = (
        "import json, sys, hpc_ddp\n"
        "job = hpc_ddp.Job.from_run_dir(sys.argv[1])\n"
        "print(json.dumps([str(job.run_dir), job.job_id, job.backend, job.metrics()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(job.run_dir)], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout  # fmt: skip
    assert json.loads(out) == [str(job.run_dir), "4242", "slurm", [{"step": 1, "loss": 2.5}]]
    assert hpc_ddp.Job.from_run_dir(job.run_dir) == job


@pytest.mark.parametrize("what", ["missing", "plain dir", "sweep"])
def test_from_run_dir_of_no_run_says_what_to_pass(tmp_path: Path, what: str) -> None:
    target = {"missing": tmp_path / "nope", "plain dir": tmp_path,
              "sweep": write_sweep(tmp_path / "runs")}[what]  # fmt: skip
    with pytest.raises(hpc_ddp.RunDirError, match="HINT"):  # TargetError is one
        hpc_ddp.Job.from_run_dir(target)


def test_cancel_says_what_it_came_to_as_the_cli_does(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    job = submitted(tmp_path, slurm)
    copy = job.run_dir.with_name("copied")
    shutil.copytree(job.run_dir, copy)  # keeps the original's manifest: its job is not copy's
    refused = hpc_ddp.Job.from_run_dir(copy, backends=Registry(slurm.client())).cancel()
    assert refused.outcome == "not_this_run"
    assert slurm.jobs[job.job_id].state is JobState.PENDING
    done = job.cancel()
    assert (done.outcome, done.jobs, done.backend) == ("cancelled", (job.job_id,), "slurm")
    assert slurm.commands("scancel") == [f"scancel {job.job_id}"]
    again = job.cancel()
    code, shown = cli_json(slurm, "cancel", str(job.run_dir), "--json")
    assert again.outcome == "already_finished"
    assert code == 0
    assert [again.to_dict()] == shown["results"]


def test_logs_reads_a_ranks_log_and_refuses_a_rank_the_run_has_not(tmp_path: Path) -> None:
    job = submitted(tmp_path, FakeSlurm())
    with pytest.raises(hpc_ddp.RunDirError, match=r"no rank-0\.err log yet\. HINT"):
        job.logs()
    job.paths.rank_log(1, "out").write_text("epoch 1\n")
    assert job.logs(rank=1, stream="out") == "epoch 1\n"
    with pytest.raises(hpc_ddp.TargetError, match="--rank 2: no such rank"):
        job.logs(rank=2)
    # It used to look for rank--1.err, and read any stream it was given.
    with pytest.raises(hpc_ddp.TargetError, match=r"--rank -1: no such rank \(ranks are numbered "):
        job.logs(rank=-1)
    with pytest.raises(TypeError, match=r"rank='1': expected an int, not str\. HINT"):
        job.logs(rank="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"stream='bogus' is not a log stream\. HINT: pass one "
                       r"of 'err', 'out'"):  # fmt: skip
        job.logs(rank=1, stream="bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["runs_dir", "site", "config"])
def test_a_path_argument_of_another_type_is_a_type_error_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """`runs_dir=123` used to create ./123/ and submit there."""
    monkeypatch.chdir(tmp_path)
    args: dict[str, Any] = {"config": QUICKSTART, name: 123}
    slurm = FakeSlurm()
    with pytest.raises(TypeError, match=rf"^{name}=123: expected a path \(a str or os\.PathLike"
                       r"\), not int\. HINT: pass a path such as "):  # fmt: skip
        hpc_ddp.submit(backend="slurm", backends=Registry(slurm.client()), **args)
    assert list(tmp_path.iterdir()) == []
    assert slurm.commands("sbatch") == []
    with pytest.raises(TypeError, match=r"^runs_dir=123: expected a path"):
        hpc_ddp.runs(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^runs_dir=2\.5: expected a path"):
        hpc_ddp.submit_sweep(sweep_lr(tmp_path), runs_dir=2.5, backends=Registry(slurm.client()))  # type: ignore[arg-type]


def test_resume_submits_the_run_again_in_its_directory(tmp_path: Path) -> None:
    slurm = FakeSlurm(first_job_id=800)
    job = submitted(tmp_path, slurm)
    with pytest.raises(hpc_ddp.TargetError, match="HINT"):  # still queued: refused
        hpc_ddp.resume(job.run_dir, backends=Registry(slurm.client()))
    slurm.jobs[job.job_id].state = JobState.CANCELLED
    ended(job, EndCause.CANCELLED, 30)
    again = job.resume({"requeue.max_requeues": 7})
    assert (again.run_dir, again.job_id) == (job.run_dir, "801")
    manifest = read_manifest(job.run_dir)
    assert (manifest.job_id, manifest.previous_jobs) == ("801", ["800"])
    assert load_resolved_config(job.paths.config).requeue.max_requeues == 7


# --- every run, and sweeps ----------------------------------------------------------------------


def test_runs_lists_every_run_and_sweep_as_status_does(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    runs = tmp_path / "runs"
    first = submitted(tmp_path, slurm)
    submitted(tmp_path, slurm)
    (runs / "broken").mkdir()
    (runs / "broken" / "manifest.json").write_text("{")
    write_sweep(runs)
    slurm.jobs[first.job_id].state = JobState.RUNNING
    listed = hpc_ddp.runs(runs, backends=Registry(slurm.client()))
    code, shown = cli_json(slurm, "status", "--runs-dir", str(runs), "--json")
    assert code == 1  # the damaged run
    assert json.loads(json.dumps(status_json(listed))) == shown
    kinds = [(type(s).__name__, s.state if isinstance(s, hpc_ddp.RunStatus) else None)
             for s in listed]  # fmt: skip
    assert sorted(kinds[:3], key=str) == [("RunStatus", "DAMAGED"), ("RunStatus", "PENDING"),
                                          ("RunStatus", "RUNNING")]  # fmt: skip
    assert kinds[3] == ("SweepStatus", None)


def sweep_lr(tmp_path: Path) -> Path:
    (tmp_path / "job.yaml").write_text("name: lr\nslurm: {nodes: 1, time: '10'}\n"
                                       "train: {max_steps: 20}\n")  # fmt: skip
    path = tmp_path / "sweep.yaml"
    path.write_text("base: job.yaml\nsweep:\n  grid:\n    train.lr: [0.1, 0.01, 0.001]\n"
                    "  metric: {name: val_loss, mode: min}\n  max_parallel: 2\n")  # fmt: skip
    return path


def as_tasks(slurm: FakeSlurm, array: str, states: dict[int, JobState]) -> None:
    """The array's pending range becomes one row per task, in ``states``."""
    script = slurm.jobs.pop(next(r for r in slurm.jobs if r.startswith(f"{array}_"))).command
    for task, state in states.items():
        slurm.add_job(f"{array}{task}9", state=state, command=script, array_job_id=array,
                      array_task_id=str(task))  # fmt: skip


def task_ended(task: hpc_ddp.Job, cause: EndCause, val_loss: float | None) -> None:
    ended(task, cause, 20)
    if val_loss is not None:
        append_line(task.paths.metrics, metrics_line({"step": 20, "val_loss": val_loss}).strip())


def test_a_sweep_from_submit_to_results_and_resubmission(tmp_path: Path) -> None:
    slurm = FakeSlurm(first_job_id=900)
    runs = tmp_path / "runs"
    sweep = hpc_ddp.submit_sweep(sweep_lr(tmp_path), {"train.max_steps": 8}, runs_dir=runs,
                                 backends=Registry(slurm.client()), backend="slurm")  # fmt: skip
    assert sweep.array_jobs == ("900",)
    assert hpc_ddp.Sweep.from_dir(sweep.sweep_dir) == sweep
    tasks = sweep.tasks()
    assert [(t.index, t.job_id, t.run_dir.name) for t in tasks] == [
        (0, "900_0", "0"), (1, "900_1", "1"), (2, "900_2", "2")
    ]  # fmt: skip
    # No task has started: none has a directory yet, its config is in task_configs.jsonl.
    assert not tasks[1].run_dir.exists()
    assert load_task_config(sweep.sweep_dir, 1).train.max_steps == 8
    assert sweep.status().summary["pending"] == 3
    assert [t.status().state for t in tasks] == ["pending"] * 3

    as_tasks(slurm, "900", {0: JobState.COMPLETED, 1: JobState.FAILED, 2: JobState.COMPLETED})
    task_ended(tasks[0], EndCause.FINISHED, 0.7)
    task_ended(tasks[1], EndCause.CRASH, None)
    task_ended(tasks[2], EndCause.FINISHED, 0.4)
    assert [t.status().state for t in tasks] == ["finished", "failed", "finished"]
    assert [t.status().succeeded for t in tasks] == [True, False, True]
    rows = sweep.results()
    code, shown = cli_json(slurm, "results", str(sweep.sweep_dir), "--json")
    assert code == 0
    assert shown["schema"] == "hpc-ddp.results/1"
    assert json.loads(json.dumps(rows)) == shown["rows"]
    assert [(r["index"], r["values"]["train.lr"], r["best"]) for r in rows] == [
        (2, 0.001, 0.4), (0, 0.1, 0.7), (1, 0.01, None)
    ]  # fmt: skip
    with pytest.raises(hpc_ddp.RunFailedError, match=r"1 of 3 task\(s\) did not finish") as caught:
        sweep.wait(timeout=10)
    assert caught.value.reasons == (f"task 1: failed (crash): {tasks[1].run_dir}",)
    assert sweep.wait(check=False).summary["finished"] == 2

    again = sweep.resubmit_failed()
    assert again.array_jobs == ("900", "901")
    assert again.sweep_dir == sweep.sweep_dir
    assert [t.job_id for t in again.tasks()] == ["900_0", "901_1", "900_2"]
    assert sweep.cancel().outcome == "cancelled"  # the new array runs a script of the sweep


def test_results_sort_by_a_metric_nobody_logged_is_the_clis_error(tmp_path: Path) -> None:
    sweep = hpc_ddp.Sweep.from_dir(
        write_sweep(tmp_path / "runs"), backends=Registry(FakeSlurm().client())
    )
    with pytest.raises(hpc_ddp.ConfigError, match=r"no task logged a metric 'val_los'.*HINT"):
        sweep.results(sort="val_los")
    with pytest.raises(ValueError, match=r"mode='up' is not a ranking mode\. HINT: pass 'min'"):
        sweep.results(mode="up")  # type: ignore[arg-type]
