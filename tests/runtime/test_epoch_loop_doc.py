"""docs/concepts.md's classic epoch loop (``for epoch ...: for batch in loader``), as written,
on 2 real local ranks (gloo, CPU): stopped mid-epoch and resumed, it ends with the weights of
an uninterrupted run, and its progress bar starts at the resumed position.

tqdm is not a dependency of hpc-ddp (nor of its dev extras): a stand-in ``tqdm`` module with
its constructor's ``total``/``initial``/``desc``/``disable`` and ``update``/``set_postfix``/
``close`` runs the snippet unchanged and records each bar.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.checkpoint.format import list_checkpoints, load_checkpoint
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from tests.helpers.launch import REPO, run_ranks

pytestmark = pytest.mark.torch


def epoch_loop_snippet() -> str:
    """The python block under "The classic epoch loop" in docs/concepts.md, as written."""
    text = (REPO / "docs" / "concepts.md").read_text()
    section = text.split("**The classic epoch loop.**", 1)[1].split("**What it does not", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block under the classic epoch loop"
    return match.group(1)


# What the snippet leaves to the user: a model, a dataset (1024 samples: 16 batches of 32 per
# rank and epoch on 2 ranks) and a loss; the loss also stops the run once (rank 0 sends itself
# SIGTERM at call STOP_AT, as Slurm's cancel would), then the session stops at an agreed step.
# A step takes 30 ms, so that the ranks agree on stops every few steps (every 0.1 s of training).
PRELUDE = """\
import os, random, signal, time
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

random.seed(0); np.random.seed(0)  # the RNG streams a checkpoint saves: the same in both runs

def build_model():
    torch.manual_seed(0)
    return nn.Linear(4, 3)

dataset = TensorDataset(torch.randn(1024, 4, generator=torch.Generator().manual_seed(0)),
                        torch.arange(1024) % 3)
_calls = [0]

def loss_fn(out, y):
    _calls[0] += 1
    time.sleep(0.03)
    if _calls[0] == int(os.environ.get("STOP_AT", "0")) and os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGTERM)
    return nn.functional.cross_entropy(out, y)
"""

FAKE_TQDM = """\
import json, os

class tqdm:
    def __init__(self, total=None, initial=0, desc=None, disable=False, **_):
        self.n, self.disable, self.desc = initial, disable, desc
        self._say({"desc": desc, "total": total, "initial": initial})

    def _say(self, row):
        if not self.disable:
            with open(os.environ["BARS"], "a") as f:
                f.write(json.dumps(row) + "\\n")

    def update(self, n=1):
        self.n += n

    def set_postfix(self, **_):
        pass

    def close(self):
        self._say({"desc": self.desc, "end": self.n})
"""

PER_EPOCH, EPOCHS = 16, 3


def _run(tmp_path: Path, name: str, stop_at: int = 0) -> list[dict[str, Any]]:
    bars = tmp_path / f"{name}.bars"
    bars.unlink(missing_ok=True)  # this start's bars only
    env = {
        "HPC_DDP_RUN_DIR": str(tmp_path / name),
        "PYTHONPATH": f"{tmp_path / 'mods'}:{REPO}",
        "BARS": str(bars),
        "STOP_AT": str(stop_at),
    }
    ranks = run_ranks([str(tmp_path / "train.py")], 2, env, timeout=240)
    assert [rc for rc, _, _ in ranks] == [0, 0], ranks[0][2][-3000:]
    return [json.loads(line) for line in bars.read_text().splitlines()]


def _weights(run_dir: Path) -> dict[str, str]:
    newest = list_checkpoints(run_dir)[-1]
    digests: dict[str, str] = load_checkpoint(newest.path)["meta"]["digests"]
    return {k: v for k, v in digests.items() if k not in ("meta", "config")}


def test_the_classic_epoch_loop_resumes_mid_epoch_to_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "tqdm.py").write_text(FAKE_TQDM)
    (tmp_path / "train.py").write_text(PRELUDE + epoch_loop_snippet())
    total = PER_EPOCH * EPOCHS

    full = _run(tmp_path, "full")
    assert full == [
        row
        for e in range(EPOCHS)
        for row in (
            {"desc": f"epoch {e}", "total": PER_EPOCH, "initial": 0},
            {"desc": f"epoch {e}", "end": PER_EPOCH},
        )
    ]
    assert list_checkpoints(tmp_path / "full")[-1].step == total

    cut = _run(tmp_path, "cut", stop_at=PER_EPOCH + 4)  # into epoch 1
    stopped = list_checkpoints(tmp_path / "cut")[-1].step
    assert PER_EPOCH + 4 <= stopped < total
    assert cut[-1] == {"desc": f"epoch {stopped // PER_EPOCH}", "total": PER_EPOCH, "initial": 0}
    resumed = _run(tmp_path, "cut")
    epoch, into = divmod(stopped, PER_EPOCH)
    # The bar of the resumed epoch starts where the stop left it; later epochs at 0.
    assert resumed[0] == {"desc": f"epoch {epoch}", "total": PER_EPOCH, "initial": into}
    assert resumed[1] == {"desc": f"epoch {epoch}", "end": PER_EPOCH}
    assert [r["desc"] for r in resumed] == [
        f"epoch {e}" for e in range(epoch, EPOCHS) for _ in (0, 1)
    ]
    # No batch skipped or repeated: the same weights, optimizer and RNG as the full run's.
    assert _weights(tmp_path / "cut") == _weights(tmp_path / "full")
    assert list_checkpoints(tmp_path / "cut")[-1].step == total
    causes = [a.cause for a in read_ledger(tmp_path / "cut" / "ledger.jsonl")]
    assert causes == [EndCause.CANCELLED, EndCause.FINISHED]  # SIGTERM outside Slurm
