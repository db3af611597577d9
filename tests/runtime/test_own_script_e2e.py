"""Your own script on your own machine, with real local ranks (gloo, CPU): the README's
own-script snippet as written, named objects of any kind resumed bit-identically, evaluation
that cannot disturb training, progress lines, and the default run directory of a script
started by hand."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.checkpoint.format import list_checkpoints, load_checkpoint
from hpc_ddp.cli.cmd_status import CLEAR
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.ledger_events import end_event, start_event
from hpc_ddp.rundir.numbering import DEFAULT_RUN_DIR, pick_default_run_dir
from tests.helpers.launch import HELPERS, REPO, base_env, run_ranks

pytestmark = pytest.mark.torch

BYO = REPO / "examples" / "byo" / "train.py"


def own_script_snippet() -> str:
    """The python block of the README's "Bring your own training script" section, as written."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Bring your own training script\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block under ## Bring your own training script"
    return match.group(1)


# What the snippet leaves to the user: a model, a dataset and a loss (tiny, so 1000 steps are
# quick on two CPU ranks).
SNIPPET_PRELUDE = """\
import torch
from torch import nn
from torch.utils.data import TensorDataset

def build_model():
    torch.manual_seed(0)
    return nn.Linear(4, 3)

dataset = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)),
                        torch.arange(64) % 3)
loss_fn = nn.functional.cross_entropy
"""


def test_the_readme_own_script_snippet_ends_with_its_final_step_on_disk(tmp_path: Path) -> None:
    """Run through ``hpc-ddp submit --backend local`` on 2 ranks: the newest checkpoint is the
    last step's (the snippet saves nothing after its loop, and its total is no multiple of
    checkpoint_every), and the ledger's ``finished`` names it. Rank 0 printed a progress line
    every ``train.log_every`` steps."""
    snippet = own_script_snippet()
    total = int(re.search(r"total=([\d_]+)", snippet).group(1))  # type: ignore[union-attr]
    every = int(re.search(r"checkpoint_every=([\d_]+)", snippet).group(1))  # type: ignore[union-attr]
    assert total % every, "the snippet's total must not be a multiple of checkpoint_every"
    script = tmp_path / "train.py"
    script.write_text(SNIPPET_PRELUDE + snippet)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: readme-byo\n"
        f"command: [python, {json.dumps(str(script))}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1}\n"
        "env: {vars: {OMP_NUM_THREADS: '1'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend", "local", "--wait",
         "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = (tmp_path / "runs").iterdir()
    assert [c.step for c in list_checkpoints(run)][-1] == total
    [attempt] = read_ledger(run / "ledger.jsonl")
    assert attempt.cause is EndCause.FINISHED
    assert (attempt.steps_done, attempt.checkpoint) == (total, f"step-{total:08d}.pt")
    assert [s.step for s in attempt.saves][-1] == total  # recorded before `finished`
    lines = [ln for ln in (run / "logs" / "rank-0.err").read_text().splitlines()
             if re.search(r"step \d+/\d+", ln)]  # fmt: skip
    assert len(lines) == total // 10  # train.log_every: 10
    assert re.search(rf"step {total}/{total} \| epoch \d+ \| loss [\d.]+ \| \d+ samples/s \| "
                     r"ETA 0:00:00$", lines[-1]), lines[-1]  # fmt: skip
    assert not [ln for ln in (run / "logs" / "rank-1.err").read_text().splitlines()
                if re.search(r"step \d+/\d+", ln)]  # fmt: skip
    live = json.loads((run / "progress.json").read_text())
    assert (live["step"], live["total"], live["eta_s"]) == (total, total, 0)


def final_digests(run_dir: Path) -> dict[str, str]:
    """Every section digest of the newest checkpoint but meta's (the time) and the config's
    (its name is the run directory's)."""
    newest = list_checkpoints(run_dir)[-1]
    digests: dict[str, str] = load_checkpoint(newest.path)["meta"]["digests"]
    return {k: v for k, v in digests.items() if k not in ("meta", "config")}


def test_a_gan_with_named_objects_resumes_bit_identical_on_two_ranks(tmp_path: Path) -> None:
    """Two models, two optimizers, an EMA copy and a curriculum of the user's own: stopped
    by SIGTERM in step 16 and resumed, the run ends with every one of them bit-identical to
    an uninterrupted twin's."""
    gan = [str(HELPERS / "gan.py"), "40"]
    full = run_ranks([*gan, "0"], 2, {"HPC_DDP_RUN_DIR": str(tmp_path / "full")}, timeout=180)
    assert [rc for rc, _, _ in full] == [0, 0], full[0][2][-3000:]
    cut_env = {"HPC_DDP_RUN_DIR": str(tmp_path / "cut")}
    stopped = run_ranks([*gan, "16"], 2, cut_env, timeout=180)
    assert [rc for rc, _, _ in stopped] == [0, 0], stopped[0][2][-3000:]
    stop_step = list_checkpoints(tmp_path / "cut")[-1].step
    assert 16 <= stop_step < 40
    resumed = run_ranks([*gan, "0"], 2, cut_env, timeout=180)
    assert [rc for rc, _, _ in resumed] == [0, 0], resumed[0][2][-3000:]
    assert f"resumed from step-{stop_step:08d}.pt" in resumed[0][2]
    want = final_digests(tmp_path / "full")
    assert {"objects.discriminator", "objects.opt_d", "objects.ema", "objects.curriculum"} <= set(
        want
    )
    assert final_digests(tmp_path / "cut") == want
    assert list_checkpoints(tmp_path / "cut")[-1].step == 40
    causes = [a.cause for a in read_ledger(tmp_path / "cut" / "ledger.jsonl")]
    assert causes == [EndCause.CANCELLED, EndCause.FINISHED]  # SIGTERM outside Slurm


def _seen(out: Path, eval_every: int) -> list[dict[str, Any]]:
    out.mkdir()
    env = {"HPC_DDP_RUN_DIR": str(out / "run")}
    ranks = run_ranks([str(HELPERS / "eval_order.py"), str(out), str(eval_every)], 2, env, 120)
    assert [rc for rc, _, _ in ranks] == [0, 0], ranks[0][2][-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


def test_eval_loader_sees_each_sample_once_and_leaves_training_as_it_was(tmp_path: Path) -> None:
    """23 evaluation samples over 2 ranks: each index exactly once per evaluation (no padding
    duplicate), sums reduced exactly over the ranks, and the training order and the RNG draws
    after three evaluations the same as without any. A second ``s.loader`` is refused."""
    plain = _seen(tmp_path / "plain", 0)
    evaluated = _seen(tmp_path / "eval", 4)
    for rank in (0, 1):
        assert evaluated[rank]["train"] == plain[rank]["train"]
        assert evaluated[rank]["rand"] == plain[rank]["rand"]
    shares = [evaluated[r]["eval"] for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == sorted(list(range(23)) * 3)  # 3 evaluations
    assert set(shares[0]).isdisjoint(shares[1])
    exact = {"count": 23.0, "index_sum": float(sum(range(23))),
             "square_sum": float(sum(i * i for i in range(23)))}  # fmt: skip
    assert evaluated[0]["totals"] == evaluated[1]["totals"] == [exact] * 3
    for rank in (0, 1):
        [said] = evaluated[rank]["second_loader"]
        assert "s.loader() was already called" in said
        assert "HINT: evaluate with `s.eval_loader(" in said


# --- the default run directory of a script started by hand -------------------------------------


def test_a_finished_default_run_is_not_continued_by_the_next_start(tmp_path: Path) -> None:
    """``python train.py`` finishes in ./hpc-ddp-run; ``torchrun --standalone
    --nproc-per-node 2 train.py`` in the same directory then starts a new run in
    ./hpc-ddp-run-2 (it crashed: the world size cannot change), and says so first."""
    env = base_env()
    steps = [str(BYO), "--steps", "20", "--checkpoint-every", "50"]
    one = subprocess.run([sys.executable, *steps], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert "a new run starts in" in one.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]  # fmt: skip
    two = subprocess.run([*torchrun, *steps], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    first, second = tmp_path / DEFAULT_RUN_DIR, tmp_path / f"{DEFAULT_RUN_DIR}-2"
    said = f"{first} holds a finished run: a new run starts in {second}"
    assert said in two.stderr, two.stderr[-3000:]
    assert [c.step for c in list_checkpoints(first)] == [20]
    assert [c.step for c in list_checkpoints(second)] == [20]
    assert load_checkpoint(list_checkpoints(second)[-1].path)["meta"]["world_size"] == 2
    assert [a.cause for a in read_ledger(second / "ledger.jsonl")] == [EndCause.FINISHED]


def _attempt(run_dir: Path, cause: EndCause | None) -> None:
    run_dir.mkdir()
    lines = [start_event(attempt=0, launch_id=None, nodelist="local", world_size=1,
                         resumed_from_step=None, checkpoint=None, now=1.0)]  # fmt: skip
    if cause is not None:
        lines.append(end_event(attempt=0, cause=cause, steps_done=5, checkpoint=None,
                               requeue_requested=False, now=2.0))  # fmt: skip
    (run_dir / "ledger.jsonl").write_text("".join(lines))


@pytest.mark.parametrize(
    ("runs", "picked", "continues"),
    [
        ({}, DEFAULT_RUN_DIR, False),
        ({DEFAULT_RUN_DIR: None}, DEFAULT_RUN_DIR, True),  # ^C, then the same again
        ({DEFAULT_RUN_DIR: EndCause.CANCELLED}, DEFAULT_RUN_DIR, True),
        ({DEFAULT_RUN_DIR: EndCause.CRASH}, DEFAULT_RUN_DIR, True),
        ({DEFAULT_RUN_DIR: EndCause.FINISHED}, f"{DEFAULT_RUN_DIR}-2", False),
        ({DEFAULT_RUN_DIR: EndCause.FINISHED, f"{DEFAULT_RUN_DIR}-2": EndCause.CANCELLED},
         f"{DEFAULT_RUN_DIR}-2", True),
        ({DEFAULT_RUN_DIR: EndCause.FINISHED, f"{DEFAULT_RUN_DIR}-2": EndCause.FINISHED},
         f"{DEFAULT_RUN_DIR}-3", False),
    ],
)  # fmt: skip
def test_the_default_run_dir_continues_only_an_unfinished_run(
    tmp_path: Path, runs: dict[str, EndCause | None], picked: str, continues: bool
) -> None:
    for name, cause in runs.items():
        _attempt(tmp_path / name, cause)
    (tmp_path / f"{DEFAULT_RUN_DIR}-x").mkdir()  # not one of ours
    choice = pick_default_run_dir(tmp_path)
    assert (choice.path, choice.continues) == (tmp_path / picked, continues)


# --- status of a running own-script run ---------------------------------------------------------


def _hpc(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    return subprocess.run([sys.executable, "-m", "hpc_ddp", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_status_of_a_running_own_script_shows_its_step_total_and_eta(tmp_path: Path) -> None:
    """While the loop runs, ``status`` says where it is (from rank 0's progress lines), and
    ``status --watch`` redraws in place on a terminal, one table after another elsewhere."""
    job = tmp_path / "job.yaml"
    script = HELPERS / "slow_steps.py"
    job.write_text(f"name: slow\ncommand: [python, {json.dumps(str(script))}, '2000']\n"
                   "slurm: {nodes: 1, tasks_per_node: 1}\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    runs = tmp_path / "runs"
    submit = subprocess.Popen(
        [sys.executable, "-m", "hpc_ddp", "submit", str(job), "--backend", "local", "--wait",
         "--runs-dir", str(runs)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob("*/progress.json")):
            assert submit.poll() is None, "the run ended before it showed progress"
            assert time.monotonic() < deadline, "no progress.json"
            time.sleep(0.2)
        [run] = runs.iterdir()
        shown = _hpc("status", str(run))
        assert shown.returncode == 0, shown.stderr
        [note] = [ln for ln in shown.stdout.splitlines() if ln.startswith(f"{run}: at step")]
        assert re.fullmatch(rf"{run}: at step \d+/2000 \| ETA \d+:\d\d:\d\d \(\d+ s ago\).*",
                            note), note  # fmt: skip
        for tty in (False, True):
            _watched(run, tty)
    finally:
        submit.send_signal(signal.SIGINT)  # Ctrl-C on --wait cancels the local run
        submit.wait(60)


def _watched(run: Path, tty: bool) -> None:
    """``status --watch 0.3 RUN`` for about 1.5 s, then Ctrl-C: it exits 0, having drawn the
    table several times (each time clearing the screen first on a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPC_DDP_"))}
    argv = [sys.executable, "-m", "hpc_ddp", "status", "--watch", "0.3", str(run)]
    if tty:
        parent, child = pty.openpty()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=child, stderr=child)
        os.close(child)
    else:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE)
    time.sleep(6)  # the first table needs the import of hpc-ddp, under load
    proc.send_signal(signal.SIGINT)
    out = b""
    if tty:
        with contextlib.suppress(OSError):  # EIO once the child side is closed
            while chunk := os.read(parent, 65536):
                out += chunk
        os.close(parent)
    else:
        out, _ = proc.communicate(timeout=30)
    text = out.decode()
    assert proc.wait(30) == 0
    tables = text.count("hpc-ddp status, every 0.3 s (Ctrl-C to stop)")
    assert tables >= 2, text
    assert text.count(CLEAR) == (tables if tty else 0)
    assert text.count(f"{run}: at step") >= 2


def test_keep_best_survives_pruning_across_a_resume(tmp_path: Path) -> None:
    """Two ranks, ``keep_last: 2`` and ``keep_best: {metric: val_loss, mode: min}``: the
    checkpoint of step 10 (the lowest val_loss) outlives the newest two, in the run that saved
    it and in a second run that resumes it and saves four more."""
    env = {"HPC_DDP_RUN_DIR": str(tmp_path)}
    first = run_ranks([str(HELPERS / "keep_best.py"), "20"], 2, env, timeout=120)
    assert [rc for rc, _, _ in first] == [0, 0], first[0][2][-3000:]
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 15, 20]
    assert "best val_loss so far: 0.5, checkpoint of step 10" in first[0][2]
    second = run_ranks([str(HELPERS / "keep_best.py"), "30"], 2, env, timeout=120)
    assert [rc for rc, _, _ in second] == [0, 0], second[0][2][-3000:]
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 25, 30]
    newest = load_checkpoint(list_checkpoints(tmp_path)[-1].path)
    assert newest["meta"]["best"] == {"metric": "val_loss", "mode": "min", "step": 10,
                                      "value": 0.5}  # fmt: skip
