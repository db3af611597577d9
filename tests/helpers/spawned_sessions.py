"""A task that forks its own workers with ``torch.multiprocessing.spawn`` and opens a session
in each, as some tutorials do: both would inherit the task's RANK and WORLD_SIZE."""

from __future__ import annotations

import time

from torch.multiprocessing.spawn import spawn

import hpc_ddp


def worker(index: int) -> None:
    with hpc_ddp.session() as s:
        for step in s.steps(400):  # still training when its twin is refused
            time.sleep(0.05)
            s.log(step=step, worker=index)


if __name__ == "__main__":
    spawn(worker, nprocs=2)  # type: ignore[no-untyped-call]
