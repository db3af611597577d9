"""A torchrun-ready script without hpc-ddp, of the shape of pytorch/examples'
``distributed/ddp-tutorial-series/multinode.py``: gloo on CPU, a ``Trainer`` that loads its own
``snapshot.pt`` at start and saves it every ``save_every`` epochs (here every epoch). It
imports nothing of hpc-ddp; run through ``command:`` it is stopped and requeued by the
``hpc_ddp run`` process above it.

Usage: snapshot_trainer.py TOTAL_EPOCHS SNAPSHOT_PATH EPOCH_SECONDS [SAVE_EVERY]

Rank 0 appends ``epoch E restart R`` to ``SNAPSHOT_PATH.epochs`` after each epoch, so a test
can see which epochs ran in which attempt. Like a careful torchrun-ready script, it saves on
SIGTERM too: the epoch in progress is left to redo, the snapshot says so, rank 0 appends
``sigterm E restart R``, and the rank exits 0. With SAVE_EVERY above TOTAL_EPOCHS that save is
the only one, so a test can tell a program that got SIGTERM from one that died of a signal.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BATCHES = 8


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        data: DataLoader[tuple[torch.Tensor, ...]],
        save_every: int,
        snapshot: Path,
        pace: float,
    ) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.module = model  # multinode.py reads self.model.module; DDP's is this one
        self.data = data
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.save_every = save_every
        self.snapshot = snapshot
        self.pace = pace
        self.epochs_run = 0
        self.terminated = False
        signal.signal(signal.SIGTERM, self._on_term)
        if snapshot.exists():
            print("Loading snapshot", flush=True)
            self._load_snapshot()
        self.model = DDP(self.model)

    def _on_term(self, signum: int, frame: object) -> None:
        del signum, frame
        self.terminated = True

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        state = {"MODEL_STATE": self.module.state_dict(), "EPOCHS_RUN": epoch}
        tmp = self.snapshot.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.snapshot)  # multinode.py saves in place; a torn file helps no one
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot}", flush=True)

    def _run_epoch(self, epoch: int) -> None:
        sampler = self.data.sampler
        assert isinstance(sampler, DistributedSampler)
        sampler.set_epoch(epoch)
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = nn.functional.cross_entropy(self.model(source), targets)
            loss.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
            time.sleep(self.pace / BATCHES)
            if self.terminated:
                self._stop(epoch)

    def _stop(self, epoch: int) -> None:
        if self.rank == 0:
            self._save_snapshot(epoch)  # this epoch is redone: its order is the sampler's
            restart = os.environ.get("SLURM_RESTART_COUNT", "0")
            with open(f"{self.snapshot}.epochs", "a") as log:
                log.write(f"sigterm {epoch} restart {restart}\n")
        sys.exit(0)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0:
                restart = os.environ.get("SLURM_RESTART_COUNT", "0")
                with open(f"{self.snapshot}.epochs", "a") as log:
                    log.write(f"epoch {epoch} restart {restart}\n")
                if (epoch + 1) % self.save_every == 0:
                    self._save_snapshot(epoch + 1)


def main() -> None:
    total, snapshot, pace = int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    save_every = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * BATCHES, 4), torch.arange(64 * BATCHES) % 3)
    loader = DataLoader(
        data, batch_size=64 // dist.get_world_size(), sampler=DistributedSampler(data)
    )
    Trainer(nn.Linear(4, 3), loader, save_every, snapshot, pace).train(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
