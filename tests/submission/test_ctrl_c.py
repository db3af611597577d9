"""Ctrl-C on ``hpc-ddp submit --backend local --wait``: real processes, real signals.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the submit process,
submitit's controller and every rank. submitit's controller used to die of it and, cleaning
up, SIGINT its ranks a second time while they saved (a KeyboardInterrupt: a crash with no
checkpoint in 2 tries of 5), and a traceback was printed; a SIGINT to the submit process alone
left the run training in the background. Now either is an agreed stop: a checkpoint at the stop
step, the ledger's cause ``cancelled``, ``status`` CANCELLED, one line that says so, exit 130;
a second Ctrl-C kills the ranks and says what that lost. Each case runs several times: the
old failure depended on timing.

The submit process is started in a session of its own with SIGINT at its default, as a shell
starts a foreground job (a test run in the background inherits SIGINT ignored otherwise).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from hpc_ddp.backends.local.process import live_controller, live_ranks, signal_if_same
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.sweep.results import read_metrics
from tests.conftest import REPO

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from hpc_ddp.config.model import TrainConfig

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LONG = ["train.epochs=300", "train.log_every=1", "train.checkpoint_every=10"]
"""About 10,000 steps: far more than any test here lets run."""


SLOW_FLAG_ENV = "HPC_DDP_TEST_SLOW_FLAG"
"""A file: once it exists, :func:`slow_when_flagged` makes every step last over a second."""


def local_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, **extra}


def slow_when_flagged(cfg: TrainConfig, train: bool) -> Dataset[Any]:
    """``train.dataset`` for the forced stop: the built-in synthetic data, each sample 50 ms
    late once ``$HPC_DDP_TEST_SLOW_FLAG`` exists (32 samples per rank: a 1.6 s step), so that
    a second Ctrl-C surely comes before the step the first one stops at has ended."""
    from hpc_ddp.train.data import SyntheticImages

    n = cfg.synthetic_samples if train else max(1, cfg.synthetic_samples // 8)
    inner = SyntheticImages(n, cfg.num_classes, cfg.image_size, cfg.seed, train=train)
    return cast("Dataset[Any]", _SlowWhenFlagged(inner, Path(os.environ[SLOW_FLAG_ENV])))


class _SlowWhenFlagged:
    def __init__(self, inner: Any, flag: Path) -> None:
        self.inner, self.flag = inner, flag

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        if self.flag.exists():
            time.sleep(0.05)
        return self.inner[index]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Submitted:
    """``hpc-ddp submit --backend local --wait`` running in its own process group."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.runs = tmp_path / "runs"
        self.err_path = tmp_path / "submit.err"
        self.slow_flag = tmp_path / "slow"
        env = local_env(**{SLOW_FLAG_ENV: str(self.slow_flag)})
        with self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hpc_ddp", *args, "--runs-dir", str(self.runs)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                # No threads run here: preexec_fn is safe (it only resets one signal).
                start_new_session=True, preexec_fn=_default_sigint,  # noqa: PLW1509
            )  # fmt: skip

    @property
    def run_dir(self) -> Path:
        [run_dir] = self.runs.iterdir()
        return run_dir

    def logged_step(self) -> int:
        """The last step rank 0 has logged (0 before the first)."""
        runs = list(self.runs.glob("*/metrics.jsonl")) if self.runs.is_dir() else []
        steps = [r["step"] for r in read_metrics(runs[0])] if runs else []
        return max(steps, default=0)

    def wait_training(self, past_step: int, timeout_s: float = 240.0) -> None:
        """Until rank 0 has logged a step after ``past_step`` (a checkpoint is behind it)."""
        self.wait_for(f"a step after {past_step}", lambda: self.logged_step() > past_step,
                      timeout_s)  # fmt: skip

    def wait_for(self, what: str, done: Callable[[], bool], timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done():
                return
            assert self.proc.poll() is None, self.stderr()
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout_s} s:\n{self.stderr()}")

    def interrupt(self, *, group: bool) -> None:
        """Ctrl-C at the terminal (``group``: the whole foreground group), or a SIGINT to the
        submit process alone (``kill -INT``)."""
        if group:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            os.kill(self.proc.pid, signal.SIGINT)

    def finish(self, timeout_s: float = 180.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def kill_leftovers(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.runs.is_dir() and any(self.runs.iterdir()):
            run_dir = self.run_dir
            controller = live_controller(run_dir, read_manifest(run_dir).job_id)
            for ident in [*live_ranks(run_dir).values(), *([controller] if controller else [])]:
                signal_if_same(ident, signal.SIGKILL)


@pytest.fixture
def submitted(tmp_path: Path) -> Iterator[Submitted]:
    run = Submitted(tmp_path, "submit", "jobs/quickstart.yaml", "--backend", "local", "--wait",
                    *LONG,
                    "train.dataset=tests.submission.test_ctrl_c:slow_when_flagged")  # fmt: skip
    try:
        yield run
    finally:
        run.kill_leftovers()


def status_row(run_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "status", str(run_dir), "--json"],
        cwd=REPO, env=local_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["runs"]
    result: dict[str, object] = row
    return result


def assert_nothing_runs(run_dir: Path) -> None:
    assert live_ranks(run_dir) == {}
    assert live_controller(run_dir, read_manifest(run_dir).job_id) is None


@pytest.mark.parametrize("repeat", range(3))
@pytest.mark.parametrize("group", [True, False], ids=["process-group", "submit-alone"])
def test_ctrl_c_cancels_at_an_agreed_step_with_a_checkpoint(
    submitted: Submitted, group: bool, repeat: int
) -> None:
    del repeat  # the same run again: the old failure came 2 times in 5 (6 runs: 95 % to see it)
    submitted.wait_training(past_step=12)
    submitted.interrupt(group=group)
    code = submitted.finish()
    err = submitted.stderr()
    assert code == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "KeyboardInterrupt" not in err, err[-3000:]
    run_dir = submitted.run_dir
    [attempt] = read_ledger(run_dir / "ledger.jsonl")
    assert attempt.cause is EndCause.CANCELLED, attempt
    assert attempt.steps_done is not None
    assert attempt.steps_done > 12
    stop = attempt.steps_done
    assert attempt.checkpoint == f"step-{stop:08d}.pt"  # saved at the stop step itself
    assert (run_dir / "checkpoints" / attempt.checkpoint).is_file()
    last = err.strip().splitlines()[-1]
    assert last == (
        f"cancelled at step {stop}; checkpoint step-{stop:08d}.pt kept; "
        f"`hpc-ddp resume {run_dir}` goes on"
    )
    assert status_row(run_dir)["state"] == "CANCELLED"
    assert_nothing_runs(run_dir)


def test_a_second_ctrl_c_kills_the_ranks_says_what_was_lost_and_resume_goes_on(
    submitted: Submitted,
) -> None:
    """Two Ctrl-Cs before the ranks reach their next step: no agreed stop, the ranks are
    killed. What is kept is the newest checkpoint, and the line says how many logged steps
    after it are lost; `resume` then goes on from that checkpoint."""
    submitted.wait_training(past_step=12)
    submitted.slow_flag.touch()
    flagged_at = submitted.logged_step()
    submitted.wait_training(past_step=flagged_at)  # every step from the next on is slow
    submitted.interrupt(group=True)
    submitted.wait_for("acknowledged Ctrl-C", lambda: "Ctrl-C: stopping" in submitted.stderr())
    submitted.interrupt(group=True)  # a person pressing it again, well within the slow step
    code = submitted.finish()
    err = submitted.stderr()
    assert code == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "KeyboardInterrupt" not in err, err[-3000:]
    run_dir = submitted.run_dir
    assert_nothing_runs(run_dir)
    [attempt] = read_ledger(run_dir / "ledger.jsonl")
    assert attempt.cause is EndCause.CANCELLED
    assert attempt.message is not None
    assert attempt.message.startswith("forced by a second Ctrl-C: the ranks were killed;")
    assert attempt.checkpoint is not None
    kept = int(attempt.checkpoint.removeprefix("step-").removesuffix(".pt"))
    reached = attempt.steps_done
    assert reached is not None
    assert reached >= kept >= 10
    said = re.escape(
        f"CANCELLED: killed by a second Ctrl-C; training had logged step {reached}; the "
        f"{reached - kept} step(s) after checkpoint step-{kept:08d}.pt are lost; "
        f"`hpc-ddp resume {run_dir}` goes on from step {kept}"
    )
    assert re.fullmatch(said, err.strip().splitlines()[-1]), err[-2000:]
    assert status_row(run_dir)["state"] == "CANCELLED"
    # The run goes on from the checkpoint kept: a short resume to its end, at full speed.
    submitted.slow_flag.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "resume", str(run_dir), "train.epochs=2", "--wait"],
        cwd=REPO, env=local_env(**{SLOW_FLAG_ENV: str(submitted.slow_flag)}),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = read_ledger(run_dir / "ledger.jsonl")
    assert (first.attempt, second.attempt) == (0, 1)  # numbered across the run's jobs
    assert (second.cause, second.resumed_from_step) == (EndCause.FINISHED, kept)
    assert isinstance(second, Attempt)
    assert status_row(run_dir)["state"] == "COMPLETED"


def test_wait_says_what_status_says_when_the_controller_is_killed(submitted: Submitted) -> None:
    """The controller killed outright (the OOM killer, say): its ranks stop as a cancel stops
    them, and `--wait` used to print "FAILED: the controller ended INTERRUPTED" beside a
    `status` that said CANCELLED. One verdict now, the same in both."""
    from hpc_ddp.backends.local.process import read_identity

    submitted.wait_training(past_step=12)
    controller = read_identity(submitted.run_dir)
    assert controller is not None
    assert signal_if_same(controller, signal.SIGKILL)
    code = submitted.finish()
    err = submitted.stderr()
    state = status_row(submitted.run_dir)["state"]
    [said] = [line for line in err.splitlines() if line.startswith("local job ")]
    assert said == f"local job {read_manifest(submitted.run_dir).job_id}: {state}"
    assert state == "CANCELLED"
    assert code == 1
    assert "INTERRUPTED" not in err
