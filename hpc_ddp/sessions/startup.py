"""A session's start-up: the run directory it opens and the config it runs with, the rank it
becomes (its place in the run, its stop signals, its log, the process group and device) and how
it stops being one, and the marks that say where the launch's start-up time went.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc_ddp.backends.catalog import is_scheduler
from hpc_ddp.config.elastic import planned_accum
from hpc_ddp.config.load import load_resolved_config
from hpc_ddp.config.model import DistConfig, JobConfig
from hpc_ddp.fault import standby
from hpc_ddp.fault.rankwatch import RankWatch
from hpc_ddp.fault.requeue import signal_number
from hpc_ddp.fault.watchdog import launch_paths
from hpc_ddp.rundir.layout import PER_RANK_LOGS_ENV, RUN_DIR_ENV, RunPaths
from hpc_ddp.rundir.numbering import DefaultRunDir, pick_default_run_dir
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env
from hpc_ddp.runtime.metrics import setup_rank_logging
from hpc_ddp.runtime.procgroup import (
    ProcessGroupInfo,
    destroy_process_group,
    end_startup,
    init_process_group,
)
from hpc_ddp.runtime.rankclaim import claim_rank
from hpc_ddp.runtime.stopflag import StopFlag

log = logging.getLogger("hpc_ddp")

_handed: tuple[Path, JobConfig] | None = None
"""The run directory (resolved) and config the task handed to its entry point's sessions."""


@contextlib.contextmanager
def handed_config(run_dir: Path, config: JobConfig) -> Iterator[None]:
    """While the task (``hpc-ddp run``) calls a job's entry point: a session it opens on
    ``run_dir`` without a config takes ``config``, which the task loaded from that run's
    ``config.yaml`` a moment before, rather than load and check the file again."""
    global _handed
    before, _handed = _handed, (Path(run_dir).resolve(), config)
    try:
        yield
    finally:
        _handed = before


def session_run_dir(
    run_dir: str | Path | None, env: Mapping[str, str]
) -> tuple[Path, DefaultRunDir | None]:
    """The run directory a session opens (resolved): ``run_dir``, else ``$HPC_DDP_RUN_DIR``,
    else, started by hand, the one :func:`~hpc_ddp.rundir.numbering.pick_default_run_dir`
    picks in the working directory (returned too, to say why)."""
    named = run_dir or env.get(RUN_DIR_ENV)
    if named:
        return Path(named).resolve(), None
    picked = pick_default_run_dir(Path.cwd())  # ./hpc-ddp-run, unless a run there finished
    return picked.path.resolve(), picked


def session_config(paths: RunPaths) -> JobConfig:
    """The config of a session on ``paths`` given none: the task's (:func:`handed_config`),
    else ``RUN_DIR/config.yaml``, else the defaults."""
    if _handed is not None and _handed[0] == paths.root:
        return _handed[1]  # the task's entry point: it loaded this run's config already
    if paths.config.is_file():
        return load_resolved_config(paths.config)
    return JobConfig(name=paths.root.name)


@dataclass(frozen=True)
class Rank:
    """What :func:`start_rank` set up for this process."""

    dist: DistEnv
    watch: RankWatch
    requeue_signal: int
    stop_flag: StopFlag
    log_handler: logging.Handler | None
    group: ProcessGroupInfo
    device: torch.device
    grad_accum: int
    """Micro-batches this rank runs per optimizer step at this world size
    (:func:`~hpc_ddp.config.elastic.planned_accum`)."""

    def log_start(self, run_dir: Path, run_id: str, picked: DefaultRunDir | None) -> None:
        """One line on who this rank is and where it writes (and why there, when the run
        directory was picked: :func:`session_run_dir`)."""
        d = self.dist
        how = f"{d.launcher}, {self.group.backend} on {self.device}"
        log.info("session: rank %d/%d (%s), run dir %s, run id %s",
                 d.rank, d.world_size, how, run_dir, run_id)  # fmt: skip
        if picked is not None:
            log.info("session: no run directory given (HPC_DDP_RUN_DIR): %s", picked.describe())

    def leave(self, *, together: bool, keep_signal_handlers: bool) -> None:
        """Stop being this rank: leave the process group (``together``: every rank leaves now,
        see :func:`~hpc_ddp.runtime.procgroup.destroy_process_group`), give the stop signals
        back (unless ``keep_signal_handlers``: a process that exits after a requeue), drop the
        log handler and stop the watchdog if it was started here."""
        destroy_process_group(together=together)
        if not keep_signal_handlers:
            self.stop_flag.close()
        if self.log_handler is not None:
            log.removeHandler(self.log_handler)
        self.watch.stop()


def start_rank(
    config: JobConfig, run_dir: Path, env: Mapping[str, str], given: DistEnv | None
) -> Rank:
    """Become this run's rank: its place (``given``, the task's, else derived from ``env``), its
    watchdog, its stop signals caught, its log, its claim on the rank, the process group and
    its device, and the accumulation that keeps the run's global batch at this world size.

    The stop signals are caught before anything slow, so no window is left unguarded; a
    start-up that fails gives them back."""
    dist = given if given is not None else derive_dist_env(env, port=config.dist.port)
    watch = RankWatch.start(config.fault, run_dir, env, dist)
    requeue_signal = signal_number(config.requeue.signal)
    signals = [requeue_signal, signal.SIGTERM]
    # A person at a terminal (a scheduler's launcher, srun, handles ^C itself). A SIGINT this
    # process was started with ignored stays ignored, as Python leaves it: whoever started it
    # answers Ctrl-C (the local backend's `submit --wait` turns it into a cancel), or nobody
    # should (nohup).
    if not is_scheduler(dist.launcher) and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signals.append(signal.SIGINT)
    stop_flag = StopFlag(signals).install()
    handler = setup_rank_logging(log, dist.rank, every_rank=env.get(PER_RANK_LOGS_ENV) == "1")
    try:
        # Before the rendezvous: a forked twin of this rank must not join anything.
        claim_rank(launch_paths(run_dir, env, dist).root, dist.rank)
        # Under the fault model start-up has its own deadline (fault.startup_timeout_s), and
        # so do its collectives, until the first step ends (Session.steps: end_startup).
        startup_s = config.fault.startup_timeout_s if config.fault.enabled else None
        group = init_process_group(dist, config.dist, run_dir, env, startup_timeout_s=startup_s)
    except BaseException:
        stop_flag.close()
        raise
    device = torch.device(group.device)
    accum = planned_accum(config, dist.world_size)
    return Rank(dist, watch, requeue_signal, stop_flag, handler, group, device, accum)


class StartupMarks:
    """Wall-clock marks of a launch's start-up, in order: the process's start (a standby's
    call), then the end of each phase (``session``: its imports done, ``process group``,
    ``model``: wrapped and on its device, ``restore``, ``first step``)."""

    def __init__(self) -> None:
        called = standby.called_at  # a standby's start-up is from its call (fault/standby)
        first = ("call", called) if called is not None else ("process", _process_started_at())
        self.marks: list[tuple[str, float]] = [first]

    @property
    def open(self) -> bool:
        """The first step has not ended yet."""
        return self.marks[-1][0] != "first step"

    def mark(self, phase: str) -> None:
        """``phase`` ended now (its first end only, and none after the first step)."""
        if self.open and phase not in (name for name, _ in self.marks):
            self.marks.append((phase, time.time()))

    def first_step_done(self, cfg: DistConfig) -> None:
        """The first step ended: marked and logged, and the collectives' bound is
        ``dist.timeout_s`` from now on (:func:`~hpc_ddp.runtime.procgroup.end_startup`)."""
        self.mark("first step")
        self.log()
        end_startup(cfg)

    def log(self) -> None:
        """One line on where this launch's start-up went (a restart pays it on every launch)."""
        marks = [(name, t) for name, t in self.marks if not math.isnan(t)]  # no /proc
        parts = [f"{b[0]} {b[1] - a[1]:.2f} s" for a, b in itertools.pairwise(marks)]
        log.info(
            "start-up %.2f s from %s to the end of the first step: %s",
            marks[-1][1] - marks[0][1],
            marks[0][0],
            ", ".join(parts),
        )


def _process_started_at() -> float:
    """When this process started, wall clock (NaN where ``/proc`` cannot say): its age from
    ``/proc/self/stat`` (clock ticks since boot) and ``/proc/uptime``, both to 10 ms."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return float("nan")
    return time.time() - age
