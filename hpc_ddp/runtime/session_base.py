"""The process side of a session: environment, stop signals, process group, device, ledger end.

:class:`SessionBase` is what :class:`hpc_ddp.runtime.session.Session` stands on: it joins the
process group with the stop signals already caught, picks the device, sets up the checkpointer
and the requeue :class:`~hpc_ddp.runtime.requeue.Coordinator`, says who and where this process
is, and on leaving the ``with`` block writes the attempt's end (finished, or crash) and closes.
The training API (``wrap``, ``loader``, ``restore``, ``checkpoint``, ``steps``, ``requeue``,
``log``) is the session's own; the two were split only to keep each module readable.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hpc_ddp.config.load import load_resolved_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import Params
from hpc_ddp.run_id import read_run_id
from hpc_ddp.rundir import PER_RANK_LOGS_ENV, RUN_DIR_ENV, RunPaths
from hpc_ddp.runtime.checkpointer import Checkpointer, broadcast_object
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env
from hpc_ddp.runtime.lifecycle import Phase
from hpc_ddp.runtime.metrics import MetricsWriter, setup_rank_logging
from hpc_ddp.runtime.procgroup import destroy_process_group, init_process_group
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.requeue import Coordinator
from hpc_ddp.runtime.stopcause import signal_number
from hpc_ddp.runtime.stopflag import AgreementCadence, StopFlag
from hpc_ddp.slurm.client import SlurmClient

__all__ = ["DEFAULT_RUN_DIR", "SessionBase"]

log = logging.getLogger("hpc_ddp")

DEFAULT_RUN_DIR = "hpc-ddp-run"

_S = TypeVar("_S", bound="SessionBase")


class SessionBase:
    """Plumbing of one process's session; use :class:`~hpc_ddp.runtime.session.Session`."""

    dist: DistEnv
    """Rank, world, launcher and Slurm job of this process (set by :meth:`start`)."""
    backend: str

    def __init__(
        self,
        run_dir: str | Path | None = None,
        config: JobConfig | None = None,
        env: Mapping[str, str] | None = None,
        *,
        slurm: SlurmClient | None = None,
    ) -> None:
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.run_dir = Path(run_dir or self.env.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR).resolve()
        self.paths = RunPaths(self.run_dir)
        self.config = config if config is not None else self._load_config()
        self._run_id: str | None = None
        self.progress = Progress()
        self.device = torch.device("cpu")
        self._signal_name = self.config.requeue.signal
        self.stop_flag = StopFlag(())
        self.cadence = AgreementCadence()
        """When :meth:`steps` agrees on stops; ``AgreementCadence(fixed=1)`` for every step."""
        self.phase = Phase.NEW
        self._slurm = slurm  # None: the real Slurm, created by the coordinator when needed
        tensorboard = self.paths.tensorboard if self.config.train.tensorboard else None
        self._metrics = MetricsWriter(self.paths.metrics, tensorboard_dir=tensorboard)
        self._log_handler: logging.Handler | None = None
        self._checkpointer: Checkpointer | None = None
        self._coordinator: Coordinator | None = None

    def _load_config(self) -> JobConfig:
        if self.paths.config.is_file():
            return load_resolved_config(self.paths.config)
        return JobConfig(name=self.run_dir.name)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self: _S) -> _S:
        """Catch stop signals, join the process group, pick the device."""
        self.dist = derive_dist_env(self.env, port=self.config.dist.port)
        self.requeue_signal = signal_number(self._signal_name)
        signals = [self.requeue_signal, signal.SIGTERM]
        if self.dist.launcher != "slurm":
            signals.append(signal.SIGINT)  # a person at a terminal; srun handles ^C itself
        self.stop_flag = StopFlag(signals).install()  # before anything slow: no window unguarded
        self._log_handler = setup_rank_logging(
            log, self.dist.rank, every_rank=self.env.get(PER_RANK_LOGS_ENV) == "1"
        )
        try:
            info = init_process_group(self.dist, self.config.dist, self.run_dir, self.env)
        except BaseException:
            self.stop_flag.close()
            raise
        self.device = torch.device(info.device)
        self.backend = info.backend
        self.phase = Phase.STARTED
        self._checkpointer = Checkpointer(
            self.paths.checkpoints,
            self.config,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
        )
        self._coordinator = Coordinator(
            self.dist, self.paths.ledger, self.config.requeue, self._slurm
        )
        if self.is_main:
            self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
        log.info(
            "session: rank %d/%d (%s, %s on %s), run dir %s, run id %s",
            self.rank,
            self.world_size,
            self.dist.launcher,
            info.backend,
            self.device,
            self.run_dir,
            self.run_id,
        )
        return self

    def close(self, *, keep_signal_handlers: bool = False, together: bool = True) -> None:
        """Wait for a checkpoint in flight, leave the process group, restore signal handlers.

        ``together``: every rank is closing too (a finished run, an agreed stop), so they
        leave the group together (see :func:`~hpc_ddp.runtime.procgroup.destroy_process_group`);
        False after an error, when a peer may be gone.
        """
        if self.phase is Phase.CLOSED:
            return
        started = self.phase is not Phase.NEW
        self.phase = Phase.CLOSED
        try:
            if self._checkpointer is not None:
                self._checkpointer.wait()
        finally:
            self._metrics.close()
            if started:
                destroy_process_group(together=together)
            if not keep_signal_handlers:
                self.stop_flag.close()
            if self._log_handler is not None:
                log.removeHandler(self._log_handler)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None or isinstance(exc, SystemExit):
            # After a stop the coordinator has written the attempt's end: finish() adds none.
            if exc_type is None and self._coordinator is not None:
                self._coordinator.finish(step=self.progress.step, checkpoint=self._last_name())
            self.close()
            return
        if self._coordinator is not None and isinstance(exc, BaseException):
            self._coordinator.crash(
                step=self.progress.step, checkpoint=self._last_name(), error=exc
            )
        try:
            self.close(together=False)
        except Exception:  # do not hide the error that is already on its way out
            log.exception("while closing the session after an error")

    # --- who and where --------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def local_rank(self) -> int:
        return self.dist.local_rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes checkpoints and metrics."""
        return self.dist.is_main

    @property
    def run_id(self) -> str:
        """The run's stable id (``RUN_DIR/run_id``), the same in every attempt and after
        ``hpc-ddp resume``: pass it to W&B as ``wandb.init(id=s.run_id, resume="allow")``."""
        if self._run_id is None:
            self._run_id = read_run_id(self.paths)
        return self._run_id

    @property
    def params(self) -> Params:
        """The job's free-form ``params:`` (read-only; nested ones are ``Params`` too): this
        task's own values in a sweep, e.g. ``s.params["lr"]``."""
        return self.config.params

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a small picklable value)."""
        return broadcast_object(obj)

    def _ckpt(self) -> Checkpointer:
        assert self._checkpointer is not None, "the session is not started"
        return self._checkpointer

    def _last_name(self) -> str | None:
        last = self._checkpointer.last if self._checkpointer is not None else None
        return None if last is None else last.name
