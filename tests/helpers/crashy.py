"""A ``command:`` job on the session API that crashes once: rank 1 fails at step CRASH_AT of
the first attempt only (``SLURM_RESTART_COUNT`` 0), and the run may then go on.

Usage: crashy.py STEPS CHECKPOINT_EVERY CRASH_AT [raise|sigkill]

``raise`` (the default): a RuntimeError, which the session sees, at the end of the step (after
its update). ``early``: the same at the start of the step, before its update (the survivor's
save then holds the step before it, and every launch dies at the same step: a crash loop).
``sigkill``: the process kills itself as the OOM killer would; no Python code runs after it, so
only the ``hpc_ddp run`` process above it can tell Slurm. Prints the run id each attempt reads;
logs ``loss`` and ``attempt`` at every step.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp


def wait_durable(checkpoints: Path, step: int) -> None:
    """Wait (at most 60 s) until rank 0's background save of ``step`` is on disk: the crash
    then comes after a checkpoint the attempt can name, however slow the machine's disk is (a
    crash during a save in flight names the one before it, which is another test's)."""
    path = checkpoints / f"step-{step:08d}.pt"
    deadline = time.monotonic() + 60
    while step > 0 and not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def crash(how: str, step: int) -> None:
    """Fail the way ``how`` says."""
    if how == "sigkill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected crash at step {step}")


def main() -> None:
    steps, every, crash_at = (int(a) for a in sys.argv[1:4])
    how = sys.argv[4] if len(sys.argv) > 4 else "raise"
    with hpc_ddp.session() as s:
        print("run id", s.run_id, flush=True)
        torch.manual_seed(0)
        model = s.wrap(nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(256, 4, generator=g), torch.arange(256) % 3)
        batches = s.loader(data, batch_size=8).forever()
        for step in s.steps(steps, checkpoint_every=every):
            if how == "early" and step == crash_at and s.rank == 1 and s.dist.restart_count == 0:
                raise RuntimeError(f"injected crash at step {step}")
            x, y = next(batches)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            s.log(step=step, loss=loss.item(), attempt=s.dist.restart_count)
            if step == crash_at and s.rank == 1 and s.dist.restart_count == 0:
                wait_durable(s.paths.checkpoints, crash_at // every * every)
                crash(how, step)


if __name__ == "__main__":
    main()
