"""Which run directory a script started outside hpc-ddp uses (``python train.py``, torchrun).

hpc-ddp's launchers name the run directory (``$HPC_DDP_RUN_DIR``). A script started by hand
gets ``./hpc-ddp-run``, and a second start of it continues that run: what a rerun after Ctrl-C
should do. A run that *finished* is not continued: the next start would otherwise load its
final checkpoint and end at once (or, at another world size, refuse to start). So the next
numbered directory is taken instead (``hpc-ddp-run-2``, ``-3``, ...): the newest numbered one
is continued while it is unfinished, and a new one follows a finished one.

Every rank of a torchrun launch decides for itself before the process group exists, and they
agree: the choice depends only on which directories exist and whether the newest one's ledger
says it finished. A rank that looks after another made the new directory finds it unfinished,
and so continues the same one; none of them can finish a run before all of them joined it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import read_ledger

__all__ = ["DEFAULT_RUN_DIR", "DefaultRunDir", "pick_default_run_dir"]

DEFAULT_RUN_DIR = "hpc-ddp-run"


@dataclass(frozen=True)
class DefaultRunDir:
    """The run directory picked, and what the log says about it."""

    path: Path
    continues: bool
    """True: it holds an unfinished run, which this one continues."""
    after: Path | None = None
    """The finished run this one is the next of (None: it is the first)."""

    def describe(self) -> str:
        """One phrase for the first log line."""
        if self.continues:
            return f"continues the unfinished run in {self.path}"
        if self.after is not None:
            return f"{self.after} holds a finished run: a new run starts in {self.path}"
        return f"a new run starts in {self.path}"


def pick_default_run_dir(parent: Path, base: str = DEFAULT_RUN_DIR) -> DefaultRunDir:
    """The newest ``base``, ``base-2``, ... in ``parent`` unless its run finished, else the
    next number (reads their ledgers; creates nothing)."""
    numbered = re.compile(rf"{re.escape(base)}-(\d+)")
    found = {1: parent / base} if (parent / base).is_dir() else {}
    if parent.is_dir():
        for p in parent.iterdir():
            m = numbered.fullmatch(p.name)
            if m and int(m.group(1)) >= 2 and p.is_dir():
                found[int(m.group(1))] = p
    if not found:
        return DefaultRunDir(parent / base, continues=False)
    newest = max(found)
    if not finished(found[newest]):
        return DefaultRunDir(found[newest], continues=_has_run(found[newest]))
    return DefaultRunDir(parent / f"{base}-{newest + 1}", continues=False, after=found[newest])


def finished(run_dir: Path) -> bool:
    """Whether the run's last attempt ended ``finished`` (its ledger says so)."""
    try:
        attempts = read_ledger(RunPaths(run_dir).ledger)
    except HpcDdpError:  # unreadable: not known to be finished, so not thrown away
        return False
    return bool(attempts) and attempts[-1].cause is EndCause.FINISHED


def _has_run(run_dir: Path) -> bool:
    """Whether a run was started in it (a ledger), not only its empty directory made."""
    return RunPaths(run_dir).ledger.is_file()
