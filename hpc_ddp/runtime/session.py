"""The session: the one API user scripts and the built-in trainer share.

::

    import hpc_ddp

    with hpc_ddp.session() as s:              # env -> process group, device, logging, stop flag
        model = s.wrap(Net())                 # to s.device, wrapped in DDP
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s.restore(model=model, optimizer=opt) # newest good checkpoint (or none), RNG included
        batches = s.loader(dataset, batch_size=32).forever()  # resumes mid-epoch
        for step in s.steps(total=1000, checkpoint_every=100):
            x, y = next(batches)              # between steps: agree on stop signals; if one
            ...                               # came, checkpoint, requeue, exit cleanly
            s.log(step=step, loss=loss.item())
        s.checkpoint(wait=True)

Works under the Slurm runtime, under ``torchrun``, and as one plain process. Every method that
talks to the other ranks (``restore``, ``checkpoint``, ``should_stop``, ``steps``, ``requeue``)
must be called by every rank at the same point. A stop ends with :class:`RequeueExit`: exit
status 0, the state safely on disk, and the job requeued (or Slurm requeueing it); a stop that
needed a requeue and could not get one exits non-zero, so Slurm records the job FAILED.

While a session is open, the requeue signal, SIGTERM (and SIGINT outside Slurm) are only
recorded; they take effect where the loop asks (:meth:`Session.steps`, or
:meth:`Session.should_stop` in a loop of your own). A loop that never asks is not stopped by
them, and Slurm kills it after ``KillWait``.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.config.load import load_resolved_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import Params
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.layout import PER_RANK_LOGS_ENV, RUN_DIR_ENV, RunPaths
from hpc_ddp.run_id import read_run_id
from hpc_ddp.runtime.checkpointer import Checkpointer, Tracked, broadcast_object
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env
from hpc_ddp.runtime.metrics import MetricsWriter, setup_rank_logging
from hpc_ddp.runtime.procgroup import destroy_process_group, init_process_group, wrap_model
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.requeue import Coordinator, signal_number
from hpc_ddp.runtime.sampler import ResumableLoader
from hpc_ddp.runtime.stopflag import AgreementCadence, StopFlag
from hpc_ddp.slurm.client import SlurmClient

log = logging.getLogger("hpc_ddp")

DEFAULT_RUN_DIR = "hpc-ddp-run"

REQUEUE_EXIT_CODE = 0


class RequeueExit(SystemExit):
    """Raised on every rank once a stop is handled: checkpoint durable, process group gone.

    Exit status 0 (:data:`REQUEUE_EXIT_CODE`): the process ended on purpose and nothing was
    lost. A run that will not come back exits non-zero, so Slurm records it FAILED, never
    COMPLETED with training unfinished: :data:`hpc_ddp.runtime.requeue.BUDGET_EXIT_CODE` when its
    requeue budget ran out,
    :data:`hpc_ddp.runtime.requeue.REQUEUE_FAILED_EXIT_CODE` when the requeue
    request failed (or Slurm could not be asked whether it is requeueing the job).
    ``signal`` is the agreed stop signal (None for a requeue asked for from code) and
    ``requeued`` whether this process asked Slurm to requeue the job.
    """

    def __init__(self, signum: int | None, requeued: bool, code: int = REQUEUE_EXIT_CODE) -> None:
        super().__init__(code)
        self.signal = signum
        self.requeued = requeued


class Phase(enum.Enum):
    """Where a :class:`Session` is in its life; it only ever moves down this list."""

    NEW = "new"
    """Constructed; :meth:`Session.start` not called yet."""
    STARTED = "started"
    """Process group joined and stop signals caught; the attempt's start not in the ledger yet."""
    TRAINING = "training"
    """The attempt's start is in the ledger (written by ``restore`` or the first step)."""
    STOPPING = "stopping"
    """A stop is being handled (``requeue``, or an attempt past the budget): no second one."""
    CLOSED = "closed"
    """Process group left; nothing collective works any more."""


def begin_attempt(coordinator: Coordinator, step: int, checkpoint: str | None) -> int | None:
    """Rank 0 writes the attempt's start; every rank gets the exit code of an attempt past the
    budget (it must end at once), else None."""
    outcome = coordinator.begin(
        resumed_from_step=step if checkpoint else None, checkpoint=checkpoint
    )
    code: int | None = broadcast_object(None if outcome is None else outcome.exit_code)
    return code


def end_attempt(
    coordinator: Coordinator, signum: int, step: int, checkpoint: str | None
) -> tuple[bool, int]:
    """Rank 0 handles the agreed stop (ledger, requeue); every rank gets (requeue asked, exit
    code)."""
    outcome = None
    if coordinator.dist.is_main:
        outcome = coordinator.stop(signum, step=step, checkpoint=checkpoint)
    asked, code = broadcast_object(
        (False, 0) if outcome is None else (outcome.requeue_requested, outcome.exit_code)
    )
    return bool(asked), int(code)


class Session:
    """One process's view of a distributed run; see the module docstring."""

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

    def start(self) -> Session:
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

    def __enter__(self) -> Session:
        return self if self.phase is not Phase.NEW else self.start()

    # --- model, data, state ---------------------------------------------------------------

    def wrap(self, model: nn.Module, *, exact: bool | None = None, **ddp_kwargs: Any) -> nn.Module:
        """``model`` moved to :attr:`device` and wrapped in DistributedDataParallel.

        ``exact`` (default: on CPU) fixes DDP's gradient-bucket layout up front, which
        bit-identical resume needs with 3+ ranks (see :func:`fix_bucket_layout`); on GPUs it is
        off by default because it costs the overlap of communication with the backward pass.
        """
        return wrap_model(model, self.device, exact=exact, **ddp_kwargs)

    def loader(
        self, dataset: Any, *, batch_size: int, seed: int | None = None, **kwargs: Any
    ) -> ResumableLoader:
        """This rank's batches of ``dataset``, resuming at :attr:`progress`.

        Keyword arguments go to :class:`~hpc_ddp.runtime.sampler.ResumableLoader` (``shuffle``,
        ``num_workers``, ``multiple_of``, ``pin_memory``, ``collate_fn``).
        """
        return ResumableLoader(
            dataset,
            self.progress,
            batch_size=batch_size,
            num_replicas=self.world_size,
            rank=self.rank,
            seed=self.config.train.seed if seed is None else seed,
            **kwargs,
        )

    def restore(
        self, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None
    ) -> Progress | None:
        """Track these objects for :meth:`checkpoint`, and load the newest good checkpoint.

        Returns the restored :attr:`progress`, or None on a first run (nothing loaded). Restores
        model, optimizer, scheduler, scaler and this rank's RNG states.
        """
        loaded = self._ckpt().restore(Tracked(model, optimizer, scheduler, scaler), self.progress)
        self._begin_attempt(None if loaded is None else loaded.name)
        return None if loaded is None else self.progress

    def _begin_attempt(self, checkpoint: str | None) -> None:
        """Ledger ``attempt_start``, once (collective): see :meth:`_write_start`."""
        if self.phase is Phase.STARTED:
            self.phase = Phase.TRAINING
            # TensorBoard drops what an earlier attempt logged after this checkpoint's step.
            self._metrics.resume_at(self.progress.step)
            self._write_start(checkpoint)

    def _write_start(self, checkpoint: str | None) -> None:
        """Rank 0 writes the start; an attempt past the budget ends right here, on every rank."""
        assert self._coordinator is not None
        code = begin_attempt(self._coordinator, self.progress.step, checkpoint)
        if code is not None:
            self.phase = Phase.STOPPING
            self.close(keep_signal_handlers=True)
            raise RequeueExit(None, False, code)

    def checkpoint(self, *, wait: bool = False) -> Path | None:
        """Save the tracked objects and :attr:`progress` (collective; rank 0 writes).

        The file is written on a background thread; ``wait=True`` returns only once it is
        durable. A second call at the same step saves nothing. Returns the path on rank 0.
        """
        if self._checkpointer is None or self._checkpointer.tracked is None:
            raise HpcDdpError(
                "nothing to checkpoint. HINT: call session.restore(model=..., optimizer=...) "
                "first: it names the objects a checkpoint saves."
            )
        return self._checkpointer.save(self.progress, wait=wait)

    # --- stopping -----------------------------------------------------------------------

    @property
    def stop_signal(self) -> int | None:
        """The stop signal all ranks agreed on, or None."""
        return self.stop_flag.agreed

    def should_stop(self) -> bool:
        """Collective, between steps: has any rank been told to stop? (one tiny all-reduce).

        Call it at the same steps on every rank; :meth:`steps` calls it where its
        :attr:`cadence` says so, at least every ``AGREE_BUDGET_S`` (0.1 s) of training.
        """
        step = self.progress.step
        # Alone, agreeing costs nothing (no collective): then a stop comes at the very step.
        every = 1 if self.world_size == 1 else self.cadence.propose(step)
        stop = self.stop_flag.agree(self.device, every=every) is not None
        self.cadence.agreed(step, self.stop_flag.every)
        return stop

    def steps(self, total: int, *, checkpoint_every: int = 0) -> Iterator[int]:
        """The step numbers still to run, ``progress.step + 1`` to ``total``.

        Inside the loop body ``progress.step`` already is the step being run, so a checkpoint
        taken at the end of the body records it as done. When the body comes back, a periodic
        checkpoint is saved every ``checkpoint_every`` steps and the ranks agree on stop
        signals; on a stop, :meth:`requeue` saves a checkpoint and ends the attempt.
        """
        self._begin_attempt(None)
        while self.progress.step < total:
            self.progress.step += 1
            yield self.progress.step
            if checkpoint_every > 0 and self.progress.step % checkpoint_every == 0:
                self.checkpoint()
            # At the last step a stop changes nothing: the run ends and saves anyway.
            step = self.progress.step
            if step < total and self.cadence.due(step) and self.should_stop():
                self.requeue()

    def requeue(self) -> NoReturn:
        """End this attempt so the job can come back (every rank calls it).

        First the tracked objects are checkpointed (if :meth:`restore` named any) and the file
        is made durable. Then rank 0 asks ``scontrol show job`` why the stop came and asks
        Slurm to requeue the job (``scontrol requeue``) unless Slurm is already requeueing or
        cancelling it (:class:`hpc_ddp.runtime.requeue.Coordinator`).
        All ranks leave the process group
        and raise :class:`RequeueExit`, with a non-zero code when the job will not come back
        (budget spent, requeue request failed). Signals arriving meanwhile (Slurm's SIGTERM
        after a requeue) are only recorded.
        """
        signum = self.stop_flag.agreed
        if self.phase not in (Phase.STARTED, Phase.TRAINING):
            raise RequeueExit(signum, False)
        begun = self.phase is Phase.TRAINING
        self.phase = Phase.STOPPING
        ckpt = self._ckpt()
        if ckpt.tracked is not None:
            ckpt.save(self.progress, wait=True)  # saves nothing new when this step is saved
        else:
            ckpt.sync_errors()  # every rank got here, nothing is being written
        if not begun:
            self._write_start(None)
        assert self._coordinator is not None
        asked, code = end_attempt(
            self._coordinator,
            signum if signum is not None else self.requeue_signal,
            self.progress.step,
            self._last_name(),
        )
        # The handlers stay installed until the process is gone: the SIGTERM Slurm sends after
        # a requeue must not kill a process that is exiting cleanly.
        self.close(keep_signal_handlers=True)
        raise RequeueExit(signum, asked and self.is_main, code)

    # --- metrics --------------------------------------------------------------------------

    def log(self, **metrics: Any) -> None:
        """Append one row to ``RUN_DIR/metrics.jsonl`` (rank 0 only; other ranks do nothing)."""
        if self.is_main:
            self._metrics.write({"time": time.time(), **metrics})


def session(
    run_dir: str | Path | None = None,
    config: JobConfig | None = None,
    *,
    slurm: SlurmClient | None = None,
) -> Session:
    """A started :class:`Session`; use it as a context manager so it always closes.

    ``run_dir``: this argument, else ``$HPC_DDP_RUN_DIR``, else ``./hpc-ddp-run``. ``config``:
    this argument, else ``RUN_DIR/config.yaml`` when present, else the defaults. ``slurm``:
    the client that asks Slurm for requeues (tests pass one over
    :class:`~hpc_ddp.slurm.fake.FakeSlurm`).
    """
    return Session(run_dir, config, slurm=slurm).start()
