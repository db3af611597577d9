"""Submitting sweeps: array planning and chunking with offsets, the sweep directory's layout,
the fast config dump (compared with ``dump_job_config``), one sbatch per array through a fake
Slurm, and ``--resubmit-failed``'s choice of tasks.

The fake Slurm is the package's :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm` (sbatch, ``scontrol
show config`` and ``squeue -h -O`` as 22.05 prints them; every argv recorded); scripts with an array
offset are also run under real bash to check the run directory and log paths they give each task.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_ddp.backends.arrays import current_refs, read_arrays
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.backends.slurm.sweeps import submit_sweep
from hpc_ddp.config.load import dump_job_config, load_resolved_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import SubmissionError
from hpc_ddp.job.task import task_run_dir, write_task_config
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.rundir.taskconfig import load_task_config
from hpc_ddp.sweep.configtext import ConfigTexts
from hpc_ddp.sweep.records import read_sweep_record
from hpc_ddp.sweep.spec import load_sweep
from tests.ledgers import record_end, record_start

DATA = Path(__file__).parents[1] / "data" / "config"


def fake_slurm(max_array_size: int = 1001, refuse_after: int | None = None) -> FakeSlurm:
    """A scripted Slurm: sbatch hands out job ids from 101; the sbatch calls after the first
    ``refuse_after`` are refused."""
    fake = FakeSlurm(max_array_size=max_array_size, first_job_id=101)
    if refuse_after is not None:
        refused = (1, "sbatch: error: Batch job submission failed")
        fake.script("sbatch", *[None] * refuse_after, *[refused] * 10)
    return fake


def sbatch_calls(fake: FakeSlurm) -> list[tuple[str, ...]]:
    return [a for a in fake.calls if a[0] == "sbatch"]


def squeue_row(job: int, task: int | None, state: str, pending: str = "") -> dict[str, Any]:
    """One job of squeue's view (a task, or the pending range), as :meth:`FakeSlurm.add_job`
    keywords."""
    return {
        "job_id": str(job if task is None else job + 10 + task),
        "array_job_id": str(job),
        "array_task_id": pending or str(task),
        "state": JobState(state),
        "reason": "JobArrayTaskLimit" if pending else "None",
        "nodes": "n[1-2]",
        "command": "/runs/job.sbatch",
    }


def set_queue(fake: FakeSlurm, rows: Sequence[dict[str, Any]]) -> None:
    """What squeue shows from now on: exactly ``rows`` (the submitted arrays are gone)."""
    fake.jobs.clear()
    for row in rows:
        fake.add_job(**row)


def write_sweep(tmp_path: Path, sweep: dict[str, Any], base: str = "job.yaml") -> Path:
    (tmp_path / "job.yaml").write_text(
        "name: demo\nslurm: {nodes: 2, time: '10'}\ntrain: {lr: 0.1, max_steps: 20}\n"
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base, "sweep": sweep}, sort_keys=False))
    return path


def submit(tmp_path: Path, sweep: dict[str, Any], fake: FakeSlurm) -> Path:
    path = write_sweep(tmp_path, sweep)
    spec = load_sweep(path)
    result = submit_sweep(
        spec,
        sweep_file=path,
        runs_dir=tmp_path / "runs",
        python="/venv/bin/python",
        invocation=["hpc-ddp", "sweep", str(path)],
        client=fake.client(),
    )
    return result.sweep_dir


# --- fast config dump ---------------------------------------------------------------------------


def test_config_texts_write_every_scalar_as_the_yaml_dumper_does() -> None:
    """Numbers of every magnitude, bools, None and strings YAML would misread unquoted: the
    pieces (all from ``dump_yaml``) assemble to ``dump_job_config``'s text, value by value."""
    rng = random.Random(0)
    numbers: list[Any] = [0, -1, 7, 10**20, 0.0, -0.0, 1.0, 0.1, -2.5, 1, True]
    numbers += [10.0**e for e in range(-30, 31)] + [-(10.0**e) for e in range(-12, 13)]
    numbers += [math.exp(rng.uniform(-40, 40)) for _ in range(300)]
    numbers += [rng.uniform(-1, 1) for _ in range(100)] + [float("inf")]
    names = ["demo-0", "base-17", "a.b_c-d-99", "x-1e5", "yes-1", "null-2", "on-3", "yes",
             "0-1", "1e5", "plain", "a b-1", "2024-01-01", "x: y", "#c"]  # fmt: skip
    base = JobConfig(name="demo")
    configs = [
        dataclasses.replace(base, train=dataclasses.replace(base.train, lr=value))
        for value in numbers
    ] + [dataclasses.replace(base, name=name) for name in names]
    assert ConfigTexts().dump(configs) == [dump_job_config(c) for c in configs]
    # 1, 1.0 and True are equal values with different texts: never taken for one another.
    texts = ConfigTexts().dump(configs[10:11] + configs[6:7])
    assert "  lr: true\n" in texts[0]
    assert "  lr: 1.0\n" in texts[1]


def _random_sweep(tmp_path: Path) -> Path:
    return write_sweep(
        tmp_path,
        {
            "grid": {"train.optimizer": ["sgd", "adamw"]},
            "random": {
                "samples": 60,
                "seed": 3,
                "params": {
                    "train.lr": {"loguniform": [1.0e-9, 1.0e9]},
                    "train.seed": {"randint": [0, 10**9]},
                    "env.modules": {
                        "choice": [[], ["cuda/12.1", "gcc/1 2"], ["yes", "2024-01-01"]]
                    },
                    "env.vars": {"choice": [{}, {"A": "1", "B": "x: y"}]},
                    "slurm.extra": {"choice": [{}, {"mail-type": "END,FAIL", "spread-job": None}]},
                    "env.setup": {"choice": [[], ["source 'a b'/bin/activate # c"]]},
                    "command": {"choice": [None, ["python", "train.py", "--flag=1"]]},
                },
            },
        },
    )


def test_config_texts_fall_back_when_a_later_config_disagrees(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not only the first config is checked: a fast text wrong for the last one (or one in
    the middle of a long sweep) sends every config through ``dump_job_config``."""
    from hpc_ddp.sweep import configtext

    base = JobConfig(name="demo")
    configs = [
        dataclasses.replace(base, train=dataclasses.replace(base.train, lr=0.001 * (i + 1)))
        for i in range(100)
    ]
    real_dump = ConfigTexts.dump
    for bad in (99, configtext._sample(100)[3]):

        def wrong_at(self: ConfigTexts, cfgs: Any, bad: int = bad) -> list[str]:
            texts = real_dump(self, cfgs)
            texts[bad] += "# wrong\n"
            return texts

        monkeypatch.setattr(ConfigTexts, "dump", wrong_at)
        assert configtext.config_texts(configs) == [dump_job_config(c) for c in configs]
        assert "disagrees" in caplog.text
        caplog.clear()
    assert configtext._sample(5) == [0, 1, 2, 3, 4]
    assert configtext._sample(1000)[0] == 0
    assert configtext._sample(1000)[-1] == 999
    assert len(configtext._sample(1000)) == configtext.CHECKED_SAMPLE


@pytest.mark.parametrize("source", ["fixture", "random"])
def test_config_texts_equal_dump_job_config(source: str, tmp_path: Path) -> None:
    path = DATA / "sweep.yaml" if source == "fixture" else _random_sweep(tmp_path)
    configs = [p.config for p in load_sweep(path).points]
    texts = ConfigTexts().dump(configs)
    assert texts == [dump_job_config(c) for c in configs]


# --- the sweep directory and one sbatch ---------------------------------------------------------


def test_submit_writes_one_sweep_dir_and_calls_sbatch_once(tmp_path: Path) -> None:
    fake = fake_slurm()
    sweep = {"grid": {"train.lr": [0.1, 0.01, 0.001], "train.seed": [0, 1]}, "max_parallel": 2}
    sweep_dir = submit(tmp_path, sweep, fake)
    assert [a[0] for a in fake.calls].count("sbatch") == 1
    assert sbatch_calls(fake) == [("sbatch", "--parsable", str(sweep_dir / "job.sbatch"))]
    assert sweep_dir.parent == (tmp_path / "runs").resolve()
    assert sweep_dir.name.startswith("demo-")
    assert sorted(p.name for p in sweep_dir.iterdir()) == [
        "arrays.json", "job.sbatch", "logs", "manifest.json", "submit.lock", "sweep.yaml",
        "task_configs.jsonl", "tasks",
    ]  # fmt: skip
    # Nothing per point at submit: each task makes its own directory when it starts (the
    # batch script its logs/, the task its config.yaml); the batch logs go to the sweep's
    # logs/, which exists before sbatch opens them.
    assert list((sweep_dir / "tasks").iterdir()) == []
    spec = load_sweep(tmp_path / "sweep.yaml")
    for point in spec.points:
        task = RunPaths(sweep_dir).task(point.index)
        assert load_task_config(sweep_dir, point.index) == point.config  # before it starts
        env = {"SLURM_ARRAY_TASK_ID": str(point.index)}
        assert task_run_dir(sweep_dir, env) == task.root
        write_task_config(sweep_dir, task.root)
        assert sorted(p.name for p in task.root.iterdir()) == ["config.yaml"]
        assert task.config.read_text() == dump_job_config(point.config)
        assert load_resolved_config(task.config) == point.config
    script = (sweep_dir / "job.sbatch").read_text()
    assert "#SBATCH --array=0-5%2\n" in script
    assert "#SBATCH --job-name=demo\n" in script
    manifest = read_manifest(sweep_dir)
    assert (manifest.job_id, manifest.array, manifest.array_jobs) == ("101", "0-5%2", ["101"])
    assert manifest.run_dir == str(sweep_dir)
    [record] = read_arrays(sweep_dir)
    assert (record.job_id, record.points, record.offset, record.script) == (
        "101", "0-5", 0, "job.sbatch"
    )  # fmt: skip
    swept = read_sweep_record(sweep_dir)
    assert swept.keys == ("train.lr", "train.seed")
    assert (swept.metric, swept.mode, swept.max_parallel) == ("val_loss", "min", 2)
    assert [p.overrides for p in swept.points] == [dict(p.overrides) for p in spec.points]


def test_configs_are_written_as_one_file_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpc_ddp import durable
    from hpc_ddp.sweep import sweepdir

    file_syncs: list[int] = []
    dir_syncs: list[Path] = []
    real_fsync = os.fsync

    def count_fsync(fd: int) -> None:
        file_syncs.append(fd)
        real_fsync(fd)

    def count_dir(path: Path) -> None:
        dir_syncs.append(Path(path))

    monkeypatch.setattr(os, "fsync", count_fsync)
    monkeypatch.setattr(sweepdir, "fsync_dir", count_dir)
    monkeypatch.setattr(durable, "fsync_dir", count_dir)
    sweep = {"grid": {"train.lr": [0.1, 0.01, 0.001, 0.0001], "train.seed": [0, 1, 2]}}
    sweep_dir = submit(tmp_path, sweep, fake_slurm())
    # one fsync per atomic file (task_configs.jsonl, sweep.yaml, job.sbatch, arrays.json,
    # manifest.json), none per config: the 12 are in task_configs.jsonl
    assert len(file_syncs) == 5
    assert dir_syncs[:2] == [sweep_dir, sweep_dir]
    assert len((sweep_dir / "task_configs.jsonl").read_text().splitlines()) == 12
    assert list((sweep_dir / "tasks").iterdir()) == []


def test_sweep_record_keeps_every_value_exactly(tmp_path: Path) -> None:
    fake = fake_slurm()
    sweep_dir = submit(tmp_path, yaml.safe_load(_random_sweep(tmp_path).read_text())["sweep"], fake)
    spec = load_sweep(_random_sweep(tmp_path))
    expected = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in p.overrides} for p in spec.points
    ]
    assert [p.overrides for p in read_sweep_record(sweep_dir).points] == expected


def _run_task_env(script: str, tmp_path: Path, task_id: int) -> dict[str, str]:
    """Run ``script`` under bash with a stub srun; return the environment srun saw."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "srun").write_text('#!/bin/sh\nenv > "$STUB_ENV"\n')
    (stubs / "srun").chmod(0o755)
    out = tmp_path / f"env-{task_id}"
    # The supervisor (fault.enabled) would run the srun line after `--`: run it directly.
    script = re.sub(r"^exec \S+ -m hpc_ddp supervise \S+ -- \\\n", "", script, flags=re.M)
    subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{stubs}:/usr/bin:/bin", "STUB_ENV": str(out),
             "SLURM_ARRAY_TASK_ID": str(task_id)},
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


def test_a_user_templates_tasks_get_their_logs_dir_at_submit(tmp_path: Path) -> None:
    """A template copied before the default one made each task's logs/ cannot be relied on to
    make it: srun would then fail to open the rank logs, so submit makes them (and writes the
    config) as before."""
    (tmp_path / "mine.j2").write_text(
        "#!/bin/bash\n{{ sbatch_lines | join('\\n') }}\nsrun {{ task_argv | join(' ') }}\n"
    )
    fake = fake_slurm()
    sweep_dir = submit(
        tmp_path, {"grid": {"slurm.template": ["mine.j2"], "train.seed": [0, 1]}}, fake
    )
    assert (sweep_dir / "logs").is_dir()
    spec = load_sweep(tmp_path / "sweep.yaml")
    for point in spec.points:
        task = RunPaths(sweep_dir).task(point.index)
        assert task.logs.is_dir()
        # and its config.yaml, which its script may read before `hpc-ddp run` writes it
        assert task.config.read_text() == dump_job_config(point.config)
    assert (
        f"#SBATCH --output={sweep_dir}/logs/batch-%A_%a.out\n"
        in (sweep_dir / "job.sbatch").read_text()
    )


def test_arrays_past_max_array_size_are_chunked_with_offsets(tmp_path: Path) -> None:
    fake = fake_slurm(max_array_size=4)
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": list(range(10))}, "max_parallel": 3}, fake)
    assert len(sbatch_calls(fake)) == 3
    records = read_arrays(sweep_dir)
    assert [(r.job_id, r.points, r.offset, r.array, r.script) for r in records] == [
        ("101", "0-3", 0, "0-3%3", "job.sbatch"),
        ("102", "4-7", 4, "0-3%3", "job-1.sbatch"),
        ("103", "8-9", 8, "0-1%3", "job-2.sbatch"),
    ]
    assert read_manifest(sweep_dir).array_jobs == ["101", "102", "103"]
    script = (sweep_dir / "job-1.sbatch").read_text()
    assert "export HPC_DDP_ARRAY_OFFSET=4\n" in script
    assert f"#SBATCH --output={sweep_dir}/logs/batch-%A_%a.out\n" in script
    assert f"--output={sweep_dir}/arrays/4/%a/logs/rank-%t.out" in script
    # Task 2 of the second array is point 6: its run dir, and its logs through the link.
    assert not (sweep_dir / "tasks" / "6" / "logs").exists()
    env = _run_task_env(script, tmp_path, 2)
    assert env["HPC_DDP_RUN_DIR"] == f"{sweep_dir}/tasks/6"
    assert (sweep_dir / "tasks" / "6" / "logs").is_dir()  # made by the script, before srun
    assert task_run_dir(sweep_dir, env) == sweep_dir / "tasks" / "6"
    assert (sweep_dir / "arrays" / "4" / "2" / "logs").resolve() == sweep_dir / "tasks/6/logs"
    assert not (sweep_dir / "arrays" / "0").exists()  # the first array needs no links
    first = _run_task_env((sweep_dir / "job.sbatch").read_text(), tmp_path, 3)
    assert first["HPC_DDP_RUN_DIR"] == f"{sweep_dir}/tasks/3"
    assert "HPC_DDP_ARRAY_OFFSET" not in first


def test_a_refused_second_array_keeps_the_first_recorded(tmp_path: Path) -> None:
    fake = fake_slurm(max_array_size=4, refuse_after=1)
    with pytest.raises(SubmissionError, match="101") as info:
        submit(tmp_path, {"grid": {"train.seed": list(range(6))}}, fake)
    assert "--resubmit-failed" in str(info.value)
    [sweep_dir] = (tmp_path / "runs").iterdir()
    assert [r.job_id for r in read_arrays(sweep_dir)] == ["101"]
    assert read_manifest(sweep_dir).array_jobs == ["101"]


def test_nothing_submitted_leaves_no_sweep_dir(tmp_path: Path) -> None:
    with pytest.raises(SubmissionError):
        submit(tmp_path, {"grid": {"train.seed": [0, 1]}}, fake_slurm(refuse_after=0))
    assert list((tmp_path / "runs").iterdir()) == []


# --- resubmitting failed tasks ------------------------------------------------------------------


def _ledger(sweep_dir: Path, index: int, cause: EndCause | None) -> None:
    path = RunPaths(sweep_dir).task(index).ledger
    job, task = current_refs(read_arrays(sweep_dir))[index]  # the point's current array task
    record_start(path, attempt=0, job_id="1", job_ref=f"{job}_{task}", nodelist="n1",
                 world_size=2, resumed_from_step=None, checkpoint=None, now=1.0)  # fmt: skip
    if cause is not None:
        record_end(path, attempt=0, cause=cause, steps_done=5, checkpoint=None,
                   requeue_requested=False, now=2.0)  # fmt: skip


def test_resubmit_failed_submits_exactly_the_failed_tasks(tmp_path: Path) -> None:
    fake = fake_slurm()
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": list(range(8))}, "max_parallel": 2}, fake)
    _ledger(sweep_dir, 0, EndCause.FINISHED)  # done
    _ledger(sweep_dir, 1, EndCause.CRASH)  # failed
    _ledger(sweep_dir, 2, None)  # killed without a word, gone from the queue: failed
    _ledger(sweep_dir, 3, EndCause.TIME_LIMIT)  # requeued: pending again in squeue
    _ledger(sweep_dir, 4, None)  # running
    _ledger(sweep_dir, 5, EndCause.CANCELLED)  # cancelled: submitted again
    # 6 never started and is still pending; 7 left the queue without a ledger: failed.
    set_queue(
        fake,
        [
            squeue_row(101, 3, "PENDING"),
            squeue_row(101, 4, "RUNNING"),
            squeue_row(101, 1, "FAILED"),
            squeue_row(101, None, "PENDING", pending="6%2"),
        ],
    )
    before = len(sbatch_calls(fake))
    result = (
        Registry(fake.client())
        .sweeps_of(sweep_dir)
        .resubmit(sweep_dir, now=None, dry_run=False, python="/venv/bin/python", invocation=["x"])
    )
    assert result.points == [1, 2, 5, 7]
    assert len(sbatch_calls(fake)) == before + 1
    assert sbatch_calls(fake)[-1][-1] == str(sweep_dir / "job-1.sbatch")
    assert "#SBATCH --array=1-2,5,7%2\n" in (sweep_dir / "job-1.sbatch").read_text()
    records = read_arrays(sweep_dir)
    assert [(r.job_id, r.points, r.reason) for r in records] == [
        ("101", "0-7", "sweep"), ("102", "1-2,5,7", "resubmit-failed")
    ]  # fmt: skip
    manifest = read_manifest(sweep_dir)
    assert (manifest.job_id, manifest.array_jobs) == ("101", ["101", "102"])
    # The tasks keep their directories: ledgers untouched, nothing recreated.
    assert len((RunPaths(sweep_dir).task(1).ledger).read_text().splitlines()) == 2


def test_resubmit_with_nothing_failed_submits_nothing(tmp_path: Path) -> None:
    fake = fake_slurm()
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": [0, 1]}}, fake)
    set_queue(fake, [squeue_row(101, 0, "RUNNING"), squeue_row(101, 1, "PENDING")])
    before = list(fake.calls)
    result = (
        Registry(fake.client())
        .sweeps_of(sweep_dir)
        .resubmit(sweep_dir, now=None, dry_run=False, python="p", invocation=["x"])
    )
    assert (result.points, result.records) == ([], [])
    assert [a[:6] for a in fake.calls[len(before) :]] == [
        ("squeue", "-h", "-t", "all", "-j", "101")
    ]
    assert len(read_arrays(sweep_dir)) == 1


def test_resubmit_dry_run_plans_but_submits_nothing(tmp_path: Path) -> None:
    fake = fake_slurm()
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": [0, 1, 2]}}, fake)
    _ledger(sweep_dir, 1, EndCause.CRASH)
    set_queue(fake, [squeue_row(101, 0, "RUNNING"), squeue_row(101, 2, "RUNNING")])
    result = (
        Registry(fake.client())
        .sweeps_of(sweep_dir)
        .resubmit(sweep_dir, now=None, python="p", invocation=["x"], dry_run=True)
    )
    assert result.points == [1]
    assert [a.array for a in result.arrays] == ["1"]
    assert len(sbatch_calls(fake)) == 1
    assert not (sweep_dir / "job-1.sbatch").exists()


def test_resubmit_past_max_array_size_uses_an_offset(tmp_path: Path) -> None:
    fake = fake_slurm(max_array_size=4)
    sweep_dir = submit(tmp_path, {"grid": {"train.seed": list(range(8))}}, fake)
    for index in (0, 1, 2, 3, 4, 5, 7):
        _ledger(sweep_dir, index, EndCause.FINISHED)
    set_queue(fake, [])
    result = (
        Registry(fake.client())
        .sweeps_of(sweep_dir)
        .resubmit(sweep_dir, now=None, dry_run=False, python="p", invocation=["x"])
    )
    assert result.points == [6]
    [record] = result.records
    assert (record.offset, record.array, record.points) == (6, "0", "6")
    env = _run_task_env((sweep_dir / record.script).read_text(), tmp_path, 0)
    assert env["HPC_DDP_RUN_DIR"] == f"{sweep_dir}/tasks/6"
    assert os.path.realpath(sweep_dir / "arrays" / "6" / "0") == str(sweep_dir / "tasks" / "6")
