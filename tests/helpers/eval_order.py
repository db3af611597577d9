"""Training with evaluations in between, for the session tests: what each rank saw.

``python tests/helpers/eval_order.py OUT EVAL_EVERY`` (0: no evaluation) writes
``OUT/rank-N.json``: the training sample indices in the order this rank got them, a random
number drawn each step (the global RNG, as dropout draws), every evaluation index this rank
got, the reduced sums, and what a second ``s.loader`` said.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import hpc_ddp


def main(out: Path, eval_every: int) -> None:
    with hpc_ddp.session() as s:
        torch.manual_seed(s.rank)  # the stream dropout would draw from, the same in both runs
        train = s.loader(TensorDataset(torch.arange(40)), batch_size=4).forever()
        val = s.eval_loader(TensorDataset(torch.arange(23)), batch_size=4)  # 23: odd, uneven
        seen: dict[str, list[object]] = {"train": [], "rand": [], "eval": [], "totals": []}
        for step in s.steps(12):
            (idx,) = next(train)
            seen["train"] += idx.tolist()
            seen["rand"].append(torch.rand(()).item())
            if eval_every and step % eval_every == 0:
                for (batch,) in val:
                    seen["eval"] += batch.tolist()
                    val.add(count=len(batch), index_sum=batch.sum(), square_sum=batch.pow(2).sum())
                seen["totals"].append(val.reduce())
        try:
            s.loader(TensorDataset(torch.arange(23)), batch_size=4)
        except hpc_ddp.HpcDdpError as exc:
            seen["second_loader"] = [str(exc)]
        (out / f"rank-{s.rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
