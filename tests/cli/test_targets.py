"""What a command-line target names, for every verb alike, against a :class:`FakeSlurm`.

* A target that names nothing (no such path, a file, a job id no run has) is a usage error:
  exit 2 with a HINT, and Slurm is never asked.
* A job id read from a damaged manifest (``--me``, ``1,2``) is never passed to ``scancel``:
  every target is resolved and checked before anything is cancelled, and ``status`` shows such
  a run DAMAGED.
* ``cancel SWEEP_DIR/tasks/N`` and ``cancel ARRAYJOB_TASK`` cancel the one array task that runs
  the point, found through the sweep's ``arrays.json`` (offsets and resubmissions included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeJob, FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.submission.submit import make_run_dir


def write_run(runs: Path, name: str, **fields: Any) -> Path:
    """A Slurm run directory whose manifest holds ``fields`` (as written, unchecked)."""
    run_dir = runs / name
    paths = RunPaths(run_dir)
    make_run_dir(paths)
    write_manifest(paths, Manifest(name, "slurm", "1", "2026-01-01T00:00:00+00:00", ["sbatch"],
                                   "job.yaml", str(run_dir)))  # fmt: skip
    data = json.loads(paths.manifest.read_text())
    paths.manifest.write_text(json.dumps({**data, **fields}))
    return run_dir


def running(slurm: FakeSlurm, *refs: str, home: Path | None = None) -> list[FakeJob]:
    """Running jobs (``12``) or array tasks (``12_3``) in the fake's table; ``home``: the run
    or sweep directory whose ``job.sbatch`` they run (squeue's ``Command``)."""
    command = str(home / "job.sbatch") if home is not None else ""
    jobs = []
    for number, ref in enumerate(refs):
        array, _, task = ref.partition("_")
        if task:
            jobs.append(slurm.add_job(str(5000 + number), state=JobState.RUNNING, command=command,
                                      array_job_id=array, array_task_id=task))  # fmt: skip
        else:
            jobs.append(slurm.add_job(ref, state=JobState.RUNNING, command=command))
    return jobs


def cli(slurm: FakeSlurm, *argv: str) -> int:
    return main(list(argv), backends=Registry(slurm.client()))


# --- a target that names nothing ---------------------------------------------------------------

VERBS = ["status", "cancel", "logs", "results", "checkpoints"]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", ["missing", "file", "unknown-job-id"])
def test_a_target_that_names_nothing_is_a_usage_error_for_every_verb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, kind: str
) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "a-run", job_id="1001")
    (tmp_path / "notes.txt").write_text("not a run\n")
    target = {"missing": str(tmp_path / "nope"), "file": str(tmp_path / "notes.txt"),
              "unknown-job-id": "424242"}[kind]  # fmt: skip
    slurm = FakeSlurm()
    runs_arg = ["--runs-dir", str(runs)] if verb in ("status", "cancel") else []
    assert cli(slurm, verb, target, *runs_arg) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"hpc-ddp {verb}: error: ")
    assert "HINT:" in captured.err
    assert "hpc-ddp status" in captured.err  # how to find what could be meant
    assert "Traceback" not in captured.err
    assert slurm.calls == []


# --- cancel never passes a damaged manifest's job id to scancel -------------------------------

DAMAGED = {
    "me": {"job_id": "--me"},
    "list": {"job_id": "1001,1002"},
    "range": {"job_id": "1001_[0-1]"},
    "space": {"job_id": " 1001"},
    "array-me": {"job_id": "1001", "array_jobs": ["1001", "--me"]},
    "array-list": {"job_id": "1001", "array_jobs": ["1001,1002"]},
}


@pytest.mark.parametrize("fields", DAMAGED.values(), ids=list(DAMAGED))
def test_cancel_refuses_a_manifest_job_id_that_is_no_job_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any]
) -> None:
    runs = tmp_path / "runs"
    good = write_run(runs, "a-good", job_id="1001")
    bad = write_run(runs, "b-bad", **fields)
    slurm = FakeSlurm()
    jobs = running(slurm, "1001", "1002", "1003")
    bad_id = next(j for j in [fields["job_id"], *fields.get("array_jobs", [])] if j != "1001")
    # The good run is named first: nothing at all is cancelled, not even it.
    assert cli(slurm, "cancel", str(good), str(bad)) == 1
    err = capsys.readouterr().err
    assert f"{bad / 'manifest.json'}: job id {bad_id!r} is not a Slurm job id" in err
    assert "nothing was sent to Slurm. HINT: the file is damaged" in err
    assert slurm.commands("scancel") == []
    assert [j.state for j in jobs] == [JobState.RUNNING] * 3

    # status lists it as DAMAGED beside the good run, and never sends its id to Slurm.
    assert cli(slurm, "status", "--runs-dir", str(runs), "--json") == 1
    rows = {Path(r["run_dir"]).name: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert rows["b-bad"]["state"] == "DAMAGED"
    assert f"job id {bad_id!r} is not a Slurm job id" in rows["b-bad"]["note"]
    assert rows["a-good"]["state"] == "RUNNING"
    assert [argv[argv.index("-j") + 1] for argv in slurm.calls] == ["1001"]  # squeue only


# --- cancel one task of a sweep ----------------------------------------------------------------


def write_sweep(runs: Path) -> Path:
    """Five points: array 1001 runs points 0-2, array 1002 points 3-4 (offset 3: tasks 0-1),
    and array 1003 resubmitted point 1."""
    sweep = write_run(runs, "sweep", job_id="1001", array_jobs=["1001", "1002", "1003"])
    points = [{"index": i, "name": f"s-{i}", "overrides": {"train.seed": i}} for i in range(5)]
    (sweep / "sweep.yaml").write_text(
        "name: s\nsweep_file: s.yaml\nbase: j.yaml\nmetric: {name: val_loss, mode: min}\n"
        "max_parallel: null\nkeys: [train.seed]\npoints:\n"
        + "".join(f"- {json.dumps(p)}\n" for p in points)
    )
    arrays = [("1001", "0-2", 0, "0-2"), ("1002", "3-4", 3, "0-1"), ("1003", "1", 0, "1")]
    (sweep / "arrays.json").write_text(json.dumps([
        {"job_id": j, "points": p, "offset": o, "array": a, "script": "job.sbatch",
         "submitted_at": "t"} for j, p, o, a in arrays
    ]))  # fmt: skip
    for i in range(5):
        (sweep / "tasks" / str(i)).mkdir(parents=True)
    return sweep


@pytest.mark.parametrize(
    ("target", "ref"),
    [("tasks/4", "1002_1"), ("tasks/0", "1001_0"), ("tasks/1", "1003_1"), ("1002_1", "1002_1"),
     ("1001_2", "1001_2")],
)  # fmt: skip
def test_cancel_one_sweep_task_by_path_or_array_task_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, ref: str
) -> None:
    runs = tmp_path / "runs"
    sweep = write_sweep(runs)
    slurm = FakeSlurm()
    refs = ["1001_0", "1001_1", "1001_2", "1002_0", "1002_1", "1003_1"]
    jobs = dict(zip(refs, running(slurm, *refs, home=sweep), strict=True))
    arg = str(sweep / target) if target.startswith("tasks/") else target
    assert cli(slurm, "cancel", arg, "--runs-dir", str(runs)) == 0
    point = {"1002_1": 4, "1001_0": 0, "1003_1": 1, "1001_2": 2}[ref]
    assert f"cancelled slurm array task {ref} ({sweep / 'tasks' / str(point)})" in (
        capsys.readouterr().out
    )
    assert slurm.commands("scancel") == [f"scancel {ref}"]
    assert {r for r, j in jobs.items() if j.state is JobState.CANCELLED} == {ref}


def test_cancel_of_an_array_task_that_is_not_there_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    sweep = write_sweep(runs)
    slurm = FakeSlurm()
    assert cli(slurm, "cancel", "1002_5", "--runs-dir", str(runs)) == 2
    assert f"1002_5: array job 1002 of sweep {sweep} has no task 5 (its tasks: 0-1). HINT:" in (
        capsys.readouterr().err
    )
    assert cli(slurm, "cancel", "4242_0", "--runs-dir", str(runs)) == 2
    assert f"4242_0: no sweep under {runs} has an array job 4242. HINT:" in (
        capsys.readouterr().err
    )
    (sweep / "tasks" / "7").mkdir()  # a task directory no array runs
    assert cli(slurm, "cancel", str(sweep / "tasks" / "7")) == 1
    assert "point 7 is in no job array of arrays.json; nothing to cancel. HINT:" in (
        capsys.readouterr().err
    )
    (sweep / "arrays.json").write_text('[{"job_id": "--me", "points": "0"}]')
    assert cli(slurm, "cancel", str(sweep / "tasks" / "0")) == 1
    assert "damaged array record" in capsys.readouterr().err
    assert slurm.calls == []


def test_cancel_of_a_sweep_dir_cancels_every_array_even_past_a_failed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = write_sweep(tmp_path / "runs")
    slurm = FakeSlurm()
    jobs = running(slurm, "1001", "1002", "1003", home=sweep)
    assert cli(slurm, "cancel", str(sweep)) == 0
    assert slurm.commands("scancel") == ["scancel 1001", "scancel 1002", "scancel 1003"]
    assert "cancelled slurm job arrays 1001, 1002, 1003" in capsys.readouterr().out
    assert all(j.state is JobState.CANCELLED for j in jobs)

    slurm = FakeSlurm()
    jobs = running(slurm, "1001", "1002", "1003", home=sweep)
    slurm.fail("scancel 1001")  # the controller drops one request: the others still go out
    assert cli(slurm, "cancel", str(sweep)) == 1
    assert slurm.commands("scancel") == ["scancel 1001", "scancel 1002", "scancel 1003"]
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    assert [j.state for j in jobs] == [JobState.RUNNING, JobState.CANCELLED, JobState.CANCELLED]


def test_status_of_one_sweep_task_by_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cancel` took a task's directory; `status` said "no manifest.json". Now it shows that
    task's one row, as the sweep's own table has it, from the array task that runs it now."""
    from tests.ledgers import record_end, record_start

    runs = tmp_path / "runs"
    sweep = write_sweep(runs)
    slurm = FakeSlurm()
    running(slurm, "1003_1", "1001_2", home=sweep)
    task2 = sweep / "tasks" / "2" / "ledger.jsonl"
    record_start(task2, attempt=0, job_id="5001", job_ref="1001_2", nodelist="n1",
                 world_size=1, resumed_from_step=None, checkpoint=None)  # fmt: skip
    record_end(task2, attempt=0, cause=EndCause.FINISHED, steps_done=9, checkpoint=None,
               requeue_requested=False)  # fmt: skip
    assert cli(slurm, "status", str(sweep / "tasks" / "1"), "--json") == 0
    [entry] = json.loads(capsys.readouterr().out)["sweeps"]
    assert (entry["sweep_dir"], entry["task"]) == (str(sweep), 1)
    assert [(t["index"], t["state"], t["job_id"]) for t in entry["tasks"]] == [
        (1, "running", "1003_1")
    ]
    assert cli(slurm, "status", str(sweep / "tasks" / "2")) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{sweep}: task 2: finished\n")
    assert len([line for line in out.splitlines() if line.split()[:1] == ["2"]]) == 1
