"""``hpc-ddp logs RUN_DIR | JOB_ID [--task N] [--rank N] [--out | --both] [--batch] [--tail N]
[--follow]``.

hpc-ddp's own progress (steps, loss, checkpoints, stops, errors) is Python logging, which
writes to stderr: on Slurm srun puts rank N's stderr in ``logs/rank-N.err`` and the local
backend does the same, so that is the stream shown unless asked otherwise. A training
script's ``print()`` goes to stdout, ``logs/rank-N.out`` (``--out``); ``--both`` shows the two,
each chunk under a ``==> name <==`` header when the stream changes, as ``tail -f a b`` does.

A job id (or a sweep's ``ARRAYJOB_TASK``) names its run under ``--runs-dir`` as it does for
``status`` and ``cancel`` (:func:`hpc_ddp.api.logs.log_target`). ``--tail N`` starts at the last N
lines. The files are copied in chunks of :data:`CHUNK` bytes, never read whole, so a log of
any size takes the same memory.

The files are copied as bytes when stdout is a pipe or a file; on a terminal, control
characters other than newline, tab and carriage return are shown as ``cat -v`` shows them
(``^[``), so a rank's output cannot drive the terminal. ``--follow`` on a run whose log does not
exist yet waits for it while the job is queued or running (asking Slurm every few seconds),
and stops following once the job has ended (what it wrote last is printed first).
"""

from __future__ import annotations

import argparse
import codecs
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from hpc_ddp.api.logs import (
    check_rank,
    job_liveness,
    job_waiting,
    log_paths,
    log_target,
    missing_logs,
    run_paths,
)
from hpc_ddp.api.targets import runs_dir_of
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV

EPILOG = """\
streams:
  default      the rank's stderr (logs/rank-N.err): where hpc-ddp writes its progress
               (step, loss, checkpoints, stop and requeue decisions) and tracebacks
  --out        the rank's stdout (logs/rank-N.out): what the training script print()s
  --both       both files; each chunk is headed by its file name when the stream changes
targets:
  hpc-ddp logs 1234            the run whose job id is 1234, under --runs-dir
  hpc-ddp logs RUN --tail 50   its last 50 lines
sweeps:
  hpc-ddp logs SWEEP_DIR --task 3 -f   follows task 3 (its run dir is SWEEP_DIR/tasks/3)
--follow on a queued job waits for its log to appear (and gives up once the job has ended);
it stops once the job has ended, after printing what the job wrote last.
"""

ASK_EVERY_S = 5.0
"""While waiting for a log to appear, how often Slurm is asked whether the job has ended."""

CHUNK = 1 << 16
"""Bytes read at a time: a log is copied (and ``--tail`` searched) in pieces of this size."""


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank (an integer from 0)")
    return value


def _lines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines (an integer from 0)")
    return value


def _seconds(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {'non-negative' if zero else 'positive'} number of seconds"
        )
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "run_dir",
        metavar="target",
        help="the run directory (or a sweep directory with --task), or a job id",
    )
    parser.add_argument(
        "--runs-dir", help=f"where to look for job ids (default ${RUNS_DIR_ENV} or ./runs)"
    )
    parser.add_argument("--task", type=int, help="sweep task index: SWEEP_DIR/tasks/<N>")
    parser.add_argument(
        "--rank", type=_non_negative_int, default=0, help="which rank's log (default 0)"
    )
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
    parser.add_argument(
        "--tail", type=_lines, metavar="N", help="start at the last N lines of each log"
    )
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument(
        "--poll", type=lambda t: _seconds(t, zero=False), default=0.5, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--follow-for", type=lambda t: _seconds(t, zero=True), default=None, help=argparse.SUPPRESS
    )


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Control characters as ``cat -v`` shows them (``^[``, ``^?``, ``M-^[``), except newline,
    tab and carriage return: what a rank printed cannot send the terminal escape sequences."""

    def caret(match: re.Match[str]) -> str:
        code = ord(match.group())
        if code == 0x7F:
            return "^?"
        return f"^{chr(code + 64)}" if code < 0x20 else f"M-^{chr(code - 64)}"

    return _CONTROL.sub(caret, text)


def copy_logs(
    paths: list[Path],
    out: BinaryIO,
    *,
    follow: bool,
    poll_s: float,
    deadline: float | None,
    escape: bool = False,
    ended: Callable[[], bool] | None = None,
    tail: int | None = None,
) -> None:
    """Copy the files to ``out``, then (``follow``) what is appended to them until
    ``deadline`` (``time.monotonic()``), or until ``ended()`` (asked at once, then every
    :data:`ASK_EVERY_S`) says the job writing them is over: what it wrote last is copied,
    and following stops. ``escape``: through :func:`visible` (a terminal). ``tail``: from
    each file's last ``tail`` lines on (:func:`tail_start`)."""
    files: list[BinaryIO] = []
    try:
        for p in paths:
            try:
                files.append(p.open("rb"))
            except OSError as exc:
                raise RunDirError(
                    f"{p}: cannot read it ({exc.strerror or exc}). HINT: check its permissions."
                ) from None
            if tail is not None:
                files[-1].seek(tail_start(files[-1], tail))
        copier = _Copier(paths, files, out, escape)
        asked: float | None = None
        over = False
        while True:
            copier.copy_new()
            now = time.monotonic()
            if not follow or over or (deadline is not None and now > deadline):
                return
            if ended is not None and (asked is None or now - asked >= ASK_EVERY_S):
                asked = now
                over = ended()  # then one more round: what was written before the end
                if over:
                    continue
            time.sleep(poll_s)
    finally:
        for f in files:
            f.close()


class _Copier:
    """Copies what was appended to each open log since the last call, each chunk under a
    ``==> name <==`` header when the stream changes (several files)."""

    def __init__(self, paths: list[Path], files: list[BinaryIO], out: BinaryIO, escape: bool):
        self.paths, self.files, self.out, self.escape = paths, files, out, escape
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in files]
        self.shown: Path | None = None

    def copy_new(self) -> None:
        for path, f, decoder in zip(self.paths, self.files, self.decoders, strict=True):
            # In chunks up to the end as it is now: a huge log never sits in memory whole.
            while chunk := f.read(CHUNK):
                if len(self.paths) > 1 and self.shown != path:
                    lead = "" if self.shown is None else "\n"
                    self.out.write(f"{lead}==> {path.name} <==\n".encode())
                    self.shown = path
                self.out.write(visible(decoder.decode(chunk)).encode() if self.escape else chunk)
            self.out.flush()


def tail_start(f: BinaryIO, lines: int, chunk: int = CHUNK) -> int:
    """The offset where the last ``lines`` lines of ``f`` start (as ``tail -n``: a last line
    without a newline counts), found by reading back from the end ``chunk`` bytes at a time."""
    end = f.seek(0, os.SEEK_END)
    if lines == 0 or end == 0:
        return end
    f.seek(end - 1)
    pos = end - 1 if f.read(1) == b"\n" else end  # the file's last newline ends its last line
    found = 0
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        data = f.read(pos - start)
        at = len(data)
        while (at := data.rfind(b"\n", 0, at)) >= 0:
            found += 1
            if found == lines:
                return start + at + 1
        pos = start
    return 0


def wait_for_logs(
    find: Callable[[], list[Path]],
    waiting: Callable[[], str | None],
    *,
    poll_s: float,
    deadline: float | None,
) -> list[Path]:
    """Poll ``find`` until it finds the logs; [] once ``waiting`` (asked every
    :data:`ASK_EVERY_S`) says the job has ended, or at ``deadline``."""
    asked = time.monotonic()
    while True:
        time.sleep(poll_s)
        found = find()
        now = time.monotonic()
        if found or (deadline is not None and now > deadline):
            return found
        if now - asked >= ASK_EVERY_S:
            asked = now
            if waiting() is None:
                return find()  # it may have written the log just before it ended


def run(args: argparse.Namespace) -> int:
    """Print the log(s), then follow them if asked."""
    target, task = log_target(args.run_dir, args.task, runs_dir_of(args.runs_dir))
    paths = run_paths(target, task)
    if not args.batch:
        check_rank(paths, args.rank)
    deadline = None if args.follow_for is None else time.monotonic() + args.follow_for

    def find() -> list[Path]:
        return log_paths(paths, rank=args.rank, stream=args.stream, batch=args.batch)

    found = find()
    if not found and args.follow:

        def waiting() -> str | None:
            return job_waiting(args.backends, target, task, paths)

        why = waiting()
        if why is not None:
            print(f"hpc-ddp logs: {why}; waiting for its log to appear", file=sys.stderr)
            found = wait_for_logs(find, waiting, poll_s=args.poll, deadline=deadline)
    if not found:
        raise missing_logs(paths, rank=args.rank, stream=args.stream, batch=args.batch)
    sys.stdout.flush()

    def ended() -> bool:
        # Only a job known to have ended stops the following: not one Slurm cannot speak for.
        return job_liveness(args.backends, target, task, paths)[0] is False

    copy_logs(
        found,
        sys.stdout.buffer,
        follow=args.follow,
        poll_s=args.poll,
        deadline=deadline,
        escape=sys.stdout.isatty(),
        ended=ended,
        tail=args.tail,
    )
    return 0
