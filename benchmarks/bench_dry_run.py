"""Login-node speed: ``hpc-ddp submit --dry-run`` against ``python -c "import submitit"``.

Measured as a user's login node runs it: hpc-ddp installed from a wheel of this checkout into
its own virtual environment (a regular install, byte-compiled by pip; an editable one adds an
import finder that costs ~15 ms of every command), its dependencies and submitit taken from the
interpreter running the benchmark. The dry run is the quickstart job on ``--backend slurm`` (the
script rendered, nothing submitted), by a user with no state of hpc-ddp's yet: every command runs
with an empty ``$XDG_STATE_HOME`` of the benchmark's own. A lemon record there (one that another
run left in ``~/.local/state/hpc-ddp/nodes``) would have the dry run ask Slurm for its
partition's nodes (``sinfo``: a query to the controller, not the login path's weight), and the
number would depend on what else ran on the machine. The commands run interleaved, one of each
per round with the order rotated, so the machine's busy spells fall on all of them alike; wall
time and CPU time (user + sys of the child) are both taken, and their per-round ratios.

Beside the milliseconds, what a shared file system charges for: the modules each command
imports (``-X importtime``) and the files it opens (``strace -f -e openat``, when strace is
installed), counted once each.

Targets (exit 1 when missed): the median dry run takes at most 0.7x the median
``import submitit``, in wall time and in CPU time.

Run: ``python -m benchmarks.bench_dry_run [--repeats 25] [--quick] [--venv DIR]``; ``--quick``:
7 repeats; ``--venv DIR``: time the hpc-ddp installed in that venv instead of building one.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.common import REPO, Targets

DRY_RUN = "hpc-ddp submit jobs/quickstart.yaml --dry-run --backend slurm"
DRY_RUN_LABEL = "submit --dry-run (quickstart, slurm)"
SUBMITIT = "python -c 'import submitit'"
GOAL = 0.7


def install(venv: Path) -> Path:
    """A venv at ``venv`` holding a regular (non-editable) install of this checkout; returns
    its interpreter. Its dependencies come from this interpreter's site-packages, through a
    ``.pth`` path line (which runs none of the ``.pth`` files there, so an editable hpc-ddp
    installed here stays out of it)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "_bench_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    with tempfile.TemporaryDirectory() as wheels:
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
        subprocess.run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, str(REPO)],
            check=True, capture_output=True,
        )  # fmt: skip
        [wheel] = Path(wheels).glob("hpc_ddp-*.whl")
        subprocess.run(
            [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
            check=True, capture_output=True,
        )  # fmt: skip
    return python


def time_interleaved(
    commands: Mapping[str, Sequence[str]], repeats: int, cwd: Path
) -> dict[str, tuple[list[float], list[float]]]:
    """(wall, CPU) seconds of ``repeats`` runs of each command, after one warm-up run of each,
    one run of each per round, the order rotated every round."""
    for argv in commands.values():
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    out: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in commands}
    labels = list(commands)
    for round_ in range(repeats):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(commands[label], cwd=cwd, check=True, capture_output=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            out[label][0].append(wall)
            out[label][1].append(cpu)
    return out


def modules_imported(argv: Sequence[str], cwd: Path) -> int:
    """How many modules ``argv`` (a python command) imports, from ``-X importtime``."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # also for a console script
    proc = subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return sum(line.startswith("import time:") for line in proc.stderr.splitlines()) - 1


def files_opened(argv: Sequence[str], cwd: Path) -> tuple[int, int] | None:
    """(openat calls, of which succeeded) of ``argv`` under strace, or None without strace."""
    if shutil.which("strace") is None:
        return None
    with tempfile.NamedTemporaryFile("r") as trace:
        subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=openat", "-o", trace.name, *argv],
            cwd=cwd, check=True, capture_output=True,
        )  # fmt: skip
        lines = [x for x in trace.read().splitlines() if "openat(" in x]
    return len(lines), sum(" = -1 " not in x for x in lines)


def _ms(times: Sequence[float]) -> str:
    return (
        f"{1000 * statistics.median(times):6.1f} ms [{1000 * min(times):6.1f}, "
        f"{1000 * max(times):6.1f}]"
    )


def _ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Median of the per-round ratios a/b, then their min and max."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per command")
    parser.add_argument("--quick", action="store_true", help="7 repeats instead of 25")
    parser.add_argument("--venv", type=Path, help="an existing venv with hpc-ddp installed")
    args = parser.parse_args(argv)
    repeats = args.repeats or (7 if args.quick else 25)
    with tempfile.TemporaryDirectory(prefix="bench-dry-run-") as tmp:
        if args.venv is not None:
            python = args.venv / "bin" / "python"
        else:
            python = install(Path(tmp) / "venv")
            print(f"(hpc-ddp installed from a wheel of {REPO} into {tmp}/venv)", flush=True)
        hpc_ddp = python.parent / "hpc-ddp"
        jobs = Path(tmp) / "jobs"
        jobs.mkdir()
        state = Path(tmp) / "state"  # a user without a lemon record (the module docstring)
        state.mkdir()
        os.environ["XDG_STATE_HOME"] = str(state)
        shutil.copy(REPO / "jobs" / "quickstart.yaml", jobs / "quickstart.yaml")
        commands = {
            DRY_RUN_LABEL: [str(hpc_ddp), *DRY_RUN.split()[1:]],
            SUBMITIT: [str(python), "-c", "import submitit"],
            "python -c pass": [str(python), "-c", "pass"],
        }
        results = time_interleaved(commands, repeats, Path(tmp))
        print(f"{'':38} {'wall: median [min, max]':>30} {'CPU: median [min, max]':>30}")
        for label, (wall, cpu) in results.items():
            print(f"{label:38} {_ms(wall):>30} {_ms(cpu):>30}  (n={len(wall)})", flush=True)
        for label, cmd in commands.items():
            opened = files_opened(cmd, Path(tmp))
            files = "no strace" if opened is None else f"{opened[0]} openat ({opened[1]} found)"
            print(f"{label:38} {modules_imported(cmd, Path(tmp)):4d} modules, {files}")
    (dry_wall, dry_cpu), (sub_wall, sub_cpu) = results[DRY_RUN_LABEL], results[SUBMITIT]
    w, c = _ratio(dry_wall, sub_wall), _ratio(dry_cpu, sub_cpu)
    print(f"per-round ratio dry run / import submitit: wall {w[0]:.2f} [{w[1]:.2f}, {w[2]:.2f}], "
          f"CPU {c[0]:.2f} [{c[1]:.2f}, {c[2]:.2f}]")  # fmt: skip
    targets = Targets()
    ratio_wall = statistics.median(dry_wall) / statistics.median(sub_wall)
    ratio_cpu = statistics.median(dry_cpu) / statistics.median(sub_cpu)
    targets.check("dry run / import submitit, wall (medians)", ratio_wall, "<=", GOAL, fmt=".2f")
    targets.check("dry run / import submitit, CPU (medians)", ratio_cpu, "<=", GOAL, fmt=".2f")
    return targets.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
