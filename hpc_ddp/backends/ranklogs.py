"""What a run's rank logs say of how it ended, whichever backend started its tasks: each task
writes its stderr to ``RUN_DIR/logs/rank-N.err``. Parsing is pure; reading is a few tails.

A job that dies before its first attempt starts (all checkpoints damaged, a bad import, a
missing interpreter) leaves no ledger entry at all; the error is in the rank logs
(``hpc-ddp run: error: ...``, a traceback's last line): :func:`rank_error` finds the lowest
rank's. What a backend's own launcher saw (srun's words in Slurm's batch log) is that
backend's :class:`~hpc_ddp.backends.base.Postmortem`; a backend with no launcher log of its
own has :class:`RankLogsOnly`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# "hpc-ddp run: error: ...", or the last line of a Python traceback: "ValueError: bad",
# "torch.distributed.DistBackendError: ...", "KeyboardInterrupt".
_ERROR_LINE = re.compile(
    r"^(?:hpc-ddp [\w-]+: error: .+"
    r"|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?:: .*)?)$"
)
# torch.distributed prints a rank's uncaught exception with every line prefixed: "[rank1]: ...".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
TAIL_BYTES = 64 * 1024
"""Only the end of each log is read: the latest attempt's words are there, and a log may be big."""


def tail(path: Path) -> str:
    """The last :data:`TAIL_BYTES` of ``path`` as text ("" when it cannot be read)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` that states an error (``hpc-ddp run: error: ...`` or the
    closing line of a Python traceback, also as torch prints it: ``[rank1]: ValueError: x``),
    stripped of any such prefix; None when there is none."""
    found = None
    for raw in text.splitlines():
        line = _RANK_PREFIX.sub("", raw.strip())
        if _ERROR_LINE.match(line):
            found = line
    return found


def _rank_of(path: Path) -> int:
    number = path.name.removeprefix("rank-").removesuffix(".err")
    return int(number) if number.isdigit() else 1 << 30


def rank_logs(logs_dir: Path) -> list[Path]:
    """The ranks' ``rank-N.err`` logs in ``logs_dir``, lowest rank first (raises
    :class:`OSError` when the directory cannot be listed)."""
    return sorted(logs_dir.glob("rank-*.err"), key=_rank_of)


def rank_error(logs: Sequence[Path]) -> str | None:
    """``rank-1.err: ValueError: bad``: the first of ``logs`` (:func:`rank_logs`) whose end
    states an error, with that line; None when none does (warnings are not errors)."""
    for log in logs:
        line = last_error_line(tail(log))
        if line is not None:
            return f"{log.name}: {line[:300]}"
    return None


class RankLogsOnly:
    """The :class:`~hpc_ddp.backends.base.Postmortem` of a backend whose tasks leave their rank
    logs only, no launcher's log of its own (a local run: what its tasks reported is in their
    result files): its launcher says nothing of a rank, nor of a job that left no log."""

    def failed_rank(self, logs_dir: Path) -> None:
        """None: no launcher log to read."""
        del logs_dir

    def no_log(self, logs_dir: Path) -> None:
        """None: no log of its own to miss."""
        del logs_dir
