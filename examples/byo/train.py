"""Bring your own training script: the hpc-ddp session API in a plain PyTorch loop.

Runs unchanged as one process, under torchrun, and on Slurm through hpc-ddp::

    python examples/byo/train.py --steps 200
    torchrun --nproc-per-node 2 examples/byo/train.py --steps 200
    hpc-ddp submit examples/byo/job.yaml            # command: [python, examples/byo/train.py, ...]
    hpc-ddp sweep examples/byo/sweep.yaml           # --lr {params.lr}, one array task per value

What the session does for you: joins the process group, picks the device, wraps the model in
DDP, resumes from the newest good checkpoint (weights, optimizer, RNG, and the exact position
in the data), and when Slurm warns of the time limit (or preempts the job) it saves, requeues
and exits cleanly, so the next attempt continues at the next step as if nothing had happened.
Leaving the ``with`` block saves the final step. The run directory is ``$HPC_DDP_RUN_DIR`` (set
by hpc-ddp on Slurm), else ``./hpc-ddp-run`` (``-2``, ``-3``, ... once a run there finished).

Every ``--eval-every`` steps it evaluates on a held-out set with ``s.eval_loader`` (every sample
once over the ranks, the loss summed exactly, training untouched) and keeps the best validation
loss in ``s.progress.extra``, which every checkpoint saves and a resume restores.

The loop runs ``s.grad_accum`` micro-batches per optimizer step (``train.grad_accum``; more on
fewer ranks) and says so to ``s.restore``, so the run may also go on at another world size
with the same global batch (``hpc-ddp resume RUN slurm.nodes=1 --elastic``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp

log = logging.getLogger("byo")


def make_dataset(n: int, seed: int) -> TensorDataset:
    """Two-moons-like points, 4 classes; generated, so every rank and attempt sees the same."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(4, (n,), generator=g)
    angles = labels.float() * (torch.pi / 2) + 0.3 * torch.randn(n, generator=g)
    points = torch.stack([angles.cos(), angles.sin()], 1) * 2 + 0.4 * torch.randn(n, 2, generator=g)
    return TensorDataset(points, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--eval-every", type=int, default=50, help="0: never")
    args = parser.parse_args()

    with hpc_ddp.session() as s:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = s.wrap(nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 4)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        # elastic: this loop runs s.grad_accum micro-batches per step, from s.loader's batches.
        if s.restore(model=model, optimizer=optimizer, elastic=True) is None:
            log.info("fresh start")
        batches = s.loader(make_dataset(4096, seed=1), batch_size=args.batch_size).forever()
        val = s.eval_loader(make_dataset(1001, seed=2), batch_size=256)

        no_sync = getattr(model, "no_sync", contextlib.nullcontext)  # DDP's
        for step in s.steps(total=args.steps, checkpoint_every=args.checkpoint_every):
            optimizer.zero_grad()
            for micro in range(s.grad_accum):  # gradients all-reduced once, on the last
                last = micro == s.grad_accum - 1
                with contextlib.nullcontext() if last else no_sync():
                    x, y = (t.to(s.device) for t in next(batches))
                    loss = nn.functional.cross_entropy(model(x), y)
                    (loss / s.grad_accum).backward()
            optimizer.step()
            if step % 10 == 0:
                row = {"step": step, "epoch": s.progress.epoch, "loss": loss.item()}
                if args.eval_every and step % args.eval_every == 0:
                    row["val_loss"] = evaluate(s, model, val)
                    best = min(row["val_loss"], s.progress.extra.get("best_val_loss", math.inf))
                    s.progress.extra["best_val_loss"] = best
                s.log(**row)
        # Leaving the block saves the final step (unless a checkpoint_every save has).
    if s.is_main:
        best = s.progress.extra.get("best_val_loss")
        log.info("done: %d steps, best val_loss %s", s.progress.step, best)


def evaluate(s: hpc_ddp.Session, model: nn.Module, val: Any) -> float:
    """The mean loss over the whole validation set (every rank calls it)."""
    model.eval()
    with torch.no_grad(), s.section("eval"):
        for x, y in val:
            out = model(x.to(s.device))
            val.add(loss=nn.functional.cross_entropy(out, y.to(s.device), reduction="sum"),
                    count=len(y))  # fmt: skip
    model.train()
    totals = val.reduce()
    return float(totals["loss"] / totals["count"])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    main()
