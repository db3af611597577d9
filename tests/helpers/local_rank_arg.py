"""A classic DDP tutorial script's start: it reads its local rank from ``--local_rank`` only
(argparse), as scripts written for ``torch.distributed.launch`` do. It appends what it parsed
and what the environment says to OUT_DIR/rank-<RANK>.txt."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--local_rank", type=int, required=True)
args = parser.parse_args()
out = Path(args.out_dir) / f"rank-{os.environ['RANK']}.txt"
out.write_text(f"{args.local_rank} {os.environ['LOCAL_RANK']} {os.environ['WORLD_SIZE']}\n")
