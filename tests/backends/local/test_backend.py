"""The local backend's login face (:mod:`hpc_ddp.backends.local.backend`): what it says of a
job that ended without a word in its ledger, from its tasks' result files and, failing them,
its rank logs, read as every backend reads them (:mod:`hpc_ddp.backends.ranklogs`)."""

from __future__ import annotations

from pathlib import Path

from hpc_ddp.backends.local.backend import LocalBackend


def test_startup_failure_names_the_lowest_rank_whose_log_ends_in_an_error(tmp_path: Path) -> None:
    (tmp_path / "launches").mkdir()  # supervised: the result files name no rank
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.err").write_text("rank 0/3\nUserWarning: only a note\n")
    (logs / "rank-2.err").write_text("ValueError: two\n")
    (logs / "rank-1.err").write_text("[rank1]: hpc-ddp run: error: bad. HINT: h\n")
    found = "rank-1.err: hpc-ddp run: error: bad. HINT: h"
    assert LocalBackend().startup_failure(tmp_path, "123") == found
    assert LocalBackend().startup_failure(tmp_path, None) == found


def test_startup_failure_is_silent_without_an_error_or_a_logs_directory(tmp_path: Path) -> None:
    assert LocalBackend().startup_failure(tmp_path, None) is None  # no logs/ at all
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.err").write_text("all good\n")
    assert LocalBackend().startup_failure(tmp_path, None) is None


def test_startup_failure_says_when_no_task_started(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.err").write_text("ValueError: not read\n")
    said = LocalBackend().startup_failure(tmp_path, "123")  # no result file, no task log
    assert said == "no task started (the controller ended before it started them)"
