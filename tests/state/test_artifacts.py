"""A run's files judged without torch: metrics lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.state.artifacts import last_metric

STAMP = "20260101-120000"


# --- metrics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([b'{"loss": 1.0}', b'{"loss": 0.5}'], 0.5),
        ([b'{"loss": 1.0}', b'{"loss": 0.'], 1.0),  # torn last line
        ([b'{"loss": 1.0}', b"\xff\xfe\x00\x01binary\x80"], 1.0),
        ([b'{"loss": 1.0}', b"3", b"[1, 2]", b'"loss"', b"null", b'{"acc": 2}'], 1.0),
        ([b'"loss"'], None),  # a bare string is not a row, even if it spells the key
        ([b"\x00" * 64], None),
        ([], None),
    ],
)
def test_last_metric_skips_every_line_that_is_not_a_row(
    tmp_path: Path, lines: list[bytes], expected: float | None
) -> None:
    paths = RunPaths(tmp_path)
    paths.metrics.write_bytes(b"\n".join(lines) + b"\n")
    assert last_metric(paths, "loss") == expected


def test_last_metric_skips_a_line_nested_too_deep_to_parse(tmp_path: Path) -> None:
    # json.loads raises RecursionError (not ValueError) on absurd nesting: still just a bad line.
    paths = RunPaths(tmp_path)
    paths.metrics.write_text('{"loss": 2.0}\n' + "[" * 200_000 + "\n")
    assert last_metric(paths, "loss") == 2.0


def test_last_metric_without_a_file_is_none(tmp_path: Path) -> None:
    assert last_metric(RunPaths(tmp_path), "loss") is None


def test_unreadable_metrics_is_a_run_dir_error(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.metrics.mkdir()
    with pytest.raises(RunDirError, match=r"unreadable metrics .*HINT:"):
        last_metric(paths, "loss")
