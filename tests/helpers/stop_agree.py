"""One rank of the stop-flag test: loop over "steps" with a collective each, agree between them.

Usage: stop_agree.py READY_DIR [cadence|lagged]

Writes READY_DIR/rank-<r> once running, then loops until the ranks agree on a stop, and prints
``{"rank", "step", "signal", "agreed_at"}`` as JSON. Rank 1 is slower, so rank 0 is usually
blocked inside an all-reduce when a signal reaches rank 1. With ``cadence`` the ranks agree
where an :class:`AgreementCadence` says; with ``lagged`` they also read each agreement one
agreement later (``launch``/``collect``), as the session's step loop does.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpc_ddp.runtime.stopflag import AgreementCadence, StopFlag


def main() -> None:
    ready_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    flag = StopFlag([signal.SIGUSR2, signal.SIGTERM]).install()
    work = torch.ones(1000)
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    cadence = AgreementCadence(fixed=None if mode in ("cadence", "lagged") else 1)
    agreed_at: list[int] = []
    step = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        step += 1
        dist.all_reduce(work)  # "training": a collective inside every step
        work.fill_(1.0)
        # A few ms of "work" a step (rank 1's longer): the cadence then agrees every 20 or so
        # steps, and still every 5 or more when a loaded machine doubles the step time.
        time.sleep(0.004 if rank == 1 else 0.002)
        if step == 20:
            (ready_dir / f"rank-{rank}").write_text("")
        if not cadence.due(step):
            continue
        agreed_at.append(step)
        if mode == "lagged":
            stop = flag.in_flight and flag.collect() is not None
            if not stop:
                flag.launch(every=cadence.propose(step))
        else:
            stop = flag.agree(every=cadence.propose(step)) is not None
        cadence.agreed(step, flag.every)
        if stop:
            break
    flag.settle()
    flag.close()
    result = {"rank": rank, "step": step, "signal": flag.agreed, "agreed_at": agreed_at}
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
