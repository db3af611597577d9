"""``status`` and ``results`` of a live local sweep of 10,000 points.

A real local sweep (``hpc-ddp sweep ... --backend local``) of a ``command:`` job that sleeps,
one point at a time: while the benchmark measures, its sweep controller runs (it names all
10,000 points on its command line), a few points have ended or run, and the rest are pending.
Each measurement is a whole command (``hpc-ddp status SWEEP_DIR --json``, ``hpc-ddp results
SWEEP_DIR --json``), interpreter start and imports included, as a user types it. The sweep is
cancelled at the end.

Before the fix every point looked up the live controller again, re-reading its record and its
10,000-point command line: quadratic, 49 s for status in the issue, 33.5 s (status) and 34.0 s
(results) here; after it 1.2 s each. Target (exit 1 when missed): each command's median under
2 s.

Run from the repository root: ``python -m benchmarks.bench_local_sweep_status [--quick]
[--points N]``; ``--quick``: one timed run of each command instead of three. No Slurm needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, Targets, summary, time_commands_interleaved

POINTS = 10_000
TARGET_S = 2.0
HPC_DDP = [sys.executable, "-m", "hpc_ddp"]


def start_sweep(root: Path, points: int) -> Path:
    """A live local sweep of ``points`` points of a sleeping command; its directory."""
    # Points 0 and 1 end at once; the next one sleeps through the measurement.
    (root / "nap.py").write_text(
        "import sys, time\ntime.sleep(0 if int(sys.argv[1]) < 2 else 600)\n"
    )
    (root / "job.yaml").write_text(
        f"name: many\ncommand: [python, {root / 'nap.py'}, '{{params.i}}']\n"
        "params: {i: 0}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '30'}\n"
        "fault: {enabled: false}\n"
    )
    values = ", ".join(str(i) for i in range(points))
    (root / "sweep.yaml").write_text(
        f"base: {root / 'job.yaml'}\nsweep:\n  max_parallel: 1\n  grid: {{params.i: [{values}]}}\n"
    )
    done = subprocess.run(
        [*HPC_DDP, "sweep", str(root / "sweep.yaml"), "--backend", "local", "--runs-dir",
         str(root / "runs"), "--json"],
        cwd=root, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"hpc-ddp sweep failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return Path(json.loads(done.stdout)["sweep_dir"])


def wait_running(sweep_dir: Path, timeout_s: float = 120.0) -> None:
    """Until point 2 (the first that sleeps) runs: points 0 and 1 have ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (sweep_dir / "tasks" / "2" / "manifest.json").exists():
            time.sleep(2.0)  # its ranks start
            return
        time.sleep(0.5)
    sys.exit("point 2 did not start in time; see the sweep's logs/local-sweep.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one timed run of each command")
    parser.add_argument("--points", type=int, default=POINTS)
    args = parser.parse_args(argv)
    targets = Targets()
    with tempfile.TemporaryDirectory(prefix="bench-local-sweep-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        sweep_dir = start_sweep(root, args.points)
        print(f"live local sweep of {args.points} points in {sweep_dir} "
              f"(submitted in {time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
        try:
            wait_running(sweep_dir)
            commands = {
                "status --json": [*HPC_DDP, "status", str(sweep_dir), "--json"],
                "results --json": [*HPC_DDP, "results", str(sweep_dir), "--json"],
            }
            shown = subprocess.run(commands["status --json"], capture_output=True, text=True,
                                   check=True, cwd=REPO)  # fmt: skip
            summary_row = json.loads(shown.stdout)["sweeps"][0]["summary"]
            print(f"status says: {summary_row}", flush=True)
            times = time_commands_interleaved(commands, 1 if args.quick else 3, REPO)
            for label, taken in times.items():
                print(summary(f"hpc-ddp {label} ({args.points} points)", taken), flush=True)
                targets.check(
                    f"live local sweep {label} at {args.points} points",
                    statistics.median(taken), "<", TARGET_S, fmt=".2f", unit=" s",
                )  # fmt: skip
        finally:
            subprocess.run([*HPC_DDP, "cancel", str(sweep_dir)], capture_output=True,
                           check=False, env={**os.environ}, timeout=120)  # fmt: skip
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
