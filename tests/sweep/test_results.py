"""Reading sweep results: index ranges, task states from ledger plus squeue, metrics with torn
lines, sorting (missing values last), the summary and ``sweep_status``, on fabricated sweep
directories (these are pure readers of files)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.arrays import (
    ArrayRecord,
    current_refs,
    format_index_ranges,
    live_task,
    parse_index_ranges,
    read_arrays,
)
from hpc_ddp.backends.jobs import JobInfo, JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.errors import RunDirError, TargetError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.state.task import TaskState, task_state
from hpc_ddp.sweep.records import read_sweep_record
from hpc_ddp.sweep.results import (
    ResultRow,
    gather_results,
    logged_metrics,
    loss_curve,
    metric_summary,
    read_metrics,
    sort_rows,
    sweep_status,
    sweep_summary,
)
from tests.ledgers import record_end, record_start

# --- index ranges -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "text"),
    [([], ""), ([4], "4"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([9, 3, 3, 4], "3-4,9")],
)
def test_index_ranges_round_trip(indices: list[int], text: str) -> None:
    assert format_index_ranges(indices) == text
    assert parse_index_ranges(text) == sorted(set(indices))


@pytest.mark.parametrize(
    ("text", "indices"),
    [("[2-5%2]", [2, 3, 4, 5]), ("0-6:3", [0, 3, 6]), ("1,3-4%8", [1, 3, 4]), ("[7]", [7])],
)
def test_parse_index_ranges_reads_squeue_and_sbatch_forms(text: str, indices: list[int]) -> None:
    assert parse_index_ranges(text) == indices


def test_parse_index_ranges_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="x-1"):
        parse_index_ranges("0,x-1")


# --- states -------------------------------------------------------------------------------------


def attempt(cause: EndCause | None, *, ended: bool = True, requeue: bool = False) -> Attempt:
    return Attempt(attempt=0, started=1.0, ended=2.0 if ended else None, cause=cause,
                   steps_done=3, checkpoint=None, nodelist="n1", job_ref="1_0",
                   resumed_from_step=None, requeue_requested=requeue)  # fmt: skip


def info(state: JobState, restarts: int = 0, task: str = "0") -> JobInfo:
    return JobInfo("11", "10", task, state, "", "n1", None, restarts)


FIN, CRASH, OPEN = attempt(EndCause.FINISHED), attempt(EndCause.CRASH), attempt(None, ended=False)
REQ = attempt(EndCause.TIME_LIMIT, requeue=True)


@pytest.mark.parametrize(
    ("attempts", "live", "known", "expected"),
    [
        # A finished ledger wins over anything squeue says.
        ([FIN], info(JobState.COMPLETED), True, TaskState.FINISHED),
        ([OPEN, FIN], None, True, TaskState.FINISHED),
        ([], info(JobState.PENDING), True, TaskState.PENDING),
        ([REQ], info(JobState.PENDING, restarts=1), True, TaskState.REQUEUED),
        ([], info(JobState.PENDING, restarts=1), True, TaskState.REQUEUED),
        ([OPEN], info(JobState.RUNNING), True, TaskState.RUNNING),
        ([OPEN], info(JobState.COMPLETING), True, TaskState.RUNNING),
        ([REQ], info(JobState.REQUEUED), True, TaskState.REQUEUED),
        ([CRASH], info(JobState.FAILED), True, TaskState.FAILED),
        ([OPEN], info(JobState.TIMEOUT), True, TaskState.FAILED),
        ([OPEN], info(JobState.NODE_FAIL), True, TaskState.FAILED),
        ([], info(JobState.COMPLETED), True, TaskState.FAILED),  # ran, never said it finished
        ([OPEN], info(JobState.CANCELLED), True, TaskState.CANCELLED),
        ([attempt(EndCause.CANCELLED)], None, True, TaskState.CANCELLED),
        # Gone from the queue without finishing.
        ([OPEN], None, True, TaskState.FAILED),
        ([REQ], None, True, TaskState.FAILED),  # the requeue never happened
        ([], None, True, TaskState.FAILED),
        # Without squeue: the ledger's best guess.
        ([], None, False, TaskState.UNKNOWN),
        ([OPEN], None, False, TaskState.RUNNING),
        ([REQ], None, False, TaskState.REQUEUED),
        ([CRASH], None, False, TaskState.FAILED),
        ([attempt(EndCause.BUDGET_EXHAUSTED)], None, False, TaskState.FAILED),
    ],
)
def test_task_state(
    attempts: list[Attempt], live: JobInfo | None, known: bool, expected: TaskState
) -> None:
    assert task_state(attempts, live, known) is expected


def test_live_task_finds_own_rows_and_pending_ranges() -> None:
    rows = {
        "10_0": info(JobState.RUNNING, task="0"),
        "10_[2-5%2]": info(JobState.PENDING, task="[2-5%2]"),
        "12_[0-9]": JobInfo("12", "12", "[0-9]", JobState.PENDING, "", "", None, 0),
    }
    assert live_task(rows, "10", 0) is rows["10_0"]
    assert live_task(rows, "10", 4) is rows["10_[2-5%2]"]
    assert live_task(rows, "10", 1) is None
    assert live_task(rows, "10", 6) is None


def test_current_refs_follow_the_latest_array_and_offsets() -> None:
    arrays = [
        ArrayRecord("10", "0-3", 0, "0-3%2", "job.sbatch", "t"),
        ArrayRecord("11", "4-5", 4, "0-1%2", "job-1.sbatch", "t"),
        ArrayRecord("12", "2,5", 0, "2,5%2", "job-2.sbatch", "t", reason="resubmit-failed"),
    ]
    refs = current_refs(arrays)
    assert refs == {0: ("10", 0), 1: ("10", 1), 2: ("12", 2), 3: ("10", 3), 4: ("11", 0),
                    5: ("12", 5)}  # fmt: skip


# --- metrics ------------------------------------------------------------------------------------


def test_metrics_skip_torn_lines_and_summaries_follow_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 10, "loss": 2.0},
        {"step": 10, "val_loss": 1.5, "val_acc": 0.4},
        {"step": 20, "loss": 1.0},
        {"step": 20, "val_loss": 1.2, "val_acc": 0.7},
        {"step": 15, "loss": 1.7},  # re-logged after a resume from step 10
        {"step": 30, "val_loss": 1.3, "val_acc": 0.6},
        {"step": 30, "val_loss": None},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 40, "lo')
    rows = read_metrics(path)
    assert len(rows) == len(lines)
    assert metric_summary(rows, "val_loss", "min") == (1.3, 1.2, 20)
    assert metric_summary(rows, "val_acc", "max") == (0.6, 0.7, 20)
    assert metric_summary(rows, "missing", "min") == (None, None, None)
    assert loss_curve(rows) == [(10, 2.0), (15, 1.7), (20, 1.0)]
    assert read_metrics(tmp_path / "absent.jsonl") == []


# --- a fabricated sweep directory ---------------------------------------------------------------


def fabricate(tmp_path: Path, n: int = 5, mode: str = "min") -> Path:
    """A sweep directory as ``hpc-ddp sweep`` leaves it, with array job 10 over ``n`` points."""
    sweep = tmp_path / "demo-sweep"
    lines = ["name: demo", "sweep_file: /x/sweep.yaml", "base: /x/job.yaml",
             f"metric: {{name: val_loss, mode: {mode}}}", "max_parallel: 2",
             "keys: [train.lr, train.seed]", "points:"]  # fmt: skip
    for i in range(n):
        point = {
            "index": i,
            "name": f"demo-{i}",
            "overrides": {"train.lr": 0.1 / (i + 1), "train.seed": i % 2},
        }
        lines.append(f"- {json.dumps(point)}")
    (sweep / "tasks").mkdir(parents=True)
    (sweep / "sweep.yaml").write_text("\n".join(lines) + "\n")
    record = ArrayRecord("10", f"0-{n - 1}", 0, f"0-{n - 1}%2", "job.sbatch", "t")
    (sweep / "arrays.json").write_text(json.dumps([record.__dict__]))
    for i in range(n):
        (sweep / "tasks" / str(i) / "logs").mkdir(parents=True)
    return sweep


def task_files(
    sweep: Path, i: int, metrics: list[dict[str, Any]], causes: list[EndCause | None]
) -> None:
    task = sweep / "tasks" / str(i)
    (task / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    for n, cause in enumerate(causes):
        record_start(task / "ledger.jsonl", attempt=n, job_id="1", job_ref=f"10_{i}",
                     nodelist="n1", world_size=2, resumed_from_step=None,
                     checkpoint=None)  # fmt: skip
        if cause is not None:
            record_end(task / "ledger.jsonl", attempt=n, cause=cause, steps_done=20 * (n + 1),
                       checkpoint=None, requeue_requested=cause is EndCause.TIME_LIMIT)  # fmt: skip


def populated(tmp_path: Path) -> Path:
    sweep = fabricate(tmp_path)
    task_files(
        sweep,
        0,
        [{"step": 40, "loss": 0.5, "val_loss": 0.9}],
        [EndCause.TIME_LIMIT, EndCause.FINISHED],
    )
    task_files(sweep, 1, [{"step": 40, "loss": 0.4, "val_loss": 0.7}], [EndCause.FINISHED])
    task_files(sweep, 2, [{"step": 10, "loss": 2.0, "val_loss": 1.9}], [EndCause.CRASH])
    task_files(sweep, 3, [{"step": 20, "loss": 1.0}], [None])
    # Task 4 has not started: no files at all.
    return sweep


LIVE = {
    "10_3": info(JobState.RUNNING, task="3"),
    "10_[4]": JobInfo("10", "10", "[4]", JobState.PENDING, "JobArrayTaskLimit", "", None, 0),
}


def test_gather_results_keeps_every_task_with_its_state(tmp_path: Path) -> None:
    rows = gather_results(populated(tmp_path), Registry().sweeps("slurm"), LIVE)
    assert [r.index for r in rows] == [0, 1, 2, 3, 4]
    assert [r.state for r in rows] == [TaskState.FINISHED, TaskState.FINISHED, TaskState.FAILED,
                                       TaskState.RUNNING, TaskState.PENDING]  # fmt: skip
    assert [r.attempts for r in rows] == [2, 1, 1, 1, 0]
    assert [r.best for r in rows] == [0.9, 0.7, 1.9, None, None]
    assert [r.steps for r in rows] == [
        40,
        40,
        20,
        20,
        None,
    ]  # metrics or the ledger, whichever is further
    assert rows[2].last_cause == "crash"
    assert rows[1].values == {"train.lr": 0.05, "train.seed": 1}
    assert rows[4].job == "10_4"


def test_gather_results_without_slurm_uses_the_ledgers(tmp_path: Path) -> None:
    states = [
        r.state for r in gather_results(populated(tmp_path), Registry().sweeps("slurm"), None)
    ]
    assert states == [TaskState.FINISHED, TaskState.FINISHED, TaskState.FAILED,
                      TaskState.RUNNING, TaskState.UNKNOWN]  # fmt: skip


def row(index: int, best: float | None, lr: Any = 0.1) -> ResultRow:
    return ResultRow(index, f"d-{index}", {"train.lr": lr}, TaskState.FINISHED, best, best, None,
                     None, None, 1, None, None, Path("."))  # fmt: skip


@pytest.mark.parametrize(
    ("key", "mode", "order"),
    [
        ("best", "min", [3, 1, 4, 0, 2]),  # ties (1 and 4) keep index order, missing values last
        ("best", "max", [0, 1, 4, 3, 2]),
        ("train.lr", "min", [2, 4, 3, 0, 1]),
        ("index", "max", [4, 3, 2, 1, 0]),
    ],
)
def test_sort_rows(key: str, mode: str, order: list[int]) -> None:
    rows = [
        row(0, 0.9, 0.3),
        row(1, 0.5, "x"),
        row(2, None, 0.001),
        row(3, 0.1, 0.2),
        row(4, 0.5, 0.01),
    ]
    if key == "train.lr":
        rows[1] = row(1, 0.5, None)  # a point that does not set the key sorts last
    assert [r.index for r in sort_rows(rows, key, mode)] == order


def test_sort_rows_with_mixed_types_compares_text() -> None:
    rows = [row(0, 1.0, "b"), row(1, 1.0, 2), row(2, 1.0, "a")]
    assert [r.index for r in sort_rows(rows, "train.lr", "min")] == [1, 2, 0]


def test_summary_and_sweep_status(tmp_path: Path) -> None:
    summary, rows = sweep_status(populated(tmp_path), Registry().sweeps("slurm"), LIVE)
    assert summary == {"pending": 1, "running": 1, "requeued": 0, "finished": 2, "failed": 1,
                       "cancelled": 0, "unknown": 0}  # fmt: skip
    assert sweep_summary([]) == dict.fromkeys(summary, 0)
    assert [r["state"] for r in rows] == ["finished", "finished", "failed", "running", "pending"]
    assert rows[0]["values"] == {"train.lr": 0.1, "train.seed": 0}  # under "values", not mixed in
    assert json.loads(json.dumps(rows)) == rows  # plain data


def test_read_sweep_record_falls_back_to_yaml_after_an_edit(tmp_path: Path) -> None:
    sweep = fabricate(tmp_path, n=2, mode="max")
    text = (sweep / "sweep.yaml").read_text()
    edited = text.replace('- {"index": 1', "# a note\n- {index: 1")
    (sweep / "sweep.yaml").write_text(edited.replace('"name": "demo-1"', "name: demo-1"))
    record = read_sweep_record(sweep)
    assert [p.name for p in record.points] == ["demo-0", "demo-1"]
    assert (record.mode, record.keys) == ("max", ("train.lr", "train.seed"))


def test_read_sweep_record_of_a_plain_run_dir_says_so(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a sweep directory"):
        read_sweep_record(tmp_path)


def test_read_sweep_record_of_a_file_or_nothing_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("name: x\n")
    with pytest.raises(TargetError, match=r"is a file, not a sweep directory\. HINT:"):
        read_sweep_record(path)
    with pytest.raises(TargetError, match=r"nope: no such directory\. HINT:") as info:
        read_sweep_record(tmp_path / "nope")
    assert info.value.exit_code == 2


GOOD_ARRAY = {"job_id": "10", "points": "0-4", "offset": 0, "array": "0-4%2",
              "script": "job.sbatch", "submitted_at": "t"}  # fmt: skip

# arrays.json content -> words of the reason (each once crashed status/results or passed)
DAMAGED_ARRAYS = {
    "points-abc": ([{**GOOD_ARRAY, "points": "abc"}], "points 'abc' are not array indices"),
    "points-null": ([{**GOOD_ARRAY, "points": None}], "points is None, expected str"),
    "points-empty": ([{**GOOD_ARRAY, "points": ""}], "points '' are not array indices"),
    "job-id-int": ([{**GOOD_ARRAY, "job_id": 1001}], "job_id is 1001, expected str"),
    "job-id-me": ([{**GOOD_ARRAY, "job_id": "--me"}], "job_id '--me' is not a Slurm job id"),
    "job-id-list": ([{**GOOD_ARRAY, "job_id": "1,2"}], "job_id '1,2' is not a Slurm job id"),
    "offset-bool": ([{**GOOD_ARRAY, "offset": True}], "offset is True, expected int"),
    "offset-past": ([{**GOOD_ARRAY, "offset": 3}], "offset 3 is not between 0 and its first"),
    "no-job-id": ([{k: v for k, v in GOOD_ARRAY.items() if k != "job_id"}], "has no job_id"),
    "command": ([{**GOOD_ARRAY, "command": ["sbatch", 3]}], "is not a list of strings"),
    "item-list": ([["10", "0-4"]], "array 0 is a JSON list"),
    "object": ({}, "a JSON dict, not a list of arrays"),
    "null": (None, "a JSON NoneType, not a list"),
}


@pytest.mark.parametrize(("data", "why"), DAMAGED_ARRAYS.values(), ids=list(DAMAGED_ARRAYS))
def test_a_wrongly_typed_arrays_json_is_a_run_dir_error_with_a_hint(
    tmp_path: Path, data: Any, why: str
) -> None:
    sweep = fabricate(tmp_path, n=5)
    (sweep / "arrays.json").write_text(json.dumps(data))
    with pytest.raises(RunDirError) as info:
        read_arrays(sweep)
    assert type(info.value) is RunDirError  # exit 1: the sweep is damaged, not the argument
    message = str(info.value)
    assert message.startswith(f"{sweep / 'arrays.json'}: damaged array record (")
    assert why in message
    assert "HINT: it is written by `hpc-ddp sweep`" in message
    with pytest.raises(RunDirError, match="damaged array record"):
        gather_results(sweep, Registry().sweeps_of(sweep), {})


@pytest.mark.parametrize("content", [b"\xff\xfe\x00[", b'[{"job_id": "10", '])
def test_undecodable_arrays_json_has_a_hint(tmp_path: Path, content: bytes) -> None:
    sweep = fabricate(tmp_path, n=1)
    (sweep / "arrays.json").write_bytes(content)
    with pytest.raises(RunDirError, match=r"damaged array record \(.*Error.*HINT: "):
        read_arrays(sweep)


def test_a_good_arrays_json_reads_and_keys_of_newer_versions_are_ignored(tmp_path: Path) -> None:
    sweep = fabricate(tmp_path, n=5)
    later = {**GOOD_ARRAY, "job_id": "11", "points": "3,4", "offset": 3, "added_later": 1}
    (sweep / "arrays.json").write_text(json.dumps([GOOD_ARRAY, later]))
    assert [(a.job_id, a.points, a.offset, a.reason) for a in read_arrays(sweep)] == [
        ("10", "0-4", 0, "sweep"), ("11", "3,4", 3, "sweep")
    ]  # fmt: skip
    (sweep / "arrays.json").unlink()
    assert read_arrays(sweep) == []  # before the first submission


def test_logged_metrics_names_every_numeric_key_but_step_and_time(tmp_path: Path) -> None:
    rows = gather_results(populated(tmp_path), Registry().sweeps("slurm"), LIVE)
    task_files(tmp_path / "demo-sweep", 4, [{"step": 1, "time": 3.0, "note": "x", "acc": 1}], [])
    assert logged_metrics(rows) == ["acc", "loss", "val_loss"]


@pytest.mark.parametrize(
    "text",
    ["name: [unclosed\n", "points: [a, b]\nname: x\nmetric: {name: l, mode: min}\n", "- 1\n"],
    ids=["not-yaml", "points-not-mappings", "not-a-mapping"],
)
def test_a_damaged_sweep_record_is_a_run_dir_error(tmp_path: Path, text: str) -> None:
    sweep = fabricate(tmp_path, n=1)
    (sweep / "sweep.yaml").write_text(text)
    with pytest.raises(RunDirError) as info:
        read_sweep_record(sweep)
    assert "sweep.yaml" in str(info.value)
    assert "HINT:" in str(info.value)


def test_read_metrics_warns_once_about_damaged_lines_but_not_a_torn_last_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n\x00\xff binary\n[1]\n"text"\n{"step": 2, "lo')
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.sweep.results"):
        assert read_metrics(path) == [{"step": 1, "loss": 2.0}]
    [record] = caplog.records
    assert record.getMessage().startswith(f"{path}: skipped 3 line(s) that are not JSON objects")
    assert "(first: line 2)" in record.getMessage()
    caplog.clear()
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # only a torn last line
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.sweep.results"):
        assert len(read_metrics(path)) == 1
    assert caplog.records == []


def test_values_too_large_for_a_float_are_not_metrics() -> None:
    rows: list[dict[str, Any]] = [
        {"step": 1, "loss": 10**400},
        {"step": 2, "loss": 0.5},
        {"step": 3, "loss": -(10**400)},
    ]
    assert metric_summary(rows, "loss", "min") == (0.5, 0.5, 2)
    assert loss_curve(rows) == [(2, 0.5)]


# --- a live local sweep: the controller is looked up once, not once per point --------------


def _local_sweep_dir(tmp_path: Path, started: dict[int, str]) -> Path:
    """A local sweep's directory: its manifest, and a manifest for each ``started`` point
    (index -> submitted_at)."""
    from hpc_ddp.rundir.layout import RunPaths
    from hpc_ddp.rundir.manifest import Manifest, write_manifest

    sweep = tmp_path / "sweep"
    sweep.mkdir()

    def manifest(where: Path, submitted_at: str, job: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        write_manifest(RunPaths(where), Manifest(
            name="s", backend="local", job_id=job, submitted_at=submitted_at, command=[],
            config_source="s.yaml", run_dir=str(where),
        ))  # fmt: skip

    manifest(sweep, "2026-01-02T00:00:00+00:00", "100")
    for index, when in started.items():
        manifest(sweep / "tasks" / str(index), when, str(200 + index))
    return sweep


def test_local_task_words_read_the_live_controller_once_for_every_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's record names every point it runs: reading it per point made a
    10,000-point sweep's status quadratic (benchmarks/bench_local_sweep_status.py times it)."""
    import hpc_ddp.backends.local.sweeps as local_sweep
    from hpc_ddp.backends.local.sweeps import local_task_words

    # Point 1 started by an earlier controller and queued again; 0-3 queued, 4-5 not.
    sweep = _local_sweep_dir(tmp_path, {1: "2026-01-01T00:00:00+00:00"})
    looked: list[Path] = []

    def controller_points(sweep_dir: Path) -> frozenset[int]:
        looked.append(sweep_dir)
        return frozenset(range(4))

    monkeypatch.setattr(local_sweep, "controller_points", controller_points)
    words = local_task_words(sweep, range(6), Registry())
    assert looked == [sweep]
    assert words == [
        (TaskState.PENDING, None),
        (TaskState.PENDING, "201"),  # its last run is the past: the controller starts it again
        (TaskState.PENDING, None),
        (TaskState.PENDING, None),
        (TaskState.FAILED, None),  # never started, and no live controller will
        (TaskState.FAILED, None),
    ]
