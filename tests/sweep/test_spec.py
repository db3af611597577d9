"""Sweep expansion (grid, list, random), point validation, and job-array chunking."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_ddp.config.load import load_job_config
from hpc_ddp.config.sweepfile import (
    MAX_SWEEP_POINTS,
    SWEEP_SCHEMA,
    Distribution,
    MetricSpec,
    RandomSpec,
    SweepFile,
    SweepSection,
)
from hpc_ddp.errors import ConfigError, OverrideError
from hpc_ddp.sweep.spec import SweepSpec, chunk_array, load_sweep, split_sweep_overrides

DATA = Path(__file__).parents[1] / "data" / "config"


def _write_sweep(tmp_path: Path, sweep: Any, base: Any = "../job.yaml", **top: Any) -> Path:
    (tmp_path / "job.yaml").write_text(
        "name: base\ntrain: {lr: 0.1, max_steps: 10}\nslurm: {partition: p}\n"
    )
    path = tmp_path / "sweeps" / "s.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"base": base, "sweep": sweep, **top}, sort_keys=False))
    return path


def _sweep(tmp_path: Path, sweep: Any, base: Any = "../job.yaml", **kw: Any) -> SweepSpec:
    return load_sweep(_write_sweep(tmp_path, sweep, base), **kw)


def test_fixture_sweep_expands_grid_then_list_then_random() -> None:
    spec = load_sweep(DATA / "sweep.yaml")
    assert spec.base_source == str(DATA / "full.yaml")
    assert (spec.metric, spec.mode, spec.max_parallel) == ("val_acc", "max", 3)
    assert len(spec.points) == 2 * 3 + 2 + 4
    assert [p.index for p in spec.points] == list(range(12))
    # Grid: keys in file order, the last key varying fastest.
    assert [p.overrides for p in spec.points[:3]] == [
        (("train.lr", 0.1), ("train.batch_size", 64)),
        (("train.lr", 0.1), ("train.batch_size", 128)),
        (("train.lr", 0.1), ("train.batch_size", 256)),
    ]
    assert spec.points[5].config.train.lr == 0.01
    assert spec.points[5].config.train.batch_size == 256
    # List points come next, lists as tuples.
    assert spec.points[6].overrides == (("train.lr", 0.3), ("train.seed", 1))
    assert spec.points[7].overrides == (("env.modules", ("cuda/11.8",)), ("slurm.nodes", 1))
    assert spec.points[7].config.env.modules == ("cuda/11.8",)
    assert spec.points[7].config.slurm.nodes == 1
    # Every point keeps the rest of the base and is named <base>-<index>.
    base = load_job_config(DATA / "full.yaml")
    for point in spec.points:
        assert point.config.name == f"full-job-{point.index}"
        assert point.config.slurm.extra == base.slurm.extra
        assert point.config.requeue == base.requeue
    assert spec.points[0].config.env == base.env
    hash(spec)  # points are hashable


def test_random_points_are_in_range_and_reproducible() -> None:
    first = load_sweep(DATA / "sweep.yaml").points[8:]
    again = load_sweep(DATA / "sweep.yaml").points[8:]
    assert first == again
    for point in first:
        train = point.config.train
        assert 1e-4 <= train.lr <= 1e-1
        assert 0.0 <= train.weight_decay <= 0.001
        assert train.seed in range(4)
        assert train.optimizer in ("sgd", "adamw")
        assert [k for k, _ in point.overrides] == [
            "train.lr", "train.weight_decay", "train.seed", "train.optimizer"
        ]  # fmt: skip


def _random_values(tmp_path: Path, seed: int) -> list[tuple[tuple[str, Any], ...]]:
    params = {"train.lr": {"loguniform": [1e-5, 1.0]}, "train.seed": {"randint": [0, 10**6]}}
    spec = _sweep(tmp_path, {"random": {"samples": 5, "seed": seed, "params": params}})
    return [p.overrides for p in spec.points]


def test_same_seed_same_points_different_seed_different_points(tmp_path: Path) -> None:
    assert _random_values(tmp_path, 1) == _random_values(tmp_path, 1)
    assert _random_values(tmp_path, 1) != _random_values(tmp_path, 2)


def test_loguniform_spreads_over_decades(tmp_path: Path) -> None:
    params = {"train.lr": {"loguniform": [1e-6, 1.0]}}
    spec = _sweep(tmp_path, {"random": {"samples": 200, "seed": 0, "params": params}})
    decades = {math.floor(math.log10(p.config.train.lr)) for p in spec.points}
    assert decades >= {-6, -5, -4, -3, -2, -1}  # uniform would put ~all of them in [0.1, 1]


def test_inline_base_and_defaults(tmp_path: Path) -> None:
    spec = _sweep(
        tmp_path, {"list": [{"train.lr": 0.5}, {}]}, base={"name": "inl", "train": {"epochs": 2}}
    )
    assert spec.base_source.endswith("s.yaml (inline base)")
    assert (spec.metric, spec.mode, spec.max_parallel) == ("val_loss", "min", None)
    assert [p.config.name for p in spec.points] == ["inl-0", "inl-1"]
    assert spec.points[0].config.train.lr == 0.5
    assert spec.points[1].config.train.lr == 0.05  # an empty point is the base as it is


def test_overrides_apply_to_base_before_sweep_values(tmp_path: Path) -> None:
    spec = _sweep(
        tmp_path,
        {"grid": {"train.lr": [0.2, 0.3]}},
        overrides=["train.lr=0.9", "train.momentum=0.5"],
    )
    assert [p.config.train.lr for p in spec.points] == [0.2, 0.3]  # the swept value wins
    assert {p.config.train.momentum for p in spec.points} == {0.5}


def test_site_profile_applies_under_the_base(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("slurm: {partition: site, account: acct}\n")
    spec = _sweep(tmp_path, {"grid": {"train.seed": [1]}}, site_profile=site)
    assert spec.points[0].config.slurm.partition == "p"  # the base beats the site
    assert spec.points[0].config.slurm.account == "acct"


SWEEP_ERRORS: list[tuple[Any, str]] = [
    ({"grid": {"train.lrr": [0.1]}},
     "sweep.grid: train.lrr: unknown key. HINT: did you mean 'train.lr'?"),
    ({"list": [{"slurm.tasks_per_nod": 2}]}, "did you mean 'slurm.tasks_per_node'?"),
    ({"random": {"samples": 2, "params": {"lr": {"uniform": [0, 1]}}}}, "did you mean 'train.lr'?"),
    ({"grid": {"name": ["a", "b"]}}, "sweep.grid.name: cannot be swept"),
    ({"grid": {"train.lr": 0.1}}, "sweep.grid.train.lr: expected a non-empty list"),
    ({"grid": {"train.lr": []}}, "HINT: give at least one value"),
    ({"grid": {"train.lr": [0.1, -1]}}, "point 1 (train.lr=-1): train.lr: must be greater than 0"),
    ({"list": [{"train.lr": 0.1}, {"slurm.time": "99:99"}]},
     "point 1 (slurm.time='99:99'): slurm.time"),
    ({"list": {"train.lr": 0.1}}, "sweep.list: expected a list of mappings"),
    ({"list": [0.1]}, "sweep.list[0]: expected a mapping"),
    ({"grdi": {"train.lr": [0.1]}}, "sweep.grdi: unknown key. HINT: did you mean 'sweep.grid'?"),
    ({}, "sweep: no points"),
    ({"grid": {}}, "sweep: no points"),
    ({"random": {"samples": 0, "params": {"train.lr": {"uniform": [0, 1]}}}}, "samples"),
    ({"random": {"samples": 2, "seed": "x", "params": {"train.lr": {"uniform": [0, 1]}}}}, "seed"),
    ({"random": {"samples": 2, "params": {}}}, "no parameters"),
    ({"random": {"samples": 2, "params": {"train.lr": {"normal": [0, 1]}}}},
     "unknown distribution 'normal'"),
    ({"random": {"samples": 2, "params": {"train.lr": [0, 1]}}}, "expected one distribution"),
    ({"random": {"samples": 2, "params": {"train.lr": {"uniform": [1, 0]}}}}, "lo <= hi"),
    ({"random": {"samples": 2, "params": {"train.lr": {"loguniform": [0, 1]}}}}, "0 < lo"),
    ({"random": {"samples": 2, "params": {"train.seed": {"randint": [0, 1.5]}}}}, "two integers"),
    ({"random": {"samples": 2, "params": {"train.seed": {"choice": []}}}}, "non-empty list"),
    ({"random": {"samples": 1, "sed": 1, "params": {}}}, "did you mean 'sweep.random.seed'?"),
    ({"grid": {"train.lr": [0.1]}, "metric": {"name": "acc", "mode": "up"}}, "not min or max"),
    ({"grid": {"train.lr": [0.1]}, "metric": {"nam": "acc"}}, "did you mean 'sweep.metric.name'?"),
    ({"grid": {"train.lr": [0.1]}, "max_parallel": 0}, "sweep.max_parallel"),
    ({"grid": {"train.lr": [0.1]}, "max_parallel": True}, "sweep.max_parallel"),
    # The shape is the schema's: its messages, and the right key in the wrong section.
    ({"grid": {"train.lr": [0.1]}, "max_parallel": 0},
     "sweep.max_parallel: must be at least 1, got 0. HINT: leave it out for no limit"),
    ({"random": {"samples": 0, "params": {"train.lr": {"uniform": [0, 1]}}}},
     "sweep.random.samples: must be at least 1, got 0. HINT: e.g. samples: 16"),
    ({"random": {"params": {"train.lr": {"uniform": [0, 1]}}}},
     "sweep.random.samples: required key missing. HINT: e.g. samples: 16"),
    ({"random": {"samples": 2}}, "sweep.random.params: required key missing. HINT: e.g. params:"),
    ({"seed": 1, "grid": {"train.lr": [0.1]}},
     "sweep.seed: unknown key. HINT: did you mean 'sweep.random.seed'?"),
    ({"grid": {"train.lr": [0.1]}, "metric": {"name": 5}},
     "sweep.metric.name: expected a metric name, got integer 5. HINT: a key of metrics.jsonl"),
    ({"grid": {"train.lr": [0.1]}, "metric": {"mode": "up"}},
     "sweep.metric.mode: 'up' is not min or max. HINT: write mode: min"),
    ({"grid": {"train.lr": [0.1]}, "metric": "val_loss"}, "sweep.metric: expected a mapping"),
    ({"grid": {5: [0.1]}}, "sweep.grid: key 5 is not a string. HINT: e.g. train.lr"),
    ({"list": [{7: 1}]}, "sweep.list[0]: key 7 is not a string. HINT: e.g. train.lr"),
    ({"zzz": 1}, "sweep.zzz: unknown key. HINT: valid keys under 'sweep': grid, list, random, "
     "metric, max_parallel"),
    ({"x" * 500: 1}, f"sweep.{'x' * 60!r}... (500 characters): unknown key"),
    (None, "sweep: no points"),
]  # fmt: skip


@pytest.mark.parametrize(("sweep", "fragment"), SWEEP_ERRORS)
def test_bad_sweeps_name_the_sweep_file(tmp_path: Path, sweep: Any, fragment: str) -> None:
    path = _write_sweep(tmp_path, sweep, "../job.yaml")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert fragment in message
    assert "HINT:" in message


@pytest.mark.parametrize(
    ("base", "top", "fragment"),
    [
        ("missing.yaml", {}, "base: no such job file"),
        (5, {}, "base: expected a job file path or a mapping"),
        ("../job.yaml", {"sweeps": {}}, "sweeps: unknown key. HINT: did you mean 'sweep'?"),
        ("", {}, "base: expected a job file path or a mapping, got ''. HINT: base:"),
        # A job key is not a sweep-file key, even where a sweep's base would take it.
        (
            "../job.yaml",
            {"slurm": {}},
            "slurm: unknown key. HINT: valid keys at the top level: base, sweep",
        ),
    ],
)
def test_bad_sweep_top_level(tmp_path: Path, base: Any, top: dict[str, Any], fragment: str) -> None:
    path = _write_sweep(tmp_path, {"grid": {"train.lr": [0.1]}}, base, **top)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "expected a mapping of keys (base:, sweep:), got null. HINT: start the file with"),
        ("- base\n", "expected a mapping of keys (base:, sweep:), got a list."),
        ("sweep: {grid: {train.lr: [0.1]}}\n", "base: required key missing. HINT: base: path/"),
    ],
)
def test_a_sweep_file_that_is_not_one(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


def test_the_sweep_files_shape_is_checked_before_its_base_is_read(tmp_path: Path) -> None:
    path = _write_sweep(tmp_path, {"grdi": {"train.lr": [0.1]}}, "missing.yaml")
    with pytest.raises(ConfigError, match=r"sweep\.grdi: unknown key"):
        load_sweep(path)


def test_a_list_over_the_limit_is_refused_before_its_points_are_read(tmp_path: Path) -> None:
    path = _write_sweep(tmp_path, {"list": [0] * (MAX_SWEEP_POINTS + 1)})  # no point is valid
    with pytest.raises(ConfigError, match=r"sweep: 10,001 points \(sweep\.list 10,001\)"):
        load_sweep(path)


def test_the_sweep_schema_converts_a_sweep_file_into_its_dataclasses() -> None:
    doc = {
        "base": "job.yaml",
        "sweep": {
            "grid": {"train.lr": [0.1, 0.2], "env.modules": [["a", "b"]]},
            "list": [{"train.seed": 1}],
            "random": {"samples": 3, "params": {"train.seed": {"choice": [[1], 2]}}},
        },
    }
    out = SWEEP_SCHEMA.convert(doc, "s.yaml")
    assert out == SweepFile(
        base="job.yaml",
        sweep=SweepSection(
            grid=(("train.lr", (0.1, 0.2)), ("env.modules", (("a", "b"),))),
            list=((("train.seed", 1),),),
            random=RandomSpec(
                samples=3, params=(("train.seed", Distribution("choice", ((1,), 2))),)
            ),
        ),
    )
    assert out.sweep.metric == MetricSpec("val_loss", "min")
    assert out.sweep.random is not None
    assert out.sweep.random.seed == 0
    hash(out.sweep)  # lists became tuples


@pytest.mark.parametrize(
    "override",
    ["sweep.grid={train.lr: [0.1]}", "base=x.yaml", "sweep.max_parallel=2", "grid={a: [1]}"],
)
def test_a_sweep_key_is_never_a_job_key(tmp_path: Path, override: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\n")
    key = override.partition("=")[0]
    with pytest.raises(OverrideError, match=rf"{key.split('.')[0]}: unknown key\. HINT:"):
        load_job_config(job, [override])
    job.write_text(f"name: j\n{key.split('.')[0]}: {{}}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_job_config(job)


def test_sweep_without_sweep_section(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("base: {name: a}\n")
    with pytest.raises(ConfigError, match="sweep: required key missing"):
        load_sweep(path)


def test_bad_base_is_reported_against_the_base_file(tmp_path: Path) -> None:
    path = _write_sweep(tmp_path, {"grid": {"train.lr": [0.1]}}, "../job.yaml")
    (tmp_path / "job.yaml").write_text("name: b\ntrain: {lr: -1}\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{tmp_path / 'sweeps' / '..' / 'job.yaml'}: train.lr:")


def test_bad_cli_override_is_an_override_error(tmp_path: Path) -> None:
    path = _write_sweep(tmp_path, {"grid": {"train.lr": [0.1]}}, "../job.yaml")
    with pytest.raises(OverrideError, match=r"did you mean 'train\.lr'"):
        load_sweep(path, overrides=["train.lrr=1"])


@pytest.mark.parametrize(
    ("n", "size", "chunks"),
    [
        (0, 1001, []),
        (1, 1001, [(0, 1)]),
        (1001, 1001, [(0, 1001)]),  # indices 0..1000 all < MaxArraySize 1001
        (1002, 1001, [(0, 1001), (1001, 1002)]),
        (2500, 1000, [(0, 1000), (1000, 2000), (2000, 2500)]),
        (5, 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
    ],
)
def test_chunk_array(n: int, size: int, chunks: list[tuple[int, int]]) -> None:
    assert chunk_array(n, size) == chunks
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(n))  # contiguous, in order, nothing lost
    assert all(stop - start - 1 < size for start, stop in chunks)  # every task id is legal


@pytest.mark.parametrize(("n", "size"), [(-1, 10), (10, 0)])
def test_chunk_array_refuses_nonsense(n: int, size: int) -> None:
    with pytest.raises(ValueError, match=r"must be at least 1|negative"):
        chunk_array(n, size)


def test_thousand_points_expand_and_validate_quickly(tmp_path: Path) -> None:
    grid = {
        "train.lr": [0.1 * (i + 1) for i in range(10)],
        "train.batch_size": [2**i for i in range(10)],
        "train.seed": list(range(10)),
    }
    path = _write_sweep(tmp_path, {"grid": grid}, "../job.yaml")
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        spec = load_sweep(path)
        best = min(best, time.perf_counter() - start)
    assert len(spec.points) == 1000
    assert spec.points[999].config.train.seed == 9
    assert best < 1.0, f"expanding 1,000 points took {best:.3f} s"  # ~0.05 s on a laptop core


# --- params: the user's own values ---------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_the_byo_example_sweep_varies_params_lr_in_the_command() -> None:
    from hpc_ddp.config.params import resolve_command

    spec = load_sweep(REPO / "examples" / "byo" / "sweep.yaml")
    assert spec.base_source == str(REPO / "examples" / "byo" / "job.yaml")
    assert [p.overrides for p in spec.points] == [
        (("params.lr", 0.01),),
        (("params.lr", 0.003),),
        (("params.lr", 0.001),),
    ]
    argvs = []
    for point in spec.points:
        assert point.config.command is not None
        argvs.append(resolve_command(point.config.command, point.config.params))
    assert [argv[argv.index("--lr") + 1] for argv in argvs] == ["0.01", "0.003", "0.001"]
    assert (spec.metric, spec.mode, spec.max_parallel) == ("loss", "min", 2)


def test_a_sweep_may_set_params_the_base_lacks_at_any_depth(tmp_path: Path) -> None:
    spec = _sweep(
        tmp_path,
        {
            "grid": {"params.opt.lr": [0.1, 0.2], "params.tag": ["a"]},
            "list": [{"params.depth": 3}],
            "random": {"samples": 2, "params": {"params.wd": {"uniform": [0.0, 1.0]}}},
        },
    )
    assert [dict(p.config.params) for p in spec.points[:2]] == [
        {"opt": {"lr": 0.1}, "tag": "a"},
        {"opt": {"lr": 0.2}, "tag": "a"},
    ]
    assert spec.points[2].config.params == {"depth": 3}
    assert all(0.0 <= float(p.config.params["wd"]) <= 1.0 for p in spec.points[3:])  # type: ignore[arg-type]


def test_a_base_may_leave_the_params_its_command_names_to_the_points(tmp_path: Path) -> None:
    from hpc_ddp.config.params import resolve_command

    base = {"name": "b", "command": ["echo", "lr={params.lr}"]}
    spec = _sweep(tmp_path, {"grid": {"params.lr": [0.1, 0.2]}}, base=base)
    argvs = [resolve_command(p.config.command or (), p.config.params) for p in spec.points]
    assert argvs == [("echo", "lr=0.1"), ("echo", "lr=0.2")]


def test_a_command_placeholder_a_point_cannot_fill_names_the_point(tmp_path: Path) -> None:
    base = {"name": "b", "command": ["echo", "{params.lr}"]}
    with pytest.raises(ConfigError) as info:
        _sweep(tmp_path, {"grid": {"params.lrr": [0.1]}}, base=base)
    assert "point 0 (params.lrr=0.1): command[1]: {params.lr} names a param" in str(info.value)
    assert "(defined: params.lrr)" in str(info.value)


def test_a_typo_outside_params_is_still_caught_in_a_sweep(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"train\.lrr: unknown key. HINT: did you mean 'train\.lr'"
    ):
        _sweep(tmp_path, {"grid": {"train.lrr": [0.1]}})


# --- a grid from the command line (issue 32, item 5) ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "plain", "axes"),
    [
        # Hydra's form: a comma lists an axis's values, each read as YAML.
        (["train.lr=0.1,0.01", "train.seed=0,1"], [],
         [("train.lr", (0.1, 0.01)), ("train.seed", (0, 1))]),
        # No comma: a plain override, exactly as before.
        (["train.lr=0.1", "slurm.time=30"], ["train.lr=0.1", "slurm.time=30"], []),
        # A comma inside brackets, braces or quotes is no list of values.
        (["env.modules=[a,b]", "env.vars={A: 1,B: 2}", "train.tag='a,b'", 'x.y="c,d"'],
         ["env.modules=[a,b]", "env.vars={A: 1,B: 2}", "train.tag='a,b'", 'x.y="c,d"'], []),
        # An escaped comma stays in its value, in a plain override and in an axis alike.
        (["train.tag=a\\,b"], ["train.tag=a,b"], []),
        (["train.tag=a\\,b,c", "env.modules=[a,b],[c]"], [],
         [("train.tag", ("a,b", "c")), ("env.modules", (("a", "b"), ("c",)))]),
        # Strings are values too, read as YAML.
        (["train.optimizer=sgd,adamw"], [], [("train.optimizer", ("sgd", "adamw"))]),
    ],
)  # fmt: skip
def test_command_line_overrides_split_into_plain_ones_and_grid_axes(
    args: list[str], plain: list[str], axes: list[tuple[str, tuple[Any, ...]]]
) -> None:
    assert split_sweep_overrides(args) == (plain, axes)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["train.lr=0.1,"], "an empty value in the list"),
        (["train.lr=0.1,0.2", "train.lr=0.3,0.4"], "train.lr is swept twice on the command line"),
        (["train.lr=0.1,[1"], "'[1' is not a value"),
    ],
)
def test_a_bad_command_line_axis_names_the_argument(args: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        split_sweep_overrides(args)


def test_a_command_line_grid_over_a_plain_job_file(tmp_path: Path) -> None:
    """``hpc-ddp sweep job.yaml train.lr=0.1,0.01 train.seed=0,1``: the job file is the base
    of a 2x2 grid (the last key varying fastest), plain overrides apply under it."""
    job = tmp_path / "job.yaml"
    job.write_text("name: base\ntrain: {lr: 0.5, max_steps: 10}\nslurm: {partition: p}\n")
    plain, axes = split_sweep_overrides(
        ["train.lr=0.1,0.01", "train.seed=0,1", "train.max_steps=3"]
    )
    spec = load_sweep(job, plain, axes=axes)
    assert [p.overrides for p in spec.points] == [
        (("train.lr", 0.1), ("train.seed", 0)),
        (("train.lr", 0.1), ("train.seed", 1)),
        (("train.lr", 0.01), ("train.seed", 0)),
        (("train.lr", 0.01), ("train.seed", 1)),
    ]
    assert [p.config.name for p in spec.points] == ["base-0", "base-1", "base-2", "base-3"]
    assert {p.config.train.max_steps for p in spec.points} == {3}
    assert (spec.base_source, spec.metric, spec.mode, spec.max_parallel) == (
        str(job), "val_loss", "min", None
    )  # fmt: skip


def test_a_command_line_grid_crosses_a_sweep_files_points(tmp_path: Path) -> None:
    spec = _sweep(tmp_path, {"list": [{"train.lr": 0.3}, {"train.lr": 0.4}]},
                  axes=[("train.seed", (0, 1))])  # fmt: skip
    assert [p.overrides for p in spec.points] == [
        (("train.lr", 0.3), ("train.seed", 0)),
        (("train.lr", 0.3), ("train.seed", 1)),
        (("train.lr", 0.4), ("train.seed", 0)),
        (("train.lr", 0.4), ("train.seed", 1)),
    ]
    assert spec.points[3].config.train.seed == 1


def test_a_job_file_without_a_grid_is_refused_with_the_command_line_form(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: base\n")
    with pytest.raises(ConfigError, match=r"a job file, not a sweep file .* train\.lr=0\.1,0\.01"):
        load_sweep(job)
    with pytest.raises(ConfigError, match="did you mean"):
        load_sweep(job, axes=[("train.lrr", (0.1, 0.2))])
    with pytest.raises(ConfigError, match="name=a,b: cannot be swept"):
        load_sweep(job, axes=[("name", ("a", "b"))])


# --- the same point twice -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sweep", "said"),
    [
        ({"grid": {"train.lr": [0.1, 0.01, 0.1]}}, "points 0 and 2 are the same (train.lr=0.1)"),
        (
            {"grid": {"train.lr": [0.1, 0.01]}, "list": [{"train.lr": 0.01}]},
            "points 1 and 2 are the same (train.lr=0.01)",
        ),
        (
            {"list": [{"train.lr": 0.1, "train.seed": 1}, {"train.seed": 1, "train.lr": 0.1}]},
            "points 0 and 1 are the same (",
        ),
    ],
)
def test_a_point_given_twice_is_refused_naming_both(
    tmp_path: Path, sweep: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(said) + ".*HINT: list each value once"):
        _sweep(tmp_path, sweep)


def test_a_command_line_value_given_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: base\ntrain: {lr: 0.1, max_steps: 10}\n")
    _, axes = split_sweep_overrides(["train.lr=0.1,0.2,0.1"])
    with pytest.raises(ConfigError, match=r"points 0 and 2 are the same \(train\.lr=0\.1\)"):
        load_sweep(tmp_path / "job.yaml", axes=axes)


def test_values_of_different_types_and_random_repeats_are_not_duplicates(tmp_path: Path) -> None:
    spec = _sweep(tmp_path, {"grid": {"params.x": [1, 1.0, True, "1"]}})
    assert len(spec.points) == 4
    # Eight draws of a choice of two repeat by chance: that is not refused.
    drawn = _sweep(
        tmp_path,
        {"random": {"samples": 8, "params": {"train.optimizer": {"choice": ["sgd", "adamw"]}}}},
    )
    assert len({p.overrides for p in drawn.points}) < 8
