"""One rank of the main_first tests, in a real session over gloo (started torchrun-style).

Usage: main_first.py RUN_DIR MODE

``order``: inside ``main_first`` rank 0 writes ``RUN_DIR/data.txt`` slowly (in pieces, with
pauses) while the others would read it inside theirs; then the same per node with
``local_main_first`` and ``RUN_DIR/node-<n>.txt``. Each rank prints when it entered and left
each block and what it read. ``raise``: rank 0 raises inside the block. ``die``: rank 0 kills
itself (SIGKILL) inside the block. ``slow``: rank 0's block outlasts the process group's
timeout (``dist.timeout_s``: 8 s), then every rank makes a collective. ``stop``: each rank
writes ``RUN_DIR/waiting-<rank>`` as it enters the block, rank 0 stays in it until
``RUN_DIR/go`` exists, then every rank runs the session's step loop; the test signals a
waiting rank meanwhile. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hpc_ddp.config.model import DistConfig, JobConfig
from hpc_ddp.sessions.session import RequeueExit, Session

PIECES = 5
SLOW_TIMEOUT_S = 8


def order(s: Session, run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, block, target in (
        ("main", s.main_first, run_dir / "data.txt"),
        ("local", s.local_main_first, run_dir / f"node-{s.dist.node_rank}.txt"),
    ):
        with block():
            entered = time.time()
            if s.is_main if name == "main" else s.local_rank == 0:
                with target.open("w") as f:
                    for i in range(PIECES):  # a reader that came early would see a part
                        f.write(f"piece {i}\n")
                        f.flush()
                        time.sleep(0.2)
            text = target.read_text()
            out[name] = {"entered": entered, "left": time.time(), "read": text}
    return out


def stop(s: Session, run_dir: Path, result: dict[str, Any]) -> None:
    (run_dir / f"waiting-{s.rank}").write_text("")
    with s.main_first():
        while s.is_main and not (run_dir / "go").exists():
            time.sleep(0.05)
    result["left"] = time.time()
    for step in s.steps(total=50):
        result["steps_run"] = step
        time.sleep(0.01)


def main() -> None:
    run_dir, mode = Path(sys.argv[1]), sys.argv[2]
    dist = DistConfig(timeout_s=SLOW_TIMEOUT_S if mode == "slow" else 300)
    s = Session(run_dir, JobConfig(name="main-first", dist=dist))
    result: dict[str, Any] = {"mode": mode}
    try:
        with s.start():
            result["rank"] = s.rank
            if mode == "order":
                result.update(order(s, run_dir))
            elif mode == "stop":
                stop(s, run_dir, result)
            else:
                (run_dir / f"waiting-{s.rank}").write_text("")
                with s.main_first(timeout_s=120):
                    if s.is_main and mode in ("raise", "die"):
                        # Fail only once every other rank waits on the block: one still
                        # joining the group would see its peer vanish there instead.
                        others = [run_dir / f"waiting-{r}" for r in range(1, s.world_size)]
                        deadline = time.monotonic() + 60
                        while not all(p.exists() for p in others) and time.monotonic() < deadline:
                            time.sleep(0.05)
                        time.sleep(0.3)
                    if s.is_main and mode == "raise":
                        raise ValueError("disk full while caching the dataset")
                    if s.is_main and mode == "die":
                        os.kill(os.getpid(), signal.SIGKILL)
                    if s.is_main and mode == "slow":
                        time.sleep(SLOW_TIMEOUT_S + 2)
                if mode == "slow":  # the group is whole: no collective timed out meanwhile
                    result["from_rank_0"] = s.broadcast_object(s.rank + 7)
    except RequeueExit as exit_:  # an agreed stop: the session has ended the attempt
        result.update(stopped_at=s.progress.step, signal=exit_.signal, code=exit_.code)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
