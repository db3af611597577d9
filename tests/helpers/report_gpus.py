"""What GPUs a rank was given, and the device hpc-ddp's runtime would choose with them.

As an entry point (``tests.helpers.report_gpus:main``) it writes
``RUN_DIR/gpus-rank<RANK>.json``; run as a script (``srun python report_gpus.py``) it prints
the same JSON on one line. The report holds the rank's ``CUDA_VISIBLE_DEVICES`` and GPU
variables, the runtime's reading of them (:func:`~hpc_ddp.runtime.procgroup.gpu_grant`), the
device it would choose for a rank that sees exactly the GPUs listed (no machine here has any
for torch to count) or its refusal, ``CUBLAS_WORKSPACE_CONFIG``, and whether CUDA had started
before the job's code ran.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir.layout import LOCAL_GPUS_ENV, LOCAL_GPUS_PER_TASK_ENV, RUN_DIR_ENV
from hpc_ddp.runtime.distenv import derive_dist_env
from hpc_ddp.runtime.procgroup import choose_device, gpu_grant


def report(env: Mapping[str, str]) -> dict[str, Any]:
    dist = derive_dist_env(env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    grant = gpu_grant(dist, env)
    count = len([d for d in (visible or "").split(",") if d])
    try:
        device = choose_device(dist, count, grant.per_task, visible)
    except DistEnvError as exc:
        device = f"refused: {exc}"
    return {
        "rank": dist.rank,
        "visible": visible,
        "given": env.get(LOCAL_GPUS_ENV),
        "per_task": env.get(LOCAL_GPUS_PER_TASK_ENV),
        "asked": grant.asked,
        "own": grant.per_task,
        "device": device,
        "slurm": {k: v for k, v in env.items() if k.startswith("SLURM") and "GPU" in k},
        "cublas": env.get("CUBLAS_WORKSPACE_CONFIG"),
        "cuda_started": _cuda_started(),
    }


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def main() -> int:
    found = report(os.environ)
    path = Path(os.environ[RUN_DIR_ENV]) / f"gpus-rank{found['rank']}.json"
    path.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    print(json.dumps(report(os.environ)))
