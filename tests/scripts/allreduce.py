"""Run on every task of a Slurm job: a two-process gloo all_reduce, straight from SLURM_* vars.

Deliberately independent of hpc_ddp's own env derivation: this proves the cluster itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
nodelist = os.environ["SLURM_STEP_NODELIST"]
first_node = subprocess.check_output(
    ["scontrol", "show", "hostnames", nodelist], text=True
).split()[0]
port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 10000
dist.init_process_group(
    "gloo",
    init_method=f"tcp://{first_node}:{port}",
    rank=rank,
    world_size=world,
    timeout=timedelta(seconds=60),
)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
out = {
    "rank": rank,
    "node": os.environ["SLURMD_NODENAME"],
    "master": first_node,
    "sum": t.item(),
}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
