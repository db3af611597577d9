"""``hpc-ddp resume RUN_DIR``: a stopped run goes on from its newest
good checkpoint in the same run directory; a live one is never submitted twice.

The decision table is pure (:mod:`hpc_ddp.state.resumable`); the rest runs for real: a local
run cancelled and resumed, and on the dev cluster a cancelled run resumed to the very weights
of an uninterrupted run, and a run whose requeue budget ran out resumed with a larger budget.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.registry import Registry
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.state.resumable import ENDED_UNFINISHED, check_resumable
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster

QUICK = ["train.epochs=2", "train.log_every=1", "train.checkpoint_every=5"]


# --- the decision ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "force", "allowed", "forceable", "says"),
    [
        ("FAILED", False, True, False, ""),
        ("CANCELLED", False, True, False, ""),
        ("INCOMPLETE", False, True, False, ""),
        ("TIMEOUT", False, True, False, ""),
        ("NODE_FAIL", False, True, False, ""),
        ("GONE?", False, True, False, ""),
        ("COMPLETED", False, False, True, "already finished training"),
        ("COMPLETED", True, True, False, ""),
        ("RUNNING?", False, False, True, "could not confirm"),
        ("RUNNING?", True, True, False, ""),
        ("RUNNING", False, False, False, "still RUNNING"),
        ("RUNNING", True, False, False, "still RUNNING"),  # --force never doubles a live job
        ("PENDING", True, False, False, "hpc-ddp cancel"),
        ("REQUEUED", True, False, False, "two jobs must never write one run directory"),
        ("DAMAGED", True, False, False, "cannot be resubmitted"),
    ],
)
def test_which_states_may_be_resumed(
    state: str, force: bool, allowed: bool, forceable: bool, says: str
) -> None:
    check = check_resumable(state, "runs/x", "42", force=force)
    assert (check.refusal is None) == allowed
    assert check.forceable == forceable
    assert says in (check.refusal or "")
    if check.refusal:
        assert "HINT:" in check.refusal


def test_every_finished_slurm_state_but_completed_is_resumable_as_is() -> None:
    assert {"FAILED", "TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY", "CANCELLED"} <= ENDED_UNFINISHED
    assert "COMPLETED" not in ENDED_UNFINISHED


# --- the CLI, locally ------------------------------------------------------------------------


def local_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}


def hpc(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=REPO, env=local_env(), capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def test_resume_needs_a_run_directory(tmp_path: Path) -> None:
    done = hpc("resume", str(tmp_path))
    assert done.returncode == 2
    assert "no manifest.json" in done.stderr
    gone = hpc("submit", "jobs/quickstart.yaml", "--resume", str(tmp_path))
    assert gone.returncode == 2  # one verb resumes: `submit --resume` is no more
    assert "unrecognized arguments: --resume" in gone.stderr


def test_a_sweep_is_pointed_at_resubmit_failed(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "tasks" / "0").mkdir(parents=True)
    (sweep / "manifest.json").write_text("{}")
    for target in (sweep, sweep / "tasks" / "0"):
        done = hpc("resume", str(target))
        assert done.returncode == 2
        assert f"--resubmit-failed {sweep}" in done.stderr


STEPS_PER_EPOCH = 4096 // (64 * 2)
"""jobs/quickstart.yaml: 4096 samples, batch 64, 2 ranks."""


@pytest.mark.torch
def test_a_cancelled_local_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with (tmp_path / "err").open("w") as err:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend",
             "local", "--wait", "--runs-dir", str(runs), "train.epochs=50", "train.log_every=1",
             "train.checkpoint_every=5"],
            cwd=REPO, env=local_env(), stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        run_dir = e2e.wait_for("run dir", lambda: next(runs.glob("*/manifest.json"), None)).parent
        e2e.wait_checkpoint(run_dir, 10, timeout_s=180)
        first_job = read_manifest(run_dir).job_id
        live = hpc("resume", str(run_dir))
        assert live.returncode == 2, live.stdout
        assert "still RUNNING" in live.stderr
        assert hpc("cancel", str(run_dir)).returncode == 0
        assert waiter.wait(timeout=120) == 1
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    # Fewer epochs than asked at first: the resumed attempt finishes soon after its checkpoint
    # (the first epoch that ends past it: a total below the checkpoint's step is refused).
    saved = max(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*.pt"))
    epochs = saved // STEPS_PER_EPOCH + 1
    done = hpc("resume", str(run_dir), f"train.epochs={epochs}", "--wait")
    assert done.returncode == 0, done.stderr
    assert "from checkpoint step" in done.stdout
    assert f"changed: train.epochs: 50 -> {epochs}" in done.stdout
    manifest = read_manifest(run_dir)
    assert manifest.previous_jobs == [first_job]
    assert manifest.job_id != first_job
    first, second = e2e.ledger(run_dir)
    assert first.cause is EndCause.CANCELLED
    assert (second.resumed_from_step or 0) >= 10
    assert second.cause is EndCause.FINISHED
    [row] = json.loads(hpc("status", str(run_dir), "--json").stdout)["runs"]
    assert row["state"] == "COMPLETED"
    finished = hpc("resume", str(run_dir))
    assert finished.returncode == 2
    assert "already finished training" in finished.stderr


# --- on the dev cluster ----------------------------------------------------------------------


def _resume(cluster: Cluster, run_dir: Path, *args: str) -> dict[str, Any]:
    out = e2e.hpc(cluster, "resume", str(run_dir), *args, "--json")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.mark.slurm
@pytest.mark.torch
def test_a_cancelled_slurm_run_resumes_to_the_uninterrupted_weights(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    # Paced steps (0.16 s each, ~10 s in all): the whole run must not finish between its
    # step-10 checkpoint and the cancel, however idle the machine is.
    paced = [*QUICK, "train.dataset=tests.e2e_util:io_bound_synthetic"]
    ref = e2e.submit(slurm_cluster, tmp_path / "ref", "jobs/quickstart.yaml", *paced)
    job = e2e.submit(slurm_cluster, tmp_path / "run", "jobs/quickstart.yaml", *paced)
    e2e.wait_checkpoint(job.run_dir, 10)
    refused = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), check=False)
    assert refused.returncode == 2
    assert "two jobs must never write one run directory" in refused.stderr
    e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "CANCELLED"
    dry = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "--dry-run")
    assert "#SBATCH" in dry.stdout
    assert read_manifest(job.run_dir).job_id == job.job_id  # a dry run submits nothing
    again = _resume(slurm_cluster, job.run_dir)
    assert again["run_dir"] == str(job.run_dir)
    assert e2e.wait_done(slurm_cluster, again["job_id"])["JobState"] == "COMPLETED"
    assert e2e.wait_done(slurm_cluster, ref.job_id)["JobState"] == "COMPLETED"
    assert e2e.final_digest(slurm_cluster, job.run_dir) == e2e.final_digest(
        slurm_cluster, ref.run_dir
    )
    row = e2e.status(slurm_cluster, job.run_dir)
    assert (row["state"], row["job_id"], row["causes"]) == (
        "COMPLETED",
        again["job_id"],
        ["cancelled", "finished"],
    )
    second = row["attempt_list"][1]
    assert read_manifest(job.run_dir).previous_jobs == [job.job_id]
    assert e2e.ledger(job.run_dir)[1].resumed_from_step == e2e.ledger(job.run_dir)[0].steps_done
    assert second["steps_done"] == 64


@pytest.mark.slurm
@pytest.mark.torch
def test_a_run_out_of_requeues_resumes_with_a_larger_budget(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = e2e.submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", *QUICK, "requeue.max_requeues=0"
    )
    e2e.wait_step(job.run_dir, 10)
    slurm_cluster.run("scancel", "--signal=USR2", job.job_id)
    e2e.wait_done(slurm_cluster, job.job_id)
    [attempt] = e2e.ledger(job.run_dir)
    assert attempt.cause is EndCause.BUDGET_EXHAUSTED
    again = _resume(slurm_cluster, job.run_dir, "requeue.max_requeues=2")
    assert e2e.wait_done(slurm_cluster, again["job_id"])["JobState"] == "COMPLETED"
    first, second = e2e.ledger(job.run_dir)
    assert second.resumed_from_step == first.steps_done
    assert second.steps_done == 64
    assert "max_requeues: 2" in (job.run_dir / "config.yaml").read_text()


@pytest.mark.slurm
@pytest.mark.torch
def test_a_crashed_slurm_run_resumes_after_the_fix_to_the_uninterrupted_weights(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """A crash (rank 1 raises at step 8, requeue.on_crash off) ends the job FAILED with the
    step-5 checkpoint; `hpc-ddp resume RUN_DIR` with the fix (here: the param that injected
    the crash) goes on from that checkpoint to the weights of a run that never crashed."""
    config = e2e.crashy_job(
        tmp_path, 30, 5, "{params.crash_at}", on_crash=False, extra="params: {crash_at: 8}\n"
    )
    ref = e2e.submit(slurm_cluster, tmp_path / "ref", str(config), "params.crash_at=0")
    job = e2e.submit(slurm_cluster, tmp_path / "run", str(config))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0")
    [crashed] = e2e.ledger(job.run_dir)
    assert (crashed.cause, crashed.requeue_requested) == (EndCause.CRASH, False)
    assert crashed.checkpoint == "step-00000005.pt"
    assert crashed.message is not None
    assert f"`hpc-ddp resume {job.run_dir}`" in crashed.message  # the hint says how
    assert e2e.status(slurm_cluster, job.run_dir)["state"] == "FAILED"

    again = _resume(slurm_cluster, job.run_dir, "params.crash_at=0")
    assert again["run_dir"] == str(job.run_dir)
    assert e2e.wait_done(slurm_cluster, again["job_id"], timeout_s=300)["JobState"] == "COMPLETED"
    assert e2e.wait_done(slurm_cluster, ref.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    first, second = e2e.ledger(job.run_dir)
    assert first.cause is EndCause.CRASH
    assert (second.resumed_from, second.resumed_from_step) == ("step-00000005.pt", 5)
    assert (second.cause, second.steps_done) == (EndCause.FINISHED, 30)
    assert read_manifest(job.run_dir).previous_jobs == [job.job_id]
    assert e2e.final_digest(slurm_cluster, job.run_dir) == e2e.final_digest(
        slurm_cluster, ref.run_dir
    )
    assert e2e.status(slurm_cluster, job.run_dir)["causes"] == ["crash", "finished"]


# --- a local run's dry run, and what the resume message claims -------------------------------


def _ended_local_run(runs: Path) -> Path:
    """A local run whose job is gone (its pid: the largest Linux has) with a checkpoint at 32
    that looks whole to the login side (a zip archive: only torch could tell its weights)."""
    from hpc_ddp.config.load import load_job_config
    from hpc_ddp.submission.submit import materialize, prepare, record

    config = REPO / "jobs" / "quickstart.yaml"
    cfg = load_job_config(config, [], site_profile=None)
    prepared = materialize(
        prepare(cfg, backend=Registry().backend("local"), config_path=config, runs_dir=runs,
                python=sys.executable, invocation=["hpc-ddp", "submit"])
    )  # fmt: skip
    record(prepared, job_id="4194304", command=["submitit-local", "4194304"])
    prepared.paths.checkpoints.mkdir(exist_ok=True)
    _looks_whole(prepared.paths.checkpoints / "step-00000032.pt", 32)
    return prepared.paths.root


def _looks_whole(path: Path, step: int) -> None:
    """A zip archive whose pickle says ``step`` and nothing else: all the login side reads of
    a checkpoint (only torch could tell its weights)."""
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"progress": {"step": step}, "meta": {}}))


def test_a_local_resume_dry_run_shows_the_local_backend_and_claims_no_verified_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ddp.cli.main import main

    run_dir = _ended_local_run(tmp_path)
    assert main(["resume", str(run_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "from checkpoint step 32 (the newest on disk; the job verifies its digests" in out
    assert "falls back to an older checkpoint if any part is damaged" in out
    assert "damaged); bit-identical to an uninterrupted run (CPU)\n" in out  # how exact
    assert "# backend: local; would start 2 process(es) on this machine" in out
    assert "sbatch" not in out
    assert "#SBATCH" not in out
    assert main(["resume", str(run_dir), "slurm.nodes=1000", "--dry-run"]) == 2
    assert "= 1000 local processes" in capsys.readouterr().err
    assert "slurm:\n  nodes: 2\n" in (run_dir / "config.yaml").read_text()  # nothing written


# --- the Slurm side of the verb, over the shipped FakeSlurm ------------------------------------


def _slurm_run(runs: Path, job_id: str) -> Path:
    """A run submitted to (fake) Slurm as job ``job_id``."""
    from hpc_ddp.config.load import load_job_config
    from hpc_ddp.submission.submit import materialize, prepare, record

    config = REPO / "jobs" / "quickstart.yaml"
    cfg = load_job_config(config, [], site_profile=None)
    prepared = materialize(
        prepare(cfg, backend=Registry().backend("slurm"), config_path=config, runs_dir=runs,
                python=sys.executable, invocation=["hpc-ddp", "submit"])
    )  # fmt: skip
    record(prepared, job_id=job_id, command=["sbatch", "--parsable"])
    return prepared.paths.root


@pytest.mark.parametrize("state", ["RUNNING", "PENDING"])
def test_a_live_slurm_run_is_never_submitted_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str
) -> None:
    from hpc_ddp.backends.jobs import JobState
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.cli.main import main

    run_dir = _slurm_run(tmp_path, "77")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState(state))
    assert main(["resume", str(run_dir), "--force"], backends=Registry(slurm.client())) == 2
    assert f"still {state}" in capsys.readouterr().err
    assert slurm.commands("sbatch") == []
    assert read_manifest(run_dir).job_id == "77"


def test_a_slurm_run_slurm_forgot_is_resubmitted_and_keeps_its_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.cli.main import main

    run_dir = _slurm_run(tmp_path, "77")
    slurm = FakeSlurm()  # job 77 is known to no squeue, and there is no accounting
    assert main(["resume", str(run_dir)], backends=Registry(slurm.client())) == 0
    (submitted,) = slurm.commands("sbatch")
    assert str(run_dir / "job.sbatch") in submitted
    manifest = read_manifest(run_dir)
    assert manifest.job_id not in (None, "77")
    assert "77" in manifest.previous_jobs
    assert manifest.job_id in capsys.readouterr().out


# --- what a resume may not change -------------------------------------------------------------


def _trained_slurm_run(
    runs: Path, *, checkpoint: bool = True, grad_accum: int | None = None
) -> Path:
    """A 2-node run (job 77, forgotten by Slurm) whose ledger says it trained with 2 ranks
    (accumulating ``grad_accum``, when given), with a checkpoint at step 32 that looks whole
    to the login side."""
    from tests.ledgers import record_end, record_start

    run_dir = _slurm_run(runs, "77")
    ledger = run_dir / "ledger.jsonl"
    record_start(ledger, attempt=0, job_id="77", job_ref="77", nodelist="n[1-2]", world_size=2,
                 resumed_from_step=None, checkpoint=None, grad_accum=grad_accum)  # fmt: skip
    name = "step-00000032.pt" if checkpoint else None
    record_end(ledger, attempt=0, cause=EndCause.CANCELLED, steps_done=32, checkpoint=name,
               requeue_requested=False)  # fmt: skip
    if checkpoint:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        _looks_whole(run_dir / "checkpoints" / "step-00000032.pt", 32)
    return run_dir


def _resume_here(run_dir: Path, *args: str) -> tuple[int, str, list[str]]:
    """``hpc-ddp resume RUN_DIR ARGS`` over a FakeSlurm: (exit code, stderr, sbatch calls)."""
    import contextlib
    import io

    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.cli.main import main

    slurm = FakeSlurm()
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["resume", str(run_dir), *args], backends=Registry(slurm.client()))
    return code, err.getvalue(), slurm.commands("sbatch")


@pytest.mark.parametrize(
    "overrides",
    [["slurm.nodes=1"], ["slurm.tasks_per_node=2"], ["slurm.nodes=1", "slurm.tasks_per_node=4"]],
)
def test_a_resume_at_another_world_size_is_refused(tmp_path: Path, overrides: list[str]) -> None:
    """2 nodes x 1 task trained to step 32: going on with 1 (or 4) ranks would change the global
    batch and the run's exactness. Refused, nothing written or submitted, and the hint says how."""
    run_dir = _trained_slurm_run(tmp_path)
    config_before = (run_dir / "config.yaml").read_text()
    code, err, sbatch = _resume_here(run_dir, *overrides)
    assert (code, sbatch) == (2, [])
    assert "but the run trained with 2 (its checkpoint at step 32 too)" in err
    assert "changes the global batch (2 -> " in err
    assert (
        "HINT: resume with the same nodes and tasks_per_node (2 ranks in all: `hpc-ddp resume "
        f"{run_dir} slurm.nodes=2 slurm.tasks_per_node=1`)"
    ) in err
    assert "or add --elastic to go on at " in err
    assert "with the same global batch (train.grad_accum is rescaled; sample-exact" in err
    assert (run_dir / "config.yaml").read_text() == config_before
    assert read_manifest(run_dir).job_id == "77"


def test_the_same_world_size_in_another_shape_and_a_run_without_checkpoint_go_on(
    tmp_path: Path,
) -> None:
    same = _trained_slurm_run(tmp_path / "same")
    code, err, _ = _resume_here(same, "slurm.nodes=1", "slurm.tasks_per_node=2", "--dry-run")
    assert code == 0, err
    fresh = _trained_slurm_run(tmp_path / "fresh", checkpoint=False)  # it starts from step 0
    code, err, _ = _resume_here(fresh, "slurm.nodes=1", "--dry-run")
    assert code == 0, err


def test_a_world_size_edited_into_config_yaml_is_refused_too(tmp_path: Path) -> None:
    """The size the checkpoints were written at is the ledger's, whatever config.yaml says."""
    run_dir = _trained_slurm_run(tmp_path)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("  nodes: 2\n", "  nodes: 1\n"))
    code, err, sbatch = _resume_here(run_dir)
    assert (code, sbatch) == (2, [])
    assert "= 1 ranks, but the run trained with 2" in err
    assert "HINT: resume with the same nodes and tasks_per_node (2 ranks in all);" in err


def _resume_out(run_dir: Path, *args: str) -> tuple[int, str, str, list[str]]:
    """:func:`_resume_here`, with stdout: (exit code, stdout, stderr, sbatch calls)."""
    import contextlib
    import io

    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.cli.main import main

    slurm = FakeSlurm()
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["resume", str(run_dir), *args], backends=Registry(slurm.client()))
    return code, out.getvalue(), err.getvalue(), slurm.commands("sbatch")


def test_an_elastic_resume_keeps_the_global_batch_and_says_it_is_sample_exact(
    tmp_path: Path,
) -> None:
    """2 ranks x 64 x accumulation 1 -> 1 rank x 64 x accumulation 2: the config the new job
    runs says so, and so do the resume's lines."""
    from hpc_ddp.config.load import load_resolved_config

    run_dir = _trained_slurm_run(tmp_path)
    code, out, err, sbatch = _resume_out(run_dir, "slurm.nodes=1", "--elastic")
    assert code == 0, err
    assert len(sbatch) == 1
    assert (
        "; sample-exact, not bit-exact: 2 -> 1 ranks with the same global batch (--elastic)\n"
        in out
    )
    assert "  changed: slurm.nodes: 2 -> 1\n" in out
    assert (
        "  changed: train.grad_accum: 1 -> 2 (--elastic: keeps the global batch of 2 ranks x 64 "
        "x accumulation 1 (128 samples))\n"
    ) in out
    assert (
        "  changed: world size: 2 -> 1 ranks (--elastic): sample-exact, not bit-exact: every "
        "step sees the samples the uninterrupted run would"
    ) in out
    cfg = load_resolved_config(run_dir / "config.yaml")
    assert (cfg.slurm.nodes, cfg.train.grad_accum) == (1, 2)
    assert "#SBATCH --nodes=1\n" in (run_dir / "job.sbatch").read_text()
    assert "--elastic" in (run_dir / "job.sbatch").read_text()  # the invocation it records


@pytest.mark.parametrize(
    ("args", "grad_accum", "says"),
    [
        # 2 ranks x accumulation 1: 3 ranks would need 2/3 of a batch each.
        (["slurm.nodes=3"], None, "3 ranks would each need less than one batch per step"),
        (["slurm.nodes=3"], None, "HINT: go on with at most 2 ranks (1 or 2), or submit a new"),
        # The ledger says it accumulated 3: 6 per-rank batches, which 4 ranks cannot split.
        (["slurm.nodes=4"], 3, "is not a whole number of per-rank batches at 4 ranks (6 / 4)"),
        (["slurm.nodes=4"], 3, "HINT: pick a world size that divides 6: 1, 2, 3 or 6 ranks"),
        (["slurm.nodes=1", "train.grad_accum=4"], None, "takes accumulation 2 at 1 ranks"),
    ],
)
def test_what_an_elastic_resume_cannot_carry_over_is_refused(
    tmp_path: Path, args: list[str], grad_accum: int | None, says: str
) -> None:
    run_dir = _trained_slurm_run(tmp_path, grad_accum=grad_accum)
    config_before = (run_dir / "config.yaml").read_text()
    code, _, err, sbatch = _resume_out(run_dir, *args, "--elastic")
    assert (code, sbatch) == (2, [])
    assert says in err
    assert (run_dir / "config.yaml").read_text() == config_before


def test_an_elastic_resume_grows_from_what_the_ledger_says_was_accumulated(
    tmp_path: Path,
) -> None:
    """The config says accumulation 1, the ledger 3 (the last attempt's own): 2 x 3 -> 3 x 2."""
    from hpc_ddp.config.load import load_resolved_config

    run_dir = _trained_slurm_run(tmp_path, grad_accum=3)
    code, out, err, _ = _resume_out(run_dir, "slurm.nodes=3", "--elastic", "--dry-run")
    assert code == 0, err
    assert "changed: train.grad_accum: 1 -> 2 (--elastic: keeps the global batch of 2 ranks x " \
        "64 x accumulation 3 (384 samples))" in out  # fmt: skip
    assert load_resolved_config(run_dir / "config.yaml").train.grad_accum == 1  # a dry run


def test_a_world_size_within_the_configs_min_nodes_range_needs_no_flag(tmp_path: Path) -> None:
    """A run with slurm.min_nodes whose last attempt landed on 1 of 1-2 nodes goes on plainly."""
    from tests.ledgers import record_end, record_start

    run_dir = _trained_slurm_run(tmp_path)
    ledger = run_dir / "ledger.jsonl"
    record_start(ledger, attempt=1, job_id="77", job_ref="77", nodelist="n1", world_size=1,
                 resumed_from_step=32, checkpoint="step-00000032.pt", grad_accum=2)  # fmt: skip
    record_end(ledger, attempt=1, cause=EndCause.CANCELLED, steps_done=40, checkpoint=None,
               requeue_requested=False)  # fmt: skip
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("  min_nodes: null\n", "  min_nodes: 1\n"))
    code, out, err, _ = _resume_out(run_dir, "--dry-run")
    assert code == 0, err
    assert "#SBATCH --nodes=1-2\n" in out
    assert "sample-exact, not bit-exact where it lands on another node count" in out


@pytest.mark.parametrize("how", ["override", "edit"])
def test_the_name_cannot_change_by_override_or_by_hand(tmp_path: Path, how: str) -> None:
    """Both ways used to differ: the override was refused, the hand edit accepted."""
    run_dir = _trained_slurm_run(tmp_path)
    config = run_dir / "config.yaml"
    args: list[str] = ["name=other"]
    if how == "edit":
        config.write_text(config.read_text().replace("name: quickstart\n", "name: other\n"))
        args = []
    code, err, sbatch = _resume_here(run_dir, *args)
    assert (code, sbatch) == (2, [])
    assert "name cannot change on resume: the run was submitted as 'quickstart'" in err
    assert "HINT: a new name is a new run" in err
    if how == "edit":
        assert f"'other' was set in {config}" in err
        assert f"put name: quickstart back in {config}" in err


# --- a refused submission leaves the run as it was ---------------------------------------------


def _run_files(run_dir: Path) -> dict[str, bytes]:
    """What a resume may rewrite, and the record that says which job the run is."""
    names = ("config.yaml", "job.sbatch", "manifest.json")
    return {name: (run_dir / name).read_bytes() for name in names if (run_dir / name).exists()}


def test_a_resume_that_sbatch_refuses_leaves_the_run_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The overrides of a refused resume used to stay in config.yaml and job.sbatch, so the
    next plain resume trained at them without a `changed:` line."""
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.cli.main import main
    from hpc_ddp.submission.submit import REWRITE_UNDO

    run_dir = _trained_slurm_run(tmp_path)
    before = _run_files(run_dir)
    slurm = FakeSlurm()
    slurm.fail("sbatch", "sbatch: error: invalid partition specified: nosuch")
    args = ["resume", str(run_dir), "slurm.partition=nosuch", "train.lr=0.3"]
    assert main(args, backends=Registry(slurm.client())) == 1
    assert "invalid partition specified: nosuch" in capsys.readouterr().err
    assert _run_files(run_dir) == before
    assert not (run_dir / REWRITE_UNDO).exists()
    code, out, err, _ = _resume_out(run_dir, "--dry-run")
    assert code == 0, err
    assert "changed:" not in out
    assert "nosuch" not in out


def test_a_resume_killed_while_it_submits_is_undone_by_the_next_one(tmp_path: Path) -> None:
    """A process killed between writing the new files and recording the new job leaves both
    (the state is made here by entering `rewriting` and never leaving it, as a SIGKILL would):
    the next resume finds the manifest still naming the old job and puts the old files back."""
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.submission.resume import plan_resume
    from hpc_ddp.submission.submit import REWRITE_UNDO, rewriting, write_run_files

    run_dir = _trained_slurm_run(tmp_path)
    before = _run_files(run_dir)
    plan = plan_resume(run_dir, ["train.lr=0.3"], Registry(FakeSlurm().client()))
    killed = rewriting(plan.prepared.paths, "77")
    killed.__enter__()
    write_run_files(plan.prepared)
    assert "lr: 0.3" in (run_dir / "config.yaml").read_text()  # the half state a kill leaves
    code, out, err, _ = _resume_out(run_dir, "--dry-run")
    assert code == 0, err
    assert "changed:" not in out
    assert _run_files(run_dir) == before
    assert not (run_dir / REWRITE_UNDO).exists()


def test_a_resume_recorded_before_the_kill_keeps_its_new_files(tmp_path: Path) -> None:
    """Killed after the manifest named the new job: the new files are that job's, and stay."""
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.submission.resume import plan_resume
    from hpc_ddp.submission.submit import REWRITE_UNDO, record, rewriting, write_run_files

    run_dir = _trained_slurm_run(tmp_path)
    plan = plan_resume(run_dir, ["train.lr=0.3"], Registry(FakeSlurm().client()))
    killed = rewriting(plan.prepared.paths, "77")
    killed.__enter__()
    write_run_files(plan.prepared)
    record(plan.prepared, job_id="78", command=["sbatch"], previous_jobs=["77"])
    code, _, err, _ = _resume_out(run_dir, "--dry-run")
    assert code == 0, err
    assert "lr: 0.3" in (run_dir / "config.yaml").read_text()
    assert not (run_dir / REWRITE_UNDO).exists()


def test_a_local_resume_that_cannot_start_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    """A real local start that fails (its submitit folder is a file: the executor cannot make
    it) after the new config was written."""
    run_dir = _ended_local_run(tmp_path)
    shutil.rmtree(run_dir / "submitit", ignore_errors=True)
    (run_dir / "submitit").write_text("in the way\n")
    before = _run_files(run_dir)
    done = hpc("resume", str(run_dir), "train.lr=0.3")
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert _run_files(run_dir) == before


@pytest.mark.slurm
def test_a_resume_the_real_sbatch_refuses_leaves_the_run_as_it_was(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """The issue's reproduction on the dev cluster: an invalid partition is refused by sbatch."""
    job = e2e.submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", "slurm.time=00:02:00")
    e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))
    e2e.wait_done(slurm_cluster, job.job_id)
    before = _run_files(job.run_dir)
    refused = e2e.hpc(
        slurm_cluster, "resume", str(job.run_dir), "slurm.partition=nosuch", "train.lr=0.3",
        check=False,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "invalid partition" in refused.stderr.lower()
    assert _run_files(job.run_dir) == before
    plain = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "--dry-run")
    assert "changed:" not in plain.stdout
    assert "nosuch" not in plain.stdout


@pytest.mark.parametrize("what", ["directory", "symlink"])
def test_a_lock_file_in_the_way_is_named_not_a_traceback(tmp_path: Path, what: str) -> None:
    run_dir = _ended_local_run(tmp_path)
    lock = run_dir / "submit.lock"
    lock.unlink(missing_ok=True)
    if what == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(tmp_path / "elsewhere" / "submit.lock")
    done = hpc("resume", str(run_dir))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{lock}: the run directory's lock file is a {what}" in done.stderr
    assert "HINT: remove it" in done.stderr


# --- a resume cannot end a run by surprise (issue 32, item 8) -----------------------------------


def test_a_max_steps_below_the_checkpoint_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """It used to log "steps 33..20" and end the run COMPLETED at once."""
    run_dir = _trained_slurm_run(tmp_path)  # its checkpoint is at step 32
    before = _run_files(run_dir)
    code, _, err, sbatch = _resume_out(run_dir, "train.max_steps=20", "--force")
    assert (code, sbatch) == (2, [])
    assert "train.max_steps=20 makes the run 20 steps long, but its checkpoint is at step 32" in err
    assert "HINT: resume with a total of at least 32 steps" in err
    assert _run_files(run_dir) == before
    code, _, err, _ = _resume_out(run_dir, "train.max_steps=32", "--dry-run")
    assert code == 0, err


def test_a_resume_that_changes_the_schedule_says_it_is_no_longer_comparable(
    tmp_path: Path,
) -> None:
    run_dir = _trained_slurm_run(tmp_path)
    code, out, err, _ = _resume_out(run_dir, "train.epochs=7", "--dry-run")
    assert code == 0, err
    assert "; not comparable to an uninterrupted run: train.epochs changed, and it shapes the " \
        "schedule or the data\n" in out  # fmt: skip
    assert "bit-identical" not in out
    code, out, err, _ = _resume_out(run_dir, "requeue.max_requeues=9", "--dry-run")
    assert code == 0, err
    assert "; bit-identical to an uninterrupted run (CPU)\n" in out


def test_a_resume_of_a_command_without_checkpoints_says_its_own_snapshot_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ddp.cli.main import main
    from hpc_ddp.config.load import load_job_config
    from hpc_ddp.submission.submit import materialize, prepare, record

    config = tmp_path / "plain.yaml"
    script = tmp_path / "train.py"
    script.write_text("")
    config.write_text(f"name: plain\ncommand: [python, {script}]\nslurm: {{nodes: 1}}\n")
    cfg = load_job_config(config, [], site_profile=None)
    prepared = materialize(
        prepare(cfg, backend=Registry().backend("local"), config_path=config,
                runs_dir=tmp_path / "runs", python=sys.executable, invocation=["hpc-ddp", "submit"])
    )  # fmt: skip
    record(prepared, job_id="4194304", command=["submitit-local", "4194304"])
    assert main(["resume", str(prepared.paths.root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "goes on from its own snapshot, if it keeps one" in out
