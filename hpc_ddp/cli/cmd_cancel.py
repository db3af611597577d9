"""``hpc-ddp cancel RUN_DIR | SWEEP_DIR | JOB_ID ...``: cancel runs' Slurm jobs (local: stop
the tasks).

A sweep directory cancels every job array of the sweep. A local run's job id is a pid, and
pids are reused: it is signalled only while :mod:`hpc_ddp.local.process` proves the process under
it is still that run's controller; otherwise the run has ended and nothing is signalled.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from pathlib import Path

from hpc_ddp.cli.runs import resolve_targets, runs_dir_from
from hpc_ddp.errors import RunDirError, SlurmError, TargetError
from hpc_ddp.local.process import (
    controller_cmdline_matches,
    identify,
    mark_cancelled,
    parse_pid,
    read_identity,
    signal_if_same,
    unmark_cancelled,
)
from hpc_ddp.rundir import RUNS_DIR_ENV, Manifest, read_manifest

# A Slurm job id (``1234``, an array task ``1234_5``) or a local run's pid: a positive integer.
_JOB_ID_RE = re.compile(r"[1-9][0-9]*(_[0-9]+)?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "targets", nargs="+", help="run directories, sweep directories (every array) or job ids"
    )
    parser.add_argument("--runs-dir", help=f"where to look for job ids (default ${RUNS_DIR_ENV})")


def check_targets(targets: list[str]) -> None:
    """Refuse a target that is neither an existing directory nor a well-formed job id."""
    for t in targets:
        if not Path(t).is_dir() and not _JOB_ID_RE.fullmatch(t):
            raise TargetError(
                f"cancel target {t!r} is neither a run directory nor a job id; nothing was "
                "cancelled. HINT: pass the run (or sweep) directory printed by `hpc-ddp submit` "
                "or `hpc-ddp sweep`, or its job id (a positive integer, e.g. 1234)."
            )


def run(args: argparse.Namespace) -> int:
    """Cancel every target; a cancelled job is never requeued by hpc-ddp.

    Exit 0 when every target was cancelled or had already ended.
    """
    check_targets(args.targets)
    runs_dir = runs_dir_from(args.runs_dir, os.environ)
    client = args.slurm
    for run_dir in resolve_targets(args.targets, runs_dir):
        manifest = read_manifest(run_dir)
        if manifest.backend == "local":
            print(cancel_local(run_dir, manifest))
            continue
        jobs = slurm_jobs(manifest)
        if not jobs:
            raise RunDirError(
                f"{run_dir}: the manifest has no job id; nothing to cancel. HINT: the job was "
                "never submitted; check `hpc-ddp status` or submit it again."
            )
        failed: list[SlurmError] = []
        for job in jobs:  # every array of a sweep, even when one of them cannot be cancelled
            try:
                client.cancel(job)
            except SlurmError as exc:
                failed.append(exc)
        if failed:
            raise failed[0]
        what = "job array" if manifest.array_jobs else "job"
        print(f"cancelled slurm {what}{'s' * (len(jobs) > 1)} {', '.join(jobs)} ({run_dir})")
    return 0


def slurm_jobs(manifest: Manifest) -> list[str]:
    """Every Slurm job of a run: its job id, and for a sweep each of its job arrays."""
    jobs = [manifest.job_id] if manifest.job_id else []
    return list(dict.fromkeys([*jobs, *manifest.array_jobs]))


def cancel_local(run_dir: Path, manifest: Manifest) -> str:
    """SIGTERM a local run's controller if it still is that (it forwards the signal to the
    tasks, which save and stop); a line saying what was done."""
    pid = parse_pid(manifest.job_id or "", str(run_dir))
    expected = read_identity(run_dir)
    if expected is not None and expected.pid != pid:
        raise RunDirError(
            f"{run_dir}: the manifest's job id {pid} is not the pid {expected.pid} recorded in "
            "local.json; nothing was signalled. HINT: one of the two files was edited or is "
            "damaged; stop the run's processes by hand (see its logs/)."
        )
    if expected is None:
        # A run from before local.json: trust the pid only if it runs this run's controller.
        now = identify(pid)
        if now is not None and controller_cmdline_matches(now.cmdline, run_dir.resolve()):
            expected = now
    ended = f"{run_dir}: local job {pid} already ended; nothing was signalled"
    if expected is None:
        return ended
    # Noted before the signal: `submit --wait` may see the end at once.
    marked = mark_cancelled(run_dir)
    if not signal_if_same(expected, signal.SIGTERM):
        if marked:
            unmark_cancelled(run_dir)
        return ended
    return f"cancelled local job {pid} ({run_dir})"
