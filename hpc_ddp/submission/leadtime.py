"""``requeue.lead_time: auto`` resolved at submit: the user's save-time history read
(:mod:`hpc_ddp.rundir.savetimes`) and sized by the pure rule
(:func:`~hpc_ddp.config.leadtime.choose_lead_time`). The number chosen replaces ``auto`` in the
config the run directory records and the script renders (``--signal=USR2@N``): Slurm keeps it
across requeues, and a resume keeps it too.

And the grace check (:func:`check_grace`): where the backend knows a preemption's grace time,
a warning when it is shorter than the measured stop.

Never raises: an unreadable or damaged history is a warning, and ``auto`` then gives the prior.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

from hpc_ddp.backends.base import Backend
from hpc_ddp.config.leadtime import LeadTime, choose_lead_time, grace_warning, stop_needs_s
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import BackendError
from hpc_ddp.rundir.savetimes import read_save_times

__all__ = ["check_grace", "resolve_lead_time"]

log = logging.getLogger(__name__)


def check_grace(
    cfg: JobConfig, backend: Backend, env: Mapping[str, str], now: float, home: Path | None = None
) -> str | None:
    """The submit's warning when a preemption's grace on ``backend`` is shorter than this
    user's measured stop (:func:`~hpc_ddp.config.leadtime.grace_warning`); None when it is
    long enough, nothing is measured yet (Slurm is then not asked), or Slurm cannot say."""
    saves, _ = read_save_times(env, home or Path.home(), name=cfg.name, now=now)
    needs = stop_needs_s(saves)
    if needs is None:
        return None
    try:
        grace = backend.preemption_grace(cfg.slurm.partition, cfg.slurm.qos)
    except (BackendError, OSError) as exc:
        log.info("the preemption grace time is unknown (%s)", exc)
        return None
    if grace is None:
        return None
    return grace_warning(grace.grace_s, grace.kill_wait_s, grace.source, needs)


def resolve_lead_time(
    cfg: JobConfig, env: Mapping[str, str], now: float, home: Path | None = None
) -> tuple[JobConfig, LeadTime | None]:
    """``cfg`` with ``requeue.lead_time: auto`` replaced by the seconds chosen from ``env``'s
    user's history at ``now``, and the choice; ``cfg`` and None when it is a number."""
    if cfg.requeue.lead_time != "auto":
        return cfg, None
    saves, warning = read_save_times(env, home or Path.home(), name=cfg.name, now=now)
    if warning:
        log.warning("requeue.lead_time auto: %s; the history is left out", warning)
    lead = choose_lead_time(saves, time_limit_s=cfg.slurm.time_s)
    requeue = dataclasses.replace(cfg.requeue, lead_time=lead.seconds)
    return dataclasses.replace(cfg, requeue=requeue), lead
