"""Lemon-node memory: the nodes blamed for faults across runs and jobs, kept in the user's state
directory, so that a node that killed last night's jobs is left out of the next one
(:mod:`hpc_ddp.lemons.record`: the entries and what they mean, pure;
:mod:`hpc_ddp.lemons.store`: the files).

Only where the record lives is here, so that a submit with no record (most) finds that out
without loading the rest. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["STATE_DIR_ENV", "record_dir"]

STATE_DIR_ENV = "XDG_STATE_HOME"
"""The XDG base directory of a user's state; hpc-ddp's is ``$XDG_STATE_HOME/hpc-ddp``."""


def record_dir(env: Mapping[str, str], home: Path) -> Path:
    """Where the record lives: ``$XDG_STATE_HOME/hpc-ddp/nodes`` (an absolute one; XDG says to
    ignore a relative value), else ``~/.local/state/hpc-ddp/nodes``."""
    base = env.get(STATE_DIR_ENV, "")
    root = Path(base) if base and Path(base).is_absolute() else home / ".local" / "state"
    return root / "hpc-ddp" / "nodes"
