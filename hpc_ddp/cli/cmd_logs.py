"""``hpc-ddp logs RUN_DIR [--task N] [--rank N] [--out | --both] [--batch] [--follow]``.

hpc-ddp's own progress (steps, loss, checkpoints, stops, errors) is Python logging, which
writes to stderr: on Slurm srun puts rank N's stderr in ``logs/rank-N.err`` and the local
backend does the same, so that is the stream shown unless asked otherwise. A training
script's ``print()`` goes to stdout, ``logs/rank-N.out`` (``--out``); ``--both`` shows the two,
each chunk under a ``==> name <==`` header when the stream changes, as ``tail -f a b`` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from hpc_ddp.errors import RunDirError, TargetError
from hpc_ddp.rundir import RunPaths

EPILOG = """\
streams:
  default      the rank's stderr (logs/rank-N.err): where hpc-ddp writes its progress
               (step, loss, checkpoints, stop and requeue decisions) and tracebacks
  --out        the rank's stdout (logs/rank-N.out): what the training script print()s
  --both       both files; each chunk is headed by its file name when the stream changes
sweeps:
  hpc-ddp logs SWEEP_DIR --task 3 -f   follows task 3 (its run dir is SWEEP_DIR/tasks/3)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("run_dir", help="the run directory (or a sweep directory with --task)")
    parser.add_argument("--task", type=int, help="sweep task index: SWEEP_DIR/tasks/<N>")
    parser.add_argument("--rank", type=int, default=0, help="which rank's log (default 0)")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument(
        "--err",
        dest="stream",
        action="store_const",
        const="err",
        help="stderr, where hpc-ddp's progress goes (the default)",
    )
    stream.add_argument(
        "--out", dest="stream", action="store_const", const="out", help="stdout instead"
    )
    stream.add_argument(
        "--both", dest="stream", action="store_const", const="both", help="stderr and stdout"
    )
    parser.set_defaults(stream="err")
    parser.add_argument("--batch", action="store_true", help="the batch script's own log")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--follow-for", type=float, default=None, help=argparse.SUPPRESS)


def run_paths(target: Path, task: int | None) -> RunPaths:
    """The run directory to read: ``target`` itself, or sweep task ``task`` of it."""
    if not target.is_dir():
        raise TargetError(
            f"{str(target)!r} is not a directory. HINT: pass the run directory printed by "
            "`hpc-ddp submit` (or a sweep directory and --task N)."
        )
    paths = RunPaths(target)
    tasks = paths.tasks.iterdir() if paths.tasks.is_dir() else iter(())
    have = sorted(int(p.name) for p in tasks if p.name.isdigit())
    if task is None:
        if have:
            raise TargetError(
                f"{target} is a sweep directory with tasks {_ranges(have)}. "
                "HINT: pick one with --task N."
            )
        return paths
    if task not in have:
        what = f"has tasks {_ranges(have)}" if have else "is not a sweep directory (no tasks/)"
        raise TargetError(
            f"--task {task}: {target} {what}. HINT: pass a sweep directory printed by "
            "`hpc-ddp sweep` and one of its task indices."
        )
    return paths.task(task)


def _ranges(indices: list[int]) -> str:
    """``0-3, 7`` for [0, 1, 2, 3, 7]."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def log_paths(paths: RunPaths, *, rank: int, stream: str, batch: bool) -> list[Path]:
    """The log files asked for that exist; none is a RunDirError listing what does."""
    streams = ["err", "out"] if stream == "both" else [stream]
    found: list[Path] = []
    for s in streams:
        if batch:
            found.extend(sorted(paths.logs.glob(f"batch-*.{s}"))[-1:])
        elif paths.rank_log(rank, s).exists():
            found.append(paths.rank_log(rank, s))
    if found:
        return found
    have = sorted(p.name for p in paths.logs.glob("*")) if paths.logs.is_dir() else []
    name = "batch-*" if batch else f"rank-{rank}"
    raise RunDirError(
        f"{paths.logs}: no {name}.{'/'.join(streams)} log yet. "
        f"HINT: logs present: {', '.join(have) or 'none (has the job started?)'}."
    )


def copy_logs(
    paths: list[Path], out: TextIO, *, follow: bool, poll_s: float, follow_for: float | None
) -> None:
    """Print the files, then (``follow``) what is appended to them until ``follow_for`` s."""
    deadline = None if follow_for is None else time.monotonic() + follow_for
    files = [p.open("r", errors="replace") for p in paths]
    shown: Path | None = None
    try:
        while True:
            for path, f in zip(paths, files, strict=True):
                chunk = f.read()
                if not chunk:
                    continue
                if len(paths) > 1 and shown != path:
                    out.write(f"{'' if shown is None else chr(10)}==> {path.name} <==\n")
                    shown = path
                out.write(chunk)
                out.flush()
            if not follow or (deadline is not None and time.monotonic() > deadline):
                return
            time.sleep(poll_s)
    finally:
        for f in files:
            f.close()


def run(args: argparse.Namespace) -> int:
    """Print the log(s), then follow them if asked."""
    paths = run_paths(Path(args.run_dir), args.task)
    found = log_paths(paths, rank=args.rank, stream=args.stream, batch=args.batch)
    copy_logs(found, sys.stdout, follow=args.follow, poll_s=args.poll, follow_for=args.follow_for)
    return 0
