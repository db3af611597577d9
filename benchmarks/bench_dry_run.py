"""Login-node speed: ``hpc-ddp submit --dry-run`` against importing submitit and torch.

Target (exit 1 when missed): the median dry run takes no longer than the median
``python -c "import submitit"`` (ratio <= 1). The commands run interleaved, one of each per
round, so the machine's busy spells fall on all of them alike; ``import torch`` (seconds) is
timed apart, after them.
Run: ``python -m benchmarks.bench_dry_run [--repeats 20] [--quick]``; ``--quick``: 5 repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.common import (
    BIN,
    Targets,
    byte_compile_package,
    summary,
    time_command,
    time_commands_interleaved,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per command")
    parser.add_argument("--quick", action="store_true", help="5 repeats instead of 20")
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 20)
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
    }
    results = time_commands_interleaved(cases, repeats)
    results["python -c 'import torch'"] = time_command(
        [py, "-c", "import torch"], max(3, repeats // 4)
    )
    for label, times in results.items():
        print(summary(label, times), flush=True)
    dry = statistics.median(results["hpc-ddp submit jobs/quickstart.yaml --dry-run"])
    sub = statistics.median(results["python -c 'import submitit'"])
    targets = Targets()
    targets.check("dry run / import submitit (medians)", dry / sub, "<=", 1)
    return targets.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
