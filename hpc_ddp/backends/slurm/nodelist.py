"""Slurm's tasks-per-node form: ``2(x3),1`` to one count per node.

Pure. Tasks per node (``SLURM_TASKS_PER_NODE``, ``SLURM_STEP_TASKS_PER_NODE``) use a compact
form of Slurm's own, a count repeated for several nodes; :func:`parse_tasks_per_node` expands
it. Node lists (``n[1-3,7]``) are read by every backend: :mod:`hpc_ddp.backends.nodelist`.
"""

from __future__ import annotations

import re

from hpc_ddp.errors import DistEnvError

__all__ = ["parse_tasks_per_node"]

_TPN_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(text: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's tasks-per-node form (``2``, ``2(x3)``, ``2(x2),1``) to one count per node."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TPN_ITEM.match(item.strip())
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise DistEnvError(
                f"{name}={text!r}: {item!r} is not N or N(xK). HINT: Slurm writes e.g. "
                "'2', '2(x3)' or '2(x2),1'; do not set this variable by hand."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
