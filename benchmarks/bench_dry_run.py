"""Login-node speed: ``hpc-ddp submit --dry-run`` against importing submitit and torch.

Target (exit 1 when missed): the median dry run is faster than the median
``python -c "import submitit"`` (ratio < 1).
Run: ``python -m benchmarks.bench_dry_run [--repeats 10] [--quick]``; ``--quick``: 3 repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.common import BIN, Targets, byte_compile_package, summary, time_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per command")
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 10")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 10)
    py = sys.executable
    byte_compile_package()
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
        results[label] = time_command(cmd, repeats)
        print(summary(label, results[label]), flush=True)
    dry = statistics.median(results["hpc-ddp submit jobs/quickstart.yaml --dry-run"])
    sub = statistics.median(results["python -c 'import submitit'"])
    targets = Targets()
    targets.check("dry run / import submitit (medians)", dry / sub, "<", 1)
    return targets.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
