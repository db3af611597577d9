"""SIGKILL a checkpoint writer at random moments, many times; report what survives each kill.

Usage: ckpt_killer.py DIR KILLS SEED. Imports torch once, then forks a writer per round (a
fresh interpreter per round would cost seconds of torch import each). Each writer saves
checkpoints in a loop, continuing from the newest one it finds; the parent kills it after a
random delay (0.1 to 3 times one save, as timed on this machine at the start) and then loads
the newest complete checkpoint. Prints one JSON list with, per
round, the step found, whether its tensors are intact, and whether the kill left a torn
temporary file behind (proof that it landed mid-write).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from hpc_ddp.checkpoint.format import build_payload, capture_rng_state, find_latest
from hpc_ddp.checkpoint.writer import write_checkpoint as write
from hpc_ddp.runtime.progress import Progress

_CPU = torch.device("cpu")


def payload(step: int) -> dict[str, object]:
    model = {"w": torch.full((512, 1024), float(step)), "b": torch.arange(16.0) + step}
    return build_payload(model=model, progress=Progress(step=step), rng=[capture_rng_state(_CPU)])


def intact(data: dict[str, object], step: int) -> bool:
    model = data["model"]
    assert isinstance(model, dict)
    return bool((model["w"] == step).all()) and bool(
        (model["b"] == torch.arange(16.0) + step).all()
    )


def writer(directory: Path, start: int) -> None:
    step = start
    while True:
        step += 1
        write(directory, payload(step), keep_last=2)


def main() -> None:
    directory, kills, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    rng = random.Random(seed)
    began = time.monotonic()
    write(directory, payload(0), keep_last=2)
    # Kill delays in units of one save as this machine runs it now: a busy machine's saves
    # are slower, and delays in fixed milliseconds would then land before any save ends.
    unit = max(time.monotonic() - began, 0.02)
    rounds: list[dict[str, object]] = []
    last = 0
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:
            try:
                writer(directory, last)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.1, 3.0) * unit)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        torn = any(p.name.startswith(".tmp-") for p in directory.iterdir())
        found = find_latest(directory)
        if found is None:
            rounds.append({"step": None, "intact": False, "torn": torn})
            break
        step = int(found[1]["progress"]["step"])
        rounds.append({"step": step, "intact": intact(found[1], step), "torn": torn})
        last = step
    print(json.dumps(rounds))


if __name__ == "__main__":
    main()
