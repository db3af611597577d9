"""One rank that counts the host reads of tensors (``item``, ``tolist``, ``float()``, ...) that
hpc-ddp's own code makes while the step loop runs.

Usage: host_reads.py RUN_DIR trainer|session LOG_EVERY TOTAL

On a GPU each such read waits for every kernel queued before it. Every read is attributed to the
innermost frame of hpc-ddp's code on the stack (reads with none, inside torch or the user's own
loop, are not hpc-ddp's) and to the step the loop is in. Prints one JSON object: ``reads``, a
list of ``[step, "module:function"]``, and ``agreements``, the boundaries where the stop
agreement was read (collected, or settled at the loop's end).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.runtime.stopflag import StopFlag
from hpc_ddp.sessions.session import Session

PACKAGE = str(Path(__file__).resolve().parents[2] / "hpc_ddp") + os.sep
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")

reads: list[tuple[int, str]] = []
agreements: list[int] = []


class Watched(Session):
    """A session whose step loop marks when it runs (reads outside it are not counted)."""

    looping = False

    def steps(self, total: int, *, checkpoint_every: int | Literal["auto"] = 0) -> Iterator[int]:
        Watched.looping = True
        try:
            yield from super().steps(total, checkpoint_every=checkpoint_every)
        finally:
            Watched.looping = False


def _site() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            module = frame.f_code.co_filename[len(PACKAGE) :].removesuffix(".py")
            return f"{module.replace(os.sep, '.')}:{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def watch(session: Session) -> None:
    for name in READS:
        original: Callable[..., Any] = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *a: Any, _o: Callable[..., Any] = original) -> Any:
            if Watched.looping:
                site = _site()
                if site is not None:
                    reads.append((session.progress.step, site))
            return _o(self, *a)

        setattr(torch.Tensor, name, counted)
    collect = StopFlag.collect

    def collected(flag: StopFlag) -> int | None:
        if flag.in_flight:
            agreements.append(session.progress.step)
        return collect(flag)

    StopFlag.collect = collected  # type: ignore[method-assign,assignment]
    settle = StopFlag.settle

    def settled(flag: StopFlag) -> None:
        if flag.in_flight:
            agreements.append(session.progress.step)
        settle(flag)

    StopFlag.settle = settled  # type: ignore[method-assign,assignment]


def own_loop(s: Session, total: int, log_every: int) -> None:
    """The README's own-script shape: wrap, restore, loader, steps, log."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 8, generator=g), torch.randint(2, (512,), generator=g))
    model = s.wrap(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s.restore(model=model, optimizer=opt)
    batches = s.loader(data, batch_size=8).forever()
    for step in s.steps(total):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if step % log_every == 0:
            s.log(step=step, loss=loss.item())


def main() -> None:
    run_dir, which, log_every, total = Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:5])
    train = TrainConfig(model="mlp", image_size=8, batch_size=8, synthetic_samples=2048,
                        max_steps=total, epochs=None, log_every=log_every, checkpoint_every=0,
                        eval_every=0)  # fmt: skip
    cfg = JobConfig(name="reads", train=train)
    run_dir.mkdir(parents=True, exist_ok=True)
    s = Watched(run_dir, cfg)
    watch(s)
    with s.start():
        if which == "trainer":
            from hpc_ddp.train.trainer import run_training

            run_training(cfg, s)
        else:
            own_loop(s, total, log_every)
    if s.rank == 0:
        print(json.dumps({"reads": reads, "agreements": agreements}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
