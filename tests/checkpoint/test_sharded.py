"""Sharded checkpoints of an FSDP model, on 2 real gloo ranks with the built-in trainer.

The promises: a run with ``train.strategy: fsdp`` stopped after step k and resumed from its
sharded checkpoint ends bit-identical to the uninterrupted run (the weights gathered whole to
compare), every rank having written only its own shard; and a step directory that is not
complete (a shard or ``.metadata`` missing, no digest record, a flipped byte) is never loaded:
the newest complete one before it is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.checkpoint.sharded import DIGESTS, check_complete, verify_files
from hpc_ddp.cli.main import main
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.checkpoints import SHARDED_METADATA, shard_dirs
from tests.helpers.launch import HELPERS, run_ranks
from tests.helpers.train_ranks import SMALL_RUN, train_argv, train_ranks

pytestmark = pytest.mark.torch

TRAIN: dict[str, Any] = {
    **SMALL_RUN,
    "optimizer": "adamw",  # per-parameter state (two moments and a step) to shard and reload
    "strategy": "fsdp",
}


def train(run_dir: Path, train: dict[str, Any], *stop: str) -> list[tuple[dict[str, Any], str]]:
    """:func:`train_ranks` with the time an FSDP run's saves and loads take."""
    return train_ranks(run_dir, train, *stop, timeout=240)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("fsdp-full")
    ranks = train(run_dir, TRAIN)
    assert ranks[0][0] == ranks[1][0]  # the whole weights gathered on every rank: the same
    return run_dir, ranks[0][0]


def test_every_rank_writes_its_own_shard_and_a_digest_record(
    uninterrupted: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, _ = uninterrupted
    checkpoints = run_dir / "checkpoints"
    assert [p.name for _, p in shard_dirs(checkpoints)] == [
        "step-00000020",
        "step-00000018",
        "step-00000012",  # keep_last 3: step 6 pruned
    ]
    assert not list(checkpoints.glob("*.pt"))  # no rank gathered the whole state into a file
    newest = checkpoints / "step-00000020"
    names = {p.name for p in newest.iterdir()}
    assert {SHARDED_METADATA, "__0_0.distcp", "__1_0.distcp", "common.pt", DIGESTS} <= names
    assert {"rank-00000.pt", "rank-00001.pt"} <= names
    record = check_complete(newest)
    assert (record["world_size"], record["step"]) == (2, 20)
    assert set(record["files"]) == names - {DIGESTS}
    verify_files(newest, record)
    assert (checkpoints / "latest").read_text() == "step-00000020\n"


@pytest.mark.parametrize(
    ("stop_at", "rank"),
    [pytest.param(5, 1, id="mid-epoch"), pytest.param(12, 0, id="right-after-a-checkpoint")],
)
def test_stop_and_resume_is_bit_identical(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]], stop_at: int, rank: int
) -> None:
    _, full = uninterrupted
    stopped = train(tmp_path, TRAIN, str(stop_at), str(rank), "SIGUSR2")
    expected = {"stopped": stop_at, "signal": int(signal.SIGUSR2), "code": 0}
    assert [r for r, _ in stopped] == [expected, expected]
    assert (tmp_path / "checkpoints" / f"step-{stop_at:08d}" / DIGESTS).is_file()

    resumed = train(tmp_path, TRAIN)
    assert f"resumed from sharded step-{stop_at:08d}" in resumed[0][1]
    assert resumed[0][0]["weights_digest"] == full["weights_digest"]
    assert resumed[1][0]["weights_digest"] == full["weights_digest"]
    assert resumed[0][0]["val_acc"] == full["val_acc"]


def _drop_shard(step_dir: Path) -> None:
    (step_dir / "__1_0.distcp").unlink()


def _drop_metadata(step_dir: Path) -> None:
    (step_dir / SHARDED_METADATA).unlink()


def _drop_record(step_dir: Path) -> None:
    (step_dir / DIGESTS).unlink()  # what a save killed before its commit would leave


def _flip_a_byte(step_dir: Path) -> None:
    shard = step_dir / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the digest can tell
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_drop_shard, id="a-shard-missing"),
        pytest.param(_drop_metadata, id="no-metadata"),
        pytest.param(_drop_record, id="no-digest-record"),
        pytest.param(_flip_a_byte, id="a-flipped-byte"),
    ],
)
def test_an_incomplete_step_is_never_loaded_the_one_before_is(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]], damage: Any
) -> None:
    """Step 20 damaged: the resume takes step 18, trains 2 steps and ends where the
    uninterrupted run ended (a load of the damaged step would end elsewhere, or fail)."""
    full_dir, full = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(full_dir, run_dir)
    newest = run_dir / "checkpoints" / "step-00000020"
    damage(newest)
    with pytest.raises(CheckpointError):
        verify_files(newest, check_complete(newest))
    # A save killed before its rename leaves a partial directory: never a candidate.
    shutil.copytree(run_dir / "checkpoints" / "step-00000018",
                    run_dir / "checkpoints" / ".partial-step-00000024")  # fmt: skip

    resumed = train(run_dir, TRAIN)
    err = resumed[0][1]
    assert "skipping checkpoint" in err
    assert "step-00000020" in err
    assert "resumed from sharded step-00000018" in err
    assert resumed[0][0]["weights_digest"] == full["weights_digest"]
    # The final save replaced the damaged directory with a complete one, and swept the
    # partial one away.
    verify_files(newest, check_complete(newest))
    assert not list((run_dir / "checkpoints").glob(".partial-*"))


def test_the_checkpoints_verb_lists_shard_sets_and_verify_checks_every_shard(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    full_dir, _ = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(full_dir, run_dir)
    _drop_shard(run_dir / "checkpoints" / "step-00000018")
    _flip_a_byte(run_dir / "checkpoints" / "step-00000020")

    def listed(*flags: str) -> tuple[int, list[tuple[str, str, str | None]], str]:
        code = main(["checkpoints", str(run_dir), "--json", *flags])
        out, err = capsys.readouterr()
        rows = json.loads(out)["checkpoints"]
        return code, [(Path(r["path"]).name, r["state"], r["error"]) for r in rows], err

    code, rows, _ = listed()
    assert code == 0
    assert rows == [
        ("step-00000012", "ok", None),
        ("step-00000018", "damaged", "__1_0.distcp is missing"),
        ("step-00000020", "ok", None),  # same size: only a digest tells
    ]
    code, rows, err = listed("--verify")
    assert code == 1
    assert rows[2] == ("step-00000020", "damaged", "__0_0.distcp changed on disk (its digest "
                       "differs)")  # fmt: skip
    assert "resume would use step-00000012" in err


def test_export_writes_the_whole_model_of_the_newest_verified_shard_set(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]]
) -> None:
    full_dir, full = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(full_dir, run_dir)
    out = tmp_path / "model.pt"
    assert main(["checkpoints", str(run_dir), "--export", str(out)]) == 0
    state = torch.load(out, weights_only=True)
    assert weights_digest(state) == full["weights_digest"]  # the run's final weights, whole
    _flip_a_byte(run_dir / "checkpoints" / "step-00000020")
    assert main(["checkpoints", str(run_dir), "--export", str(out), "--force"]) == 0
    assert weights_digest(torch.load(out, weights_only=True)) != full["weights_digest"]  # 18


def test_a_run_of_shard_sets_is_not_started_over_unsharded(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]]
) -> None:
    """The same run resumed with train.strategy: ddp finds no step-*.pt: it must say why, not
    train from step 0 beside the FSDP run's checkpoints."""
    full_dir, _ = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(full_dir, run_dir)
    argv = train_argv(run_dir, {**TRAIN, "strategy": "ddp"})
    for code, _, err in run_ranks(argv, 2, timeout=240):
        assert code != 0
        assert "holds sharded checkpoints (step-00000020/) of an FSDP model" in err


# --- a script of your own ----------------------------------------------------------------------

SCRIPT = str(HELPERS / "fsdp_script.py")


def script(
    run_dir: Path,
    total: int,
    slow_digest_s: float = 0.0,
    *,
    world: int = 2,
    accum: int = 1,
    best: bool = False,
) -> list[dict[str, Any]]:
    argv = [SCRIPT, str(run_dir), str(total), str(slow_digest_s), str(accum)]
    argv += ["best"] if best else []
    results = run_ranks(argv, world, timeout=240)
    out = []
    for rank, (code, stdout, stderr) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{stderr[-4000:]}"
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_own_script_saves_in_the_background_and_resumes_exactly(tmp_path: Path) -> None:
    """Each shard file's digest takes 1 s on the writer thread: the training thread's save at
    step 3 still returns at once (a copy into host buffers), and the checkpoint is complete
    when the session closes; a later run resumes from the last one."""
    first = script(tmp_path, 4, slow_digest_s=1.0)
    assert [r["step"] for r in first] == [4, 4]
    assert first[0]["digest"] == first[1]["digest"]
    assert max(r["stall_s"] for r in first) < 0.5
    for step in (3, 4):
        step_dir = tmp_path / "checkpoints" / f"step-{step:08d}"
        verify_files(step_dir, check_complete(step_dir))
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    saves = [e for e in ledger if e["event"] == "checkpoint"]
    assert [e["step"] for e in saves] == [3, 4]  # recorded once durable, by the writer thread
    assert saves[0]["stall_s"] < 0.5

    straight = script(tmp_path / "straight", 7)
    resumed = script(tmp_path, 7)
    assert [r["resumed_from"] for r in resumed] == [4, 4]
    assert resumed[0]["digest"] == straight[0]["digest"]


def test_a_resume_at_another_world_size_reshards_through_dcp(tmp_path: Path) -> None:
    """2 ranks' shards loaded by 1 rank (accumulating 2 micro-batches to keep the global
    batch): the whole weights it holds after the restore are those the 2 ranks ended with, and
    it trains on and saves its own shard set; 2 ranks then take that one back."""
    two = script(tmp_path, 4)
    one = script(tmp_path, 6, world=1, accum=2)
    assert one[0]["resumed_from"] == 4
    assert one[0]["restored"] == two[0]["digest"]
    assert check_complete(tmp_path / "checkpoints" / "step-00000006")["world_size"] == 1
    again = script(tmp_path, 6)
    assert [r["restored"] for r in again] == [one[0]["digest"]] * 2


def test_keep_best_spares_the_best_shard_set_across_a_resume(tmp_path: Path) -> None:
    """``keep_last: 1`` and ``keep_best`` on ``val_loss`` (best 0.5 at step 2), a shard set every
    step: pruning keeps step 2's beside the newest, and a resume goes on ranking against it
    (its 0.7 and 0.6 at steps 5 and 6 beat no 0.5), so step 2's is still kept at the end."""
    checkpoints = tmp_path / "checkpoints"
    first = script(tmp_path, 4, best=True)
    assert [r["step"] for r in first] == [4, 4]
    assert sorted(s for s, _ in shard_dirs(checkpoints)) == [2, 4]
    common = torch.load(checkpoints / "step-00000004" / "common.pt", weights_only=True)
    assert common["meta"]["best"] == {"metric": "val_loss", "mode": "min", "step": 2, "value": 0.5}

    resumed = script(tmp_path, 6, best=True)
    assert [r["resumed_from"] for r in resumed] == [4, 4]
    assert sorted(s for s, _ in shard_dirs(checkpoints)) == [2, 6]
    verify_files(checkpoints / "step-00000002", check_complete(checkpoints / "step-00000002"))


def _damage_every_set(run_dir: Path) -> None:
    for step_dir in sorted((run_dir / "checkpoints").glob("step-*")):
        _drop_shard(step_dir)


def _another_runs_sets(run_dir: Path) -> None:
    (run_dir / "run_id").write_text("20260101-000000-0123456789ab\n")  # made anew: not theirs


@pytest.mark.parametrize(
    ("unusable", "why"),
    [
        pytest.param(_damage_every_set, "__1_0.distcp is missing", id="all-damaged"),
        pytest.param(_another_runs_sets, "written by run", id="all-another-runs"),
    ],
)
def test_a_resume_with_no_usable_shard_set_refuses_to_start_over_and_prunes_nothing(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]], unusable: Any, why: str
) -> None:
    """Shard sets there, none usable: every rank fails with the error DDP's files give (not a
    fresh start from step 1 whose saves prune the old sets, which still hold intact shards)."""
    full_dir, _ = uninterrupted
    run_dir = tmp_path / "run"
    shutil.copytree(full_dir, run_dir)
    unusable(run_dir)
    before = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "checkpoints").rglob("*"))
    argv = train_argv(run_dir, {**TRAIN, "max_steps": 22})
    for code, _, err in run_ranks(argv, 2, timeout=240):
        assert code != 0
        assert "none of 3 sharded checkpoints loads (newest: step-00000020: " in err
        assert why in err
        assert "HINT: move the checkpoints directory aside" in err
    after = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "checkpoints").rglob("*"))
    assert after == before


def test_a_rank_passes_over_a_shard_set_whose_digest_record_is_a_fifo(tmp_path: Path) -> None:
    """A rank's restore read digests.json with open(): a FIFO there blocked it for ever."""
    script(tmp_path, 4, world=1)
    record = tmp_path / "checkpoints" / "step-00000004" / DIGESTS
    record.unlink()
    os.mkfifo(record)
    [(code, stdout, stderr)] = run_ranks([SCRIPT, str(tmp_path), "6", "0", "1"], 1, timeout=120)
    assert code == 0, stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1])["resumed_from"] == 3
    assert "digests.json is not a regular file (a FIFO)" in stderr


def test_a_save_rank_0_cannot_start_fails_every_rank_at_once(tmp_path: Path) -> None:
    """Rank 0 could not make the save's directory (here a file stands at its .partial- name):
    the others wrote without it and waited in DCP's collectives for rank 0, which never came,
    until fault.checkpoint_timeout_s (15 min). Every rank now fails with rank 0's error."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / ".partial-step-00000003").write_text("in the way")
    argv = [SCRIPT, str(tmp_path), "4", "0", "1"]
    for code, _, err in run_ranks(argv, 2, timeout=120):
        assert code != 0
        assert "saving step-00000003: rank 0: FileExistsError" in err
    assert not list(checkpoints.glob("step-*"))
