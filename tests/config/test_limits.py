"""Resource bombs fail fast with a ConfigError that names the limit: alias bombs ("billion
laughs") in a job file, an override or a sweep, huge grids and sample counts, huge values, names,
integers and files. Each test bounds its time: without the limits these run for minutes or
exhaust memory; with them each must answer in well under a second (5 s leaves room for a busy
machine)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.config.load import job_config_from_dict, load_job_config
from hpc_ddp.config.schema import MAX_CONFIG_CHARS
from hpc_ddp.config.sweepfile import MAX_SWEEP_POINTS
from hpc_ddp.config.values import MAX_NAME_CHARS
from hpc_ddp.config.yaml_dialect import (
    MAX_DEPTH,
    MAX_EXPANDED_VALUES,
    MAX_FILE_BYTES,
    MAX_SCALAR_CHARS,
    parse_yaml,
)
from hpc_ddp.errors import ConfigError, OverrideError
from hpc_ddp.sweep.spec import load_sweep

FAST_S = 5.0
pytestmark = pytest.mark.timeout(60)  # a regression must fail, not hang the suite


@pytest.fixture
def quick() -> Callable[[], None]:
    """Call the yielded function at the end of the work to assert it was quick: this process's
    CPU time, which an exponential blow-up (billion laughs, deep recursion) multiplies."""
    start = (
        time.process_time()
    )  # CPU time: a busy machine (a parallel suite) slows the wall clock, not the work

    def check() -> None:
        elapsed = time.process_time() - start
        assert elapsed < FAST_S, f"took {elapsed:.1f} s"

    return check


def laughs(levels: int = 9, width: int = 9) -> str:
    """A flow-style "billion laughs" value: ``width ** levels`` strings from a few hundred
    bytes (9 levels of 9: 387,420,489)."""
    flow = "&l0 [" + ", ".join(['"lol"'] * width) + "]"
    for level in range(1, levels):
        flow = f"&l{level} [{flow}, " + ", ".join([f"*l{level - 1}"] * (width - 1)) + "]"
    return flow


def raises_config_error(fn: Callable[[], Any]) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    message = str(info.value)
    assert "HINT:" in message
    assert "Traceback" not in message
    return message


# --- alias bombs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [f"name: x\ncommand: {laughs()}\n", f"name: x\nenv: {{setup: {laughs()}}}\n"],
    ids=["command", "setup"],
)
def test_alias_bomb_in_a_job_file(tmp_path: Path, text: str, quick: Callable[[], None]) -> None:
    """Refused as the file is read, before any code can walk the expansion."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    message = raises_config_error(lambda: load_job_config(path))
    quick()
    assert message.startswith(f"{path}:")
    assert f"holds more than {MAX_EXPANDED_VALUES:,} values, over hpc-ddp's limit" in message
    assert "aliases expanded" in message


@pytest.mark.parametrize(
    "sweep",
    [
        f"grid: {{train.lr: [{laughs()}]}}",
        f"list: [{{env.setup: {laughs()}}}]",
        f"random: {{samples: 2, params: {{train.optimizer: {{choice: {laughs()}}}}}}}",
    ],
    ids=["grid", "list", "random-choice"],
)
def test_alias_bomb_in_a_sweep(tmp_path: Path, sweep: str, quick: Callable[[], None]) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {{name: b, train: {{max_steps: 1}}}}\nsweep:\n  {sweep}\n")
    message = raises_config_error(lambda: load_sweep(path))
    quick()
    assert f"holds more than {MAX_EXPANDED_VALUES:,} values" in message
    assert f"the anchor &l8 alone expands to more than {MAX_EXPANDED_VALUES:,}" in message


def test_alias_bomb_in_an_override(tmp_path: Path, quick: Callable[[], None]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n")
    with pytest.raises(OverrideError) as info:
        load_job_config(path, [f"env.setup={laughs()}"])
    quick()
    assert f"holds more than {MAX_EXPANDED_VALUES:,} values" in str(info.value)
    assert "HINT:" in str(info.value)


def test_sweep_alias_bomb_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quick: Callable[[], None]
) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {{name: b}}\nsweep:\n  grid: {{train.lr: [{laughs()}]}}\n")
    rc = main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    quick()
    captured = capsys.readouterr()
    assert rc == 2
    assert "over hpc-ddp's limit" in captured.err
    assert captured.out == ""
    assert not (tmp_path / "runs").exists()


def test_small_reused_anchors_are_fine(tmp_path: Path) -> None:
    """Aliases as people use them: a shared list, merged defaults."""
    data = parse_yaml(
        "base: &b {name: x, train: {lr: 0.1}}\nsweep:\n  list: [{<<: *b}, {<<: *b, seed: 1}]\n",
        "t",
    )
    assert data["sweep"]["list"][1] == {"name": "x", "train": {"lr": 0.1}, "seed": 1}


DEEP_BY_ALIASES = "".join(
    f"a{i}: &a{i} [[[[*a{i - 1}]]]]\n" if i else "a0: &a0 [x]\n" for i in range(12)
)  # a{i} is 2 + 4 i levels deep once expanded: a11 is 46 deep, from lines 4 levels deep


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("command: &a [x, *a]\n", "*a is used inside its own anchor &a"),
        ("train: &t {more: *t}\n", "*t is used inside its own anchor &t"),
        ("command: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n", "nested more than"),
        ("command: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        (DEEP_BY_ALIASES, "nested more than"),
    ],
    ids=["self-list", "self-mapping", "deep", "very-deep", "deep-by-aliases"],
)
def test_cycles_and_depth(text: str, fragment: str, quick: Callable[[], None]) -> None:
    message = raises_config_error(lambda: parse_yaml(f"name: x\n{text}", "j.yaml"))
    quick()
    assert message.startswith("j.yaml")
    assert fragment in message


def test_nesting_up_to_the_limit_is_fine() -> None:
    depth = MAX_DEPTH - 1  # the top-level mapping is one level
    assert parse_yaml("command: " + "[" * depth + "]" * depth, "t")
    assert parse_yaml("".join(DEEP_BY_ALIASES.splitlines(keepends=True)[:7]), "t")  # 1 + 26


# --- sweep size ---------------------------------------------------------------------------------


def _sweep_file(tmp_path: Path, sweep: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {{name: b, train: {{max_steps: 1}}}}\nsweep:\n{sweep}")
    return path


def test_ten_million_point_grid_is_refused_before_expanding(
    tmp_path: Path, quick: Callable[[], None]
) -> None:
    axes = "".join(f"    train.{k}: [{', '.join(str(i + 1) for i in range(10))}]\n"
                   for k in ("max_steps", "seed", "batch_size", "grad_accum", "log_every",
                             "keep_last", "num_workers"))  # fmt: skip
    path = _sweep_file(tmp_path, f"  grid:\n{axes}")
    message = raises_config_error(lambda: load_sweep(path))
    quick()
    assert "10,000,000 points (sweep.grid 10,000,000)" in message
    assert f"limit of {MAX_SWEEP_POINTS:,} points per sweep" in message


def test_hundred_million_random_samples_are_refused_before_drawing(
    tmp_path: Path, quick: Callable[[], None]
) -> None:
    path = _sweep_file(
        tmp_path,
        "  random: {samples: 100000000, params: {train.lr: {uniform: [0.01, 0.1]}}}\n",
    )
    message = raises_config_error(lambda: load_sweep(path))
    quick()
    assert "100,000,000 points (sweep.random.samples 100,000,000)" in message


def test_the_limit_counts_all_kinds_together(tmp_path: Path) -> None:
    grid = ", ".join(str(i) for i in range(100))
    path = _sweep_file(
        tmp_path,
        f"  grid: {{train.seed: [{grid}], train.max_steps: [{grid.replace('0, ', '', 1)}]}}\n"
        "  list: [{train.lr: 0.5}]\n"
        "  random: {samples: 101, params: {train.lr: {uniform: [0.01, 0.1]}}}\n",
    )
    # 100 * 99 = 9,900 grid points + 1 listed + 101 samples = 10,002.
    message = raises_config_error(lambda: load_sweep(path))
    assert "10,002 points (sweep.grid 9,900, sweep.list 1, sweep.random.samples 101)" in message


def test_a_sweep_of_exactly_the_limit_expands(tmp_path: Path) -> None:
    grid = ", ".join(str(i + 1) for i in range(100))
    path = _sweep_file(tmp_path, f"  grid: {{train.seed: [{grid}], train.max_steps: [{grid}]}}\n")
    spec = load_sweep(path)
    assert len(spec.points) == MAX_SWEEP_POINTS
    assert spec.points[-1].config.train.max_steps == 100


# --- big values, names, integers, files ---------------------------------------------------------


def test_a_huge_value_is_never_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quick: Callable[[], None]
) -> None:
    big = "p" * (MAX_SCALAR_CHARS + 1)
    rc = main(["submit", "jobs/quickstart.yaml", f"slurm.partition={big}", "--dry-run",
               "--runs-dir", str(tmp_path)])  # fmt: skip
    quick()
    captured = capsys.readouterr()
    assert rc == 2
    assert "#SBATCH" not in captured.out
    assert f"limit of {MAX_SCALAR_CHARS:,} characters" in captured.err
    assert len(captured.err) < 1000  # the message quotes the value, it does not repeat it


def test_a_fifty_megabyte_value_from_python_is_refused(quick: Callable[[], None]) -> None:
    data = {"name": "x", "slurm": {"partition": "p" * 50_000_000}}
    message = raises_config_error(lambda: job_config_from_dict(data, "api"))
    quick()
    assert "slurm.partition: 'pppp" in message
    assert "(50,000,000 characters) is over hpc-ddp's limit" in message
    assert len(message) < 1000


def test_a_value_over_the_limit_in_a_file_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: x\nenv:\n  setup: ['{'e' * (MAX_SCALAR_CHARS + 1)}']\n")
    message = raises_config_error(lambda: load_job_config(path))
    assert message.startswith(f"{path}:3:")
    assert f"has {MAX_SCALAR_CHARS + 1:,} characters" in message
    path.write_text(f"name: x\nenv:\n  setup: ['{'e' * MAX_SCALAR_CHARS}']\n")
    assert load_job_config(path).env.setup == ("e" * MAX_SCALAR_CHARS,)


def test_a_file_over_the_limit_is_not_even_parsed(
    tmp_path: Path, quick: Callable[[], None]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n" + "# padding\n" * (MAX_FILE_BYTES // 10 * 50))  # 50 MB
    message = raises_config_error(lambda: load_job_config(path))
    quick()
    assert f"larger than {MAX_FILE_BYTES:,} bytes" in message


def test_a_directory_is_not_a_job_file(tmp_path: Path) -> None:
    message = raises_config_error(lambda: load_job_config(tmp_path))
    assert "is a directory" in message


@pytest.mark.parametrize(
    ("length", "ok"), [(MAX_NAME_CHARS, True), (MAX_NAME_CHARS + 1, False), (5000, False)]
)
def test_long_names_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], length: int, ok: bool
) -> None:
    argv = ["submit", "jobs/quickstart.yaml", f"name={'n' * length}", "--dry-run",
            "--runs-dir", str(tmp_path)]  # fmt: skip
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == (0 if ok else 2), err
    if not ok:
        assert f"limit of {MAX_NAME_CHARS} characters for a job name" in err
        assert "HINT:" in err


def test_a_five_thousand_digit_integer(tmp_path: Path, quick: Callable[[], None]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: x\ntrain:\n  max_steps: {'9' * 5000}\n")
    message = raises_config_error(lambda: load_job_config(path))
    quick()
    assert message.startswith(f"{path}:3:14: an integer has 5,000 digits")
    path.write_text("name: x\n")
    with pytest.raises(OverrideError, match="an integer has 5,000 digits"):
        load_job_config(path, [f"train.seed={'9' * 5000}"])


def test_a_config_too_big_as_a_whole_names_the_biggest_key() -> None:
    line = "e" * 8000
    data: dict[str, Any] = {"name": "x", "env": {"setup": [line] * 9}}  # 72,000 characters
    message = raises_config_error(lambda: job_config_from_dict(data, "api"))
    assert message.startswith("api: env: the config's values hold")
    assert f"limit of {MAX_CONFIG_CHARS:,} for one job" in message
    data["env"]["setup"] = [line] * 7
    assert len(job_config_from_dict(data, "api").env.setup) == 7


def test_the_expansion_limits_without_aliases_and_in_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hpc_ddp.config.yaml_dialect.MAX_EXPANDED_VALUES", 10)
    assert parse_yaml("[1, 2, 3, 4, 5, 6, 7, 8, 9]", "t") == list(range(1, 10))  # 10 values
    message = raises_config_error(lambda: parse_yaml("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "t"))
    assert message == (
        "t:1:1: the document holds more than 10 values, over hpc-ddp's limit. HINT: is it the "
        "right file? Split a very large sweep into several sweep files"
    )
    monkeypatch.setattr("hpc_ddp.config.yaml_dialect.MAX_EXPANDED_VALUES", 1000)
    monkeypatch.setattr("hpc_ddp.config.yaml_dialect.MAX_EXPANDED_CHARS", 100)
    text = f"a: &s {'x' * 30}\nb: &l [1, 2, 3, 4, 5, 6]\nc: [*s, *s, *s, *l]\n"  # 124 chars
    message = raises_config_error(lambda: parse_yaml(text, "t"))
    assert "with its aliases expanded, the document holds more than 100 characters" in message
    assert "the anchor &s alone expands to 30 characters" in message
