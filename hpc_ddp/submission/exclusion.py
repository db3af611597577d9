"""The lemon nodes a submission leaves out: the record read (:mod:`hpc_ddp.lemons.store`),
judged (:func:`~hpc_ddp.lemons.record.judge`) and weighed against the partition's nodes, asked
of Slurm only when the record holds a lemon (a submit with a clean record asks nothing more).

Never raises: a damaged record, or a partition Slurm cannot be asked about (a dry run away
from the cluster), leave every node in, with a warning or a note saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.base import Backend
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import BackendError
from hpc_ddp.lemons import record_dir

if TYPE_CHECKING:
    from hpc_ddp.lemons.record import Exclusion

__all__ = ["lemon_exclusion"]

log = logging.getLogger(__name__)


def lemon_exclusion(
    cfg: JobConfig, backend: Backend, env: Mapping[str, str], now: float
) -> Exclusion | None:
    """What a submission of ``cfg`` to ``backend`` does with the lemon record of ``env``'s
    user at ``now``: the nodes to exclude, and why (nothing for a backend without nodes to
    leave out, a local run, or with ``fault.lemon_nodes: false``); None without a record (the
    rest of :mod:`hpc_ddp.lemons` is not even loaded: a submit pays for it only then)."""
    directory = record_dir(env, Path.home())
    if not cfg.fault.lemon_nodes or not (directory.exists() or directory.is_symlink()):
        return None
    from hpc_ddp.lemons.record import Exclusion, judge, submit_exclusion
    from hpc_ddp.lemons.store import read_record

    record = read_record(directory)
    for warning in record.warnings:
        log.warning("%s", warning)
    lemons = judge(record.values, now=now, window_s=cfg.fault.lemon_window_days * 86400)
    if not lemons:
        return Exclusion((), ())
    s = cfg.slurm
    # The job's smallest --nodes: a range's low end, spares included (render's _nodes_flag).
    needed = (s.min_nodes if s.min_nodes is not None else s.nodes) + s.spare_nodes
    partition = s.partition or "(default)"
    try:
        found = backend.partition_nodes(s.partition)
        if found is None:
            return Exclusion((), ())  # a local run: no node to leave out
        partition, nodes = found
    except (BackendError, OSError) as exc:
        why = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
        return submit_exclusion(
            lemons, partition=partition, partition_nodes=None, needed=needed, unknown_why=why
        )
    return submit_exclusion(lemons, partition=partition, partition_nodes=nodes, needed=needed)
