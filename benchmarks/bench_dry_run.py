"""Login-node speed: ``hpc-ddp submit --dry-run`` against importing submitit and torch.

Target: a dry run faster than ``python -c "import submitit"``.
Run: ``python -m benchmarks.bench_dry_run``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.common import BIN, summary, time_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    py = sys.executable
    cases = {
        "hpc-ddp submit jobs/quickstart.yaml --dry-run": [
            str(BIN / "hpc-ddp"),
            "submit",
            "jobs/quickstart.yaml",
            "--dry-run",
            "--backend",
            "slurm",
        ],
        "python -c 'import hpc_ddp' (baseline interpreter)": [py, "-c", "import hpc_ddp"],
        "python -c 'import submitit'": [py, "-c", "import submitit"],
        "python -c 'import torch'": [py, "-c", "import torch"],
    }
    results = {}
    for label, cmd in cases.items():
        results[label] = time_command(cmd, args.repeats)
        print(summary(label, results[label]), flush=True)
    dry = statistics.median(results["hpc-ddp submit jobs/quickstart.yaml --dry-run"])
    sub = statistics.median(results["python -c 'import submitit'"])
    print(f"dry run / import submitit = {dry / sub:.2f} (target < 1)")
    return 0 if dry < sub else 1


if __name__ == "__main__":
    raise SystemExit(main())
