"""Run every benchmark, then one table: each one's exit status and the targets it missed.

Run: ``python benchmarks/run_all.py [--quick] [NAME ...]`` (``make bench``); ``--quick`` goes to
every benchmark; NAMEs (``bench_sweep`` ...) pick some. Each runs as ``python -m
benchmarks.NAME`` from the repository root, its output shown as it comes; its ``TARGET`` lines
are collected. The ones that need Slurm get the dev cluster: if it does not answer, this brings
it up with ``hpc-ddp dev-cluster up`` when it can (root), and otherwise reports them as not run.
Exit status 0 only when every benchmark ran and met all its targets.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import dev_conf, use_dev_cluster
from benchmarks.common import BIN, REPO, TARGET_LINE

BENCHMARKS = {
    # name: needs the dev cluster
    "bench_dry_run": False,
    "bench_trainer": False,
    "bench_sweep": True,
    "bench_local_sweep_status": False,
    "bench_requeue": True,
    "bench_faults": True,  # on a dev cluster of its own (3 nodes, cred_expire 10 s)
    "bench_interval": False,
}


@dataclass
class Outcome:
    """What one benchmark did."""

    name: str
    returncode: int | None = None
    """None: not run (``note`` says why)."""
    met: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.missed

    @property
    def status(self) -> str:
        if self.returncode is None:
            return "NOT RUN"
        if self.ok:
            return "ok"
        return "MISSED" if self.missed else f"FAILED (exit {self.returncode})"


def unlisted() -> list[str]:
    """``bench_*.py`` files this runner does not know (each must be in :data:`BENCHMARKS`)."""
    found = {p.stem for p in (REPO / "benchmarks").glob("bench_*.py")}
    return sorted(found - BENCHMARKS.keys())


def dev_cluster_reason() -> str | None:
    """None when the dev cluster answers (brought up here if need be), else why it cannot."""
    reason = use_dev_cluster()
    if reason is None:
        return None
    if os.environ["SLURM_CONF"] != dev_conf():
        return reason
    if os.geteuid() != 0:
        return f"{reason}; bringing it up needs root"
    print("run_all: the dev cluster does not answer; `hpc-ddp dev-cluster up`", flush=True)
    up = subprocess.run([str(BIN / "hpc-ddp"), "dev-cluster", "up"], check=False)
    if up.returncode != 0:
        return f"`hpc-ddp dev-cluster up` failed (exit {up.returncode})"
    return use_dev_cluster()


def run_one(name: str, quick: bool) -> Outcome:
    """Run ``python -m benchmarks.NAME``, echoing its output; its exit status and targets."""
    print(f"\n===== {name}{' --quick' if quick else ''} =====", flush=True)
    argv = [sys.executable, "-m", f"benchmarks.{name}", *(["--quick"] if quick else [])]
    outcome = Outcome(name)
    with subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            match = TARGET_LINE.match(line.rstrip("\n"))
            if match:
                verdict = outcome.met if match["verdict"] == "met" else outcome.missed
                verdict.append(f"{match['name']}: {match['measured']} vs {match['target']}")
    outcome.returncode = proc.returncode
    return outcome


def table(outcomes: list[Outcome]) -> str:
    """The summary: one row per benchmark, then one per missed target."""
    rows = [("benchmark", "status", "targets met", "missed / why")]
    for o in outcomes:
        checked = len(o.met) + len(o.missed)
        why = o.missed[0] if o.missed else o.note
        rows.append((o.name, o.status, f"{len(o.met)}/{checked}", why))
        rows += [("", "", "", more) for more in o.missed[1:]]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) for row in rows]
    return "\n".join(f"{line}  {row[3]}".rstrip() for line, row in zip(lines, rows, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quickest mode")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"some of {list(BENCHMARKS)}")
    args = parser.parse_args(argv)
    if stray := unlisted():
        parser.error(f"benchmarks/{stray[0]}.py is not in run_all.BENCHMARKS; add it there")
    if unknown := [n for n in args.names if n not in BENCHMARKS]:
        parser.error(f"no benchmark {unknown[0]!r}; choose from {list(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    cluster_reason: str | None = None
    if any(BENCHMARKS[n] for n in names):
        cluster_reason = dev_cluster_reason()
    outcomes = []
    for name in names:
        if BENCHMARKS[name] and cluster_reason is not None:
            outcomes.append(Outcome(name, note=f"needs the dev cluster: {cluster_reason}"))
            continue
        outcomes.append(run_one(name, args.quick))
    print(f"\n===== summary{' (--quick)' if args.quick else ''} =====")
    print(table(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
