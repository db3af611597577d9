"""Submitting a 1,000-point sweep: ``hpc-ddp sweep`` against submitit's ``map_array``.

Both submit one job array of 1,000 tasks to the same dev cluster in the same run (each array
is cancelled at once): ``hpc-ddp sweep`` of a 10 x 10 x 10 grid over ``jobs/quickstart.yaml``
(expand and validate 1,000 configs, write 1,000 task directories, one sbatch) and
``AutoExecutor(cluster="slurm").map_array`` of 1,000 trivial calls (1,000 pickles, one
sbatch). "in process" times the call after imports, as the issue's 0.22 s for submitit was
measured; "whole command" includes the interpreter start and imports.

Target (exit 1 when missed): the median in-process ``hpc-ddp sweep`` submission takes at most
as long as submitit's median ``map_array`` (ratio <= 1).

Run from the repository root, with the dev cluster up (``hpc-ddp dev-cluster up``):
``python -m benchmarks.bench_sweep [--repeats 2] [--quick]``; ``--quick``: one submission per
tool in process, two dry runs, and no whole-command submissions (2 arrays instead of 6).

Mind the footprint: Slurm counts every task of an array against ``MaxJobCount`` (10,000 on the
dev cluster) until ``MinJobAge`` (1 h there) after it ended, cancelled or not. A run submits
``2 * repeats + 2`` arrays of 1,000 tasks (``2 * repeats`` with ``--quick``), so the benchmark
checks the headroom first and refuses to start (rather than block every other user of the
cluster) when there is too little.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.cluster import require_dev_cluster
from benchmarks.common import BIN, REPO, Targets, summary

POINTS = 1000
SWEEP = f"""# {POINTS} points: 10 learning rates x 10 seeds x 10 batch sizes.
base: {REPO / "jobs" / "quickstart.yaml"}
sweep:
  grid:
    train.lr: [0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002, 0.0001]
    train.seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    train.batch_size: [16, 24, 32, 48, 64, 96, 128, 192, 256, 384]
  max_parallel: 8
"""


def noop(x: int) -> int:
    """What each submitit call would run (never: the array is cancelled)."""
    return x


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False, capture_output=True)


def wait_gone(job_ids: list[str], timeout_s: float = 60.0) -> None:
    """Wait until the cancelled arrays have left the running states (their files may go)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-t", "PD,R,CG", "-o", "%i"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        if not out.strip():
            return
        time.sleep(0.2)


def hpc_ddp_in_process(sweep: Path, runs: Path, dry_run: bool) -> tuple[float, list[str]]:
    """Seconds of one ``main(["sweep", ...])`` call, and the array job ids it submitted."""
    from hpc_ddp.cli.main import main

    argv = ["sweep", str(sweep), "--runs-dir", str(runs), "--json"]
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = main([*argv, "--dry-run"] if dry_run else argv)
    elapsed = time.perf_counter() - t0
    assert rc == 0, buf.getvalue()
    return elapsed, [] if dry_run else json.loads(buf.getvalue())["array_jobs"]


def hpc_ddp_command(sweep: Path, runs: Path, dry_run: bool) -> tuple[float, list[str]]:
    """Seconds of the whole ``hpc-ddp sweep`` command, and the array job ids."""
    argv = [str(BIN / "hpc-ddp"), "sweep", str(sweep), "--runs-dir", str(runs), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*argv, "--dry-run"] if dry_run else argv, capture_output=True, text=True, check=True
    )
    elapsed = time.perf_counter() - t0
    return elapsed, [] if dry_run else json.loads(proc.stdout)["array_jobs"]


def submitit_in_process(folder: Path) -> tuple[float, list[str]]:
    """Seconds of one ``map_array`` of 1,000 calls (after ``import submitit``)."""
    import submitit

    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    executor.update_parameters(
        timeout_min=10, slurm_partition="debug", nodes=1, tasks_per_node=1, cpus_per_task=1,
        slurm_array_parallelism=8,
    )  # fmt: skip
    t0 = time.perf_counter()
    jobs = executor.map_array(noop, range(POINTS))
    elapsed = time.perf_counter() - t0
    assert len(jobs) == POINTS
    return elapsed, sorted({job.job_id.split("_")[0] for job in jobs})


def submitit_command(folder: Path) -> tuple[float, list[str]]:
    """Seconds of a whole ``python`` process that imports submitit and calls ``map_array``."""
    code = (
        "import json, sys\nfrom pathlib import Path\n"
        "from benchmarks.bench_sweep import submitit_in_process\n"
        "print(json.dumps(submitit_in_process(Path(sys.argv[1]))[1]))\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder)], cwd=REPO, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    ids: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return elapsed, ids


def headroom() -> tuple[int, int]:
    """(job records Slurm holds now, array tasks included; its MaxJobCount)."""
    held = subprocess.run(
        ["squeue", "-h", "-t", "all", "-r", "-o", "%i"], capture_output=True, text=True, check=True
    ).stdout.count("\n")
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True
    ).stdout
    limit = next(
        int(line.split("=")[1]) for line in config.splitlines() if line.startswith("MaxJobCount")
    )
    return held, limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="real submissions per tool")
    parser.add_argument("--dry-repeats", type=int, default=None, help="dry runs")
    parser.add_argument("--quick", action="store_true", help="fewest submissions and dry runs")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 2)
    dry_repeats = args.dry_repeats or (2 if args.quick else 5)
    if not require_dev_cluster():
        return 1
    arrays = 2 * repeats + (0 if args.quick else 2)
    held, limit = headroom()
    if held + arrays * POINTS + 100 > limit:
        print(f"Slurm holds {held} job records (MaxJobCount={limit}); this run needs "
              f"{arrays * POINTS} more. Finished records are purged MinJobAge after they end: "
              "try again later, or with fewer --repeats", file=sys.stderr)  # fmt: skip
        return 1
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        sweep = root / "sweep-1000.yaml"
        sweep.write_text(SWEEP)
        dry: dict[str, Callable[[int], tuple[float, list[str]]]] = {
            "hpc-ddp sweep --dry-run (in process)": lambda i: hpc_ddp_in_process(
                sweep, root / f"dry{i}", True
            ),
            "hpc-ddp sweep --dry-run (whole command)": lambda i: hpc_ddp_command(
                sweep, root / f"dryc{i}", True
            ),
        }
        real: dict[str, Callable[[int], tuple[float, list[str]]]] = {
            "hpc-ddp sweep, submit (in process)": lambda i: hpc_ddp_in_process(
                sweep, root / f"ours{i}", False
            ),
            "submitit map_array, submit (in process)": lambda i: submitit_in_process(
                root / f"submitit{i}"
            ),
        }
        once: dict[str, Callable[[int], tuple[float, list[str]]]] = {
            "hpc-ddp sweep, submit (whole command)": lambda i: hpc_ddp_command(
                sweep, root / f"oursc{i}", False
            ),
            "import submitit + map_array (whole command)": lambda i: submitit_command(
                root / f"submititc{i}"
            ),
        }
        if args.quick:
            once.clear()  # each would leave 1,000 more job records in Slurm for an hour
        times: dict[str, list[float]] = {label: [] for label in (*dry, *real, *once)}
        submitted: list[str] = []
        import submitit  # noqa: F401  (warm: neither tool pays its imports in process)

        hpc_ddp_in_process(sweep, root / "warm", True)
        for i in range(dry_repeats):
            for label, run in dry.items():
                times[label].append(run(i)[0])
        # Real submissions interleaved, each tool first in turn, each array cancelled at once.
        for i in range(repeats):
            order = list(real.items()) if i % 2 == 0 else list(reversed(real.items()))
            for label, run in [*order, *(once.items() if i == 0 else ())]:
                elapsed, ids = run(i)
                scancel(ids)
                submitted += ids
                times[label].append(elapsed)
        wait_gone(submitted)
    print(f"{POINTS} points/calls, one job array each, dev cluster")
    for label, values in times.items():
        print(summary(label, values))
    ours = statistics.median(times["hpc-ddp sweep, submit (in process)"])
    theirs = statistics.median(times["submitit map_array, submit (in process)"])
    targets = Targets()
    targets.check(
        "hpc-ddp sweep / submitit map_array (in process, medians)", ours / theirs, "<=", 1
    )
    return targets.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
