"""Which rank asks for the requeue after a crash: the first to claim it, by exclusive create.

A crash needs no agreement between the ranks (the others are typically stuck in a collective,
or die of the lost connection), so with ``requeue.on_crash`` the ranks that crash race for one
claim file per attempt; the one that creates it asks ``scontrol requeue`` and writes the
ledger's end, the others write nothing (see :meth:`hpc_ddp.runtime.requeue.Coordinator.crash`).
The ``hpc_ddp run`` process above a ``command`` child races for the same claim when its child
dies (:func:`hpc_ddp.runtime.entry.record_child_crash`), so a crash its child's session already
claimed is never requeued twice.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["claim_crash_requeue"]

log = logging.getLogger(__name__)


def claim_crash_requeue(rendezvous: Path, job_id: str | None, attempt: int) -> bool:
    """True for the one process that creates this attempt's crash claim first.

    The claim is ``rendezvous/crash-requeue-<job id>-<attempt>``. ``O_CREAT | O_EXCL`` is
    atomic on a local filesystem and on NFSv3+, which run directories live on; the name holds
    the job id and attempt, so a requeued attempt (or a resumed run, a new job) can claim again.
    """
    name = f"crash-requeue-{job_id or 'local'}-{attempt}"
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        os.close(os.open(rendezvous / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    except OSError as exc:
        # Better two requests (Slurm refuses the second) than none for a run that needs one.
        log.warning("could not create the crash claim %s (%s); requeueing anyway", name, exc)
    return True
