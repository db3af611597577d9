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

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from torch import nn

from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.runtime.checkpointer import Tracked
from hpc_ddp.runtime.ddp import fix_bucket_layout, unwrap, wrap_model
from hpc_ddp.runtime.lifecycle import (
    REQUEUE_EXIT_CODE,
    Phase,
    RequeueExit,
    begin_attempt,
    end_attempt,
)
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.sampler import ResumableLoader
from hpc_ddp.runtime.session_base import DEFAULT_RUN_DIR, SessionBase
from hpc_ddp.slurm.client import SlurmClient

# Re-exported: they lived here before the lifecycle, DDP helpers and the session's process
# plumbing (hpc_ddp.runtime.session_base) were split out.
__all__ = [
    "DEFAULT_RUN_DIR",
    "REQUEUE_EXIT_CODE",
    "Phase",
    "RequeueExit",
    "Session",
    "fix_bucket_layout",
    "session",
    "unwrap",
]


class Session(SessionBase):
    """One process's view of a distributed run; see the module docstring.

    Construction, :meth:`start`, :meth:`close`, who and where this process is (``rank``,
    ``world_size``, ``is_main``, ``run_id``, ``params``...) come from
    :class:`~hpc_ddp.runtime.session_base.SessionBase`.
    """

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
