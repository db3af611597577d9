"""A sweep task's ``config.yaml``: packed for every point at submit, written out as each task
starts (:mod:`hpc_ddp.rundir.taskconfig`).

* Every point's ``config.yaml``, as its task writes it, is byte for byte the text
  ``config_texts`` gives (what submit wrote per point before), for values of every kind,
  text that is not ASCII included.
* Several processes writing the same point's config at once (every rank and the supervisor
  do) leave one whole file and no temp file; a reader meanwhile sees no file or a whole one.
* A sweep directory written before the packed file existed (every ``config.yaml``, no
  ``task_configs.jsonl``) reads as it did; a task's own ``config.yaml`` wins over its line.
* A damaged line is a :class:`RunDirError` naming the file; a file rewritten with other JSON
  spacing is still read; a point with neither is none.

The real array tasks that write their configs are in ``tests/sweep/test_sweep_e2e.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_ddp.config.load import dump_job_config
from hpc_ddp.errors import RunDirError
from hpc_ddp.job.task import task_run_dir, write_task_config
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.taskconfig import (
    load_task_config,
    materialise_task_config,
    pack_task_configs,
    packed_config_text,
    task_config_text,
)
from hpc_ddp.sweep.configtext import config_texts
from hpc_ddp.sweep.spec import SweepSpec, load_sweep
from hpc_ddp.sweep.sweepdir import write_sweep_dir

DATA = Path(__file__).parents[1] / "data" / "config"


def _spec(tmp_path: Path) -> SweepSpec:
    """Points with values of many kinds: numbers of every size, lists, mappings, None, strings
    YAML would misread unquoted, and text that is not ASCII."""
    (tmp_path / "job.yaml").write_text(
        "name: demo\nslurm: {nodes: 2, time: '10'}\ntrain: {lr: 0.1, max_steps: 20}\n"
    )
    sweep = {
        "grid": {"train.optimizer": ["sgd", "adamw"]},
        "random": {
            "samples": 40,
            "seed": 5,
            "params": {
                "train.lr": {"loguniform": [1.0e-9, 1.0e9]},
                "train.seed": {"randint": [0, 10**9]},
                "env.modules": {"choice": [[], ["cuda/12.1", "gcc/1 2"], ["yes", "2024-01-01"]]},
                "env.vars": {
                    "choice": [{}, {"A": "1", "B": "x: y"}, {"GREETING": "héllo wörld ✓ 日本"}]
                },
                "slurm.extra": {"choice": [{}, {"mail-type": "END,FAIL", "spread-job": None}]},
                "command": {"choice": [None, ["python", "train.py", "--flag=1"]]},
            },
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "job.yaml", "sweep": sweep}, allow_unicode=True))
    return load_sweep(path)


def _sweep_dir(tmp_path: Path, spec: SweepSpec) -> Path:
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    write_sweep_dir(sweep_dir, spec, "# record\n")
    return sweep_dir


@pytest.mark.parametrize("source", ["fixture", "random"])
def test_each_task_writes_its_config_byte_for_byte_as_config_texts_gives_it(
    source: str, tmp_path: Path
) -> None:
    spec = load_sweep(DATA / "sweep.yaml") if source == "fixture" else _spec(tmp_path)
    sweep_dir = _sweep_dir(tmp_path, spec)
    configs = [p.config for p in spec.points]
    texts = config_texts(configs)
    assert texts == [dump_job_config(c) for c in configs]
    if source == "random":
        assert any("日本" in t for t in texts)  # the non-ASCII case is really there
    assert list(RunPaths(sweep_dir).tasks.iterdir()) == []  # nothing per point at submit
    for point, text in zip(spec.points, texts, strict=True):
        task = RunPaths(sweep_dir).task(point.index)
        assert task_config_text(sweep_dir, point.index) == text  # before the task starts
        assert load_task_config(sweep_dir, point.index) == point.config
        env = {"SLURM_ARRAY_TASK_ID": str(point.index)}
        assert task_run_dir(sweep_dir, env) == task.root  # what `hpc-ddp run` calls first
        assert not task.root.exists()  # it writes nothing: the task may yet be refused
        write_task_config(sweep_dir, task.root)  # what it calls once it may run
        assert task.config.read_bytes() == text.encode("utf-8")
        assert sorted(p.name for p in task.root.iterdir()) == ["config.yaml"]
        assert task_config_text(sweep_dir, point.index) == text  # now from the file


ROUNDS = 10
"""How often the racers race on each point (the first racer removes the file between)."""


def _race(sweep_dir: Path, points: int, barrier: Any, first: bool) -> None:
    """One racer: for each point, wait for the others, then write the point's config."""
    for round_ in range(ROUNDS):
        for index in range(points):
            barrier.wait(timeout=60)
            materialise_task_config(sweep_dir, index)
        barrier.wait(timeout=60)
        if first and round_ < ROUNDS - 1:
            for index in range(points):
                RunPaths(sweep_dir).task(index).config.unlink()
        barrier.wait(timeout=60)


def _watch(sweep_dir: Path, points: int, expected: list[bytes], stop: Any, out: Path) -> None:
    """Read every point's config.yaml until ``stop``: record each read that is not a whole
    file (and how many whole ones were seen)."""
    bad: list[str] = []
    whole = 0
    while not stop.is_set():
        for index in range(points):
            try:
                data = RunPaths(sweep_dir).task(index).config.read_bytes()
            except FileNotFoundError:
                continue
            if data == expected[index]:
                whole += 1
            else:
                bad.append(f"point {index}: {len(data)} of {len(expected[index])} bytes")
    out.write_text(json.dumps({"bad": bad, "whole": whole}))


def test_racing_writers_leave_one_whole_file_and_readers_never_see_part_of_one(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    sweep_dir = _sweep_dir(tmp_path, spec)
    expected = [t.encode() for t in config_texts([p.config for p in spec.points])]
    points = len(expected)
    ctx = multiprocessing.get_context("fork")
    racers = 5
    barrier = ctx.Barrier(racers)
    stop = ctx.Event()
    seen = tmp_path / "seen.json"
    watcher = ctx.Process(target=_watch, args=(sweep_dir, points, expected, stop, seen))
    watcher.start()
    procs = [
        ctx.Process(target=_race, args=(sweep_dir, points, barrier, i == 0)) for i in range(racers)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    time.sleep(0.05)
    stop.set()
    watcher.join(timeout=30)
    assert [proc.exitcode for proc in procs] == [0] * racers
    assert watcher.exitcode == 0
    report = json.loads(seen.read_text())
    assert report["bad"] == []
    assert report["whole"] > 0  # the watcher did read the files
    for index in range(points):
        task = RunPaths(sweep_dir).task(index)
        assert task.config.read_bytes() == expected[index]
        assert [p.name for p in task.root.iterdir()] == ["config.yaml"]  # no temp file left


def test_a_sweep_dir_of_the_old_layout_reads_as_before(tmp_path: Path) -> None:
    """Every config.yaml written at submit and no task_configs.jsonl: as sweeps on users' disks
    were written before."""
    spec = _spec(tmp_path)
    sweep_dir = _sweep_dir(tmp_path, spec)
    texts = config_texts([p.config for p in spec.points])
    for point, text in zip(spec.points, texts, strict=True):
        config = RunPaths(sweep_dir).task(point.index).config
        config.parent.mkdir()
        config.write_text(text)
    RunPaths(sweep_dir).task_configs.unlink()
    for point, text in zip(spec.points, texts, strict=True):
        config = RunPaths(sweep_dir).task(point.index).config
        assert packed_config_text(sweep_dir, point.index) is None
        assert task_config_text(sweep_dir, point.index) == text
        assert load_task_config(sweep_dir, point.index) == point.config
        assert materialise_task_config(sweep_dir, point.index) == config
        assert config.read_text() == text
    env = {"SLURM_ARRAY_TASK_ID": "3"}
    assert task_run_dir(sweep_dir, env) == RunPaths(sweep_dir).task(3).root
    # A point with neither: the task says so, naming both.
    env = {"SLURM_ARRAY_TASK_ID": str(len(texts))}
    with pytest.raises(RunDirError, match=r"no config.yaml, and task_configs.jsonl has no line"):
        task_run_dir(sweep_dir, env)
    with pytest.raises(RunDirError, match="no config for point"):
        load_task_config(sweep_dir, len(texts))


def test_a_tasks_own_config_wins_over_its_packed_line(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    sweep_dir = _sweep_dir(tmp_path, spec)
    config = RunPaths(sweep_dir).task(2).config
    config.parent.mkdir()
    config.write_text("name: edited\n")
    assert task_config_text(sweep_dir, 2) == "name: edited\n"
    assert materialise_task_config(sweep_dir, 2) == config
    assert config.read_text() == "name: edited\n"  # never overwritten
    assert load_task_config(sweep_dir, 2).name == "edited"


def test_lines_are_found_by_index_however_the_file_was_rewritten(tmp_path: Path) -> None:
    texts = [(i, f"name: p{i}\n") for i in range(12)]
    packed = tmp_path / "task_configs.jsonl"
    packed.write_text(pack_task_configs(texts))
    for index, text in texts:
        assert packed_config_text(tmp_path, index) == text  # "1" is no prefix of "10"
    assert packed_config_text(tmp_path, 12) is None
    # Another JSON writer's spacing and key order: found by parsing every line.
    packed.write_text(
        "".join(json.dumps({"config": t, "index": i}, indent=None, separators=(",", ":")) + "\n"
                for i, t in texts)
    )  # fmt: skip
    for index, text in texts:
        assert packed_config_text(tmp_path, index) == text
    assert packed_config_text(tmp_path, 12) is None


def _edited(tmp_path: Path, line: int, index: int) -> Path:
    """Points 0-5, with line ``line`` (0-based) edited to say ``index``."""
    packed = tmp_path / "task_configs.jsonl"
    lines = pack_task_configs((i, f"name: p{i}\n") for i in range(6)).splitlines(keepends=True)
    lines[line] = lines[line].replace(f'"index": {line},', f'"index": {index},')
    packed.write_text("".join(lines))
    return packed


def test_an_index_claimed_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """The issue's edit: point 1's line says 4. Point 4 used to run point 1's config (the
    first line with its prefix won), while `results` showed point 4's values."""
    packed = _edited(tmp_path, 1, 4)
    with pytest.raises(RunDirError, match=r"lines 2, 5 all say they are point 4's config.*HINT"):
        packed_config_text(tmp_path, 4)
    with pytest.raises(RunDirError, match=r"line 2, point 1's, says index 4\. HINT"):
        packed_config_text(tmp_path, 1)
    with pytest.raises(RunDirError, match=str(packed)):
        materialise_task_config(tmp_path, 4)
    for index in (1, 4):
        assert not RunPaths(tmp_path).task(index).root.exists()  # neither runs
    assert packed_config_text(tmp_path, 2) == "name: p2\n"  # the other points go on


def test_a_line_at_another_points_place_is_refused(tmp_path: Path) -> None:
    """Point 1's line says 4 and point 4's line is gone: still not point 4's config."""
    packed = tmp_path / "task_configs.jsonl"
    _edited(tmp_path, 1, 4)
    lines = packed.read_text().splitlines(keepends=True)
    packed.write_text("".join(lines[:4] + lines[5:]))
    with pytest.raises(RunDirError, match=r"line 2 says it is point 4's config, but point 4's "):
        packed_config_text(tmp_path, 4)


def test_a_damaged_line_is_a_run_dir_error_naming_the_file(tmp_path: Path) -> None:
    packed = tmp_path / "task_configs.jsonl"
    packed.write_text(pack_task_configs([(0, "name: a\n")]) + '{"index": 1, "config": "na\n')
    assert packed_config_text(tmp_path, 0) == "name: a\n"
    with pytest.raises(RunDirError, match=r"task_configs.jsonl: the line of point 1 is damaged"):
        packed_config_text(tmp_path, 1)
    with pytest.raises(RunDirError, match="HINT: "):
        materialise_task_config(tmp_path, 1)
    assert not RunPaths(tmp_path).task(1).root.exists()  # nothing written from a bad line
