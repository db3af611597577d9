"""An FSDP run's shard sets, judged without torch: ``status``, the ``resume`` plan and the
supervisor count a ``step-N/`` as a checkpoint only when the ranks would load it.

The ranks check a set before they hash it (:func:`hpc_ddp.checkpoint.sharded.check_complete`):
a digest record of this format, listing ``.metadata``, ``common.pt``, a ``rank-*.pt`` and a
shard per rank of its world size, every listed file a regular file of its recorded size, the
record's step the name's. The torch-free listing (:func:`shard_set_record`,
:func:`damaged_shard_set`, :func:`newest_step`) makes the same check, and reads ``common.pt``'s
label for its step and run; none of it ever opens a FIFO.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_ddp.rundir.checkpoints import (
    damaged_shard_set,
    newest_step,
    shard_sets,
)

RUN = "20261128-120000-aaaaaaaaaaaa"


def shard_set(
    directory: Path,
    step: int,
    *,
    world: int = 2,
    run_id: str | None = RUN,
    holds: int | None = None,
) -> Path:
    """A ``step-N/`` laid out as a committed shard set of ``world`` ranks (made-up bytes; its
    ``common.pt`` a zip whose pickle carries the label, as ``torch.save``'s does), holding step
    ``holds`` (default: its name's)."""
    path = directory / f"step-{step:08d}"
    path.mkdir(parents=True)
    contents = {".metadata": b"m" * 11}
    for rank in range(world):
        contents[f"__{rank}_0.distcp"] = b"s" * (100 + rank)
        contents[f"rank-{rank:05d}.pt"] = b"r" * 7
    for name, data in contents.items():
        (path / name).write_bytes(data)
    label = {"progress": {"step": step if holds is None else holds}, "meta": {"run_id": run_id}}
    with zipfile.ZipFile(path / "common.pt", "w") as z:
        z.writestr("common/data.pkl", pickle.dumps(label, protocol=2))
    files = {p.name: {"size": p.stat().st_size, "xxh3": "0" * 32} for p in sorted(path.iterdir())}
    record = {"format": "hpc-ddp-sharded", "version": 1, "step": step, "world_size": world,
              "digest": "xxh3-128", "files": files}  # fmt: skip
    (path / "digests.json").write_text(json.dumps(record))
    return path


def _edit_record(path: Path, edit: Callable[[dict[str, object]], None]) -> None:
    record = json.loads((path / "digests.json").read_text())
    edit(record)
    (path / "digests.json").write_text(json.dumps(record))


def _no_record(path: Path) -> None:
    (path / "digests.json").unlink()


def _record_a_fifo(path: Path) -> None:
    (path / "digests.json").unlink()
    os.mkfifo(path / "digests.json")


def _shard_a_fifo(path: Path) -> None:
    (path / "__1_0.distcp").unlink()
    os.mkfifo(path / "__1_0.distcp")


def _shard_missing(path: Path) -> None:
    (path / "__1_0.distcp").unlink()


def _shard_cut(path: Path) -> None:
    (path / "__0_0.distcp").write_bytes(b"s" * 50)


def _another_format(path: Path) -> None:
    _edit_record(path, lambda r: r.update(format="something-else"))


def _a_rank_unlisted(path: Path) -> None:
    _edit_record(path, lambda r: r.update(world_size=3))


def _another_step(path: Path) -> None:
    _edit_record(path, lambda r: r.update(step=10))


def _absurd_world(path: Path) -> None:
    _edit_record(path, lambda r: r.update(world_size=10**12))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "an-absurd-world-size": (_absurd_world, "the record lists 6 files for 1000000000000 ranks"),
    "no-record": (_no_record, "no digests.json (an unfinished save)"),
    "record-a-fifo": (_record_a_fifo, "digests.json is not a regular file (a FIFO)"),
    "record-of-another-format": (_another_format, "digests.json is not an hpc-ddp-sharded"),
    "a-rank-unlisted": (_a_rank_unlisted, "the record lists no rank-00002.pt, __2_*.distcp"),
    "record-of-another-step": (_another_step, "holds step 10, not its name's"),
    "a-shard-missing": (_shard_missing, "__1_0.distcp is missing"),
    "a-shard-cut": (_shard_cut, "__0_0.distcp has 50 bytes, 100 were written"),
    "a-shard-a-fifo": (_shard_a_fifo, "__1_0.distcp is not a regular file (a FIFO)"),
}


def _in_time(work: Callable[[], object]) -> object:
    """``work()`` in a thread: a blocked open() fails the test, not the suite."""
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(work()), daemon=True)
    worker.start()
    worker.join(10)
    assert got, "still blocked after 10 s (an open() of a FIFO?)"
    return got[0]


def test_a_whole_shard_set_is_a_checkpoint(tmp_path: Path) -> None:
    path = shard_set(tmp_path, 20)
    assert damaged_shard_set(path) is None
    assert damaged_shard_set(path, RUN) is None
    assert [s for s, _ in shard_sets(tmp_path)] == [20]
    assert newest_step(tmp_path, run_id=RUN) == 20


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_shard_set_the_ranks_would_skip_is_passed_over_for_the_one_before(
    tmp_path: Path, damage: str
) -> None:
    """Step 30 damaged: status and the resume plan name step 20, as the ranks will load it
    (they counted step 30 whenever its digests.json existed), and say why."""
    shard_set(tmp_path, 20)
    newest = shard_set(tmp_path, 30)
    make, reason = DAMAGE[damage]
    make(newest)
    assert reason in str(_in_time(lambda: damaged_shard_set(newest)))
    skipped: list[tuple[int, str]] = []

    def skip(step: int, why: str) -> None:
        skipped.append((step, why))

    found = _in_time(lambda: newest_step(tmp_path, run_id=RUN, on_skip=skip))
    assert found == 20
    assert [s for s, _ in skipped] == [30]
    assert reason in skipped[0][1]
    assert _in_time(lambda: [s for s, _ in shard_sets(tmp_path)]) == [20]


def test_a_shard_set_of_another_run_or_holding_another_step_is_not_this_runs(
    tmp_path: Path,
) -> None:
    shard_set(tmp_path, 10)
    shard_set(tmp_path, 20, holds=12)
    theirs = shard_set(tmp_path, 30, run_id="20261128-130000-bbbbbbbbbbbb")
    why = damaged_shard_set(theirs, RUN)
    assert why == f"written by run 20261128-130000-bbbbbbbbbbbb, not by this run ({RUN})"
    assert damaged_shard_set(theirs) is None  # no run to compare with
    assert damaged_shard_set(tmp_path / "step-00000020") == (
        "named step 20 but holds step 12 (copied or renamed)"
    )
    assert newest_step(tmp_path, run_id=RUN) == 10
