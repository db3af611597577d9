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

import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.config.load import job_config_to_dict, load_resolved_config
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError, HpcDdpError
from hpc_ddp.rundir import PER_RANK_LOGS_ENV, RUN_DIR_ENV, RunPaths
from hpc_ddp.runtime.checkpoint import (
    CheckpointWriter,
    Progress,
    build_payload,
    capture_rng_state,
    checkpoint_name,
    find_latest,
    load_checkpoint,
    restore_rng_state,
    snapshot,
)
from hpc_ddp.runtime.distenv import DistEnv, derive_dist_env
from hpc_ddp.runtime.metrics import MetricsWriter, setup_rank_logging
from hpc_ddp.runtime.procgroup import destroy_process_group, init_process_group
from hpc_ddp.runtime.requeue import Coordinator
from hpc_ddp.runtime.sampler import ResumableLoader
from hpc_ddp.runtime.stopcause import signal_number
from hpc_ddp.runtime.stopflag import StopFlag

log = logging.getLogger("hpc_ddp")

"""Set to 1 where every rank has its own log file (the rendered script, the local backend)."""
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


@dataclass
class _Tracked:
    model: nn.Module
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (and ``torch.compile``) wrappers."""
    inner: Any = model
    while True:
        if isinstance(inner, nn.parallel.DistributedDataParallel):
            inner = inner.module
        elif hasattr(inner, "_orig_mod"):
            inner = inner._orig_mod
        else:
            return inner  # type: ignore[no-any-return]


def fix_bucket_layout(ddp: nn.parallel.DistributedDataParallel) -> None:
    """Give DDP its final gradient-bucket layout now, the same in every attempt (collective).

    DDP reduces the first backward pass in one bucket holding every gradient and then rebuilds
    its buckets in the order gradients became ready. A resumed attempt's first step would so
    use another layout than the uninterrupted run's step at that point; with 3+ ranks the ring
    all-reduce then adds each gradient's terms in another order, and the weights drift by a few
    ulps. (With 2 ranks a + b == b + a, and nothing changes.) Rebuilding at once, in parameter
    order, makes the layout a function of the model alone.
    """
    reducer: Any = ddp.reducer
    if not all(hasattr(reducer, m) for m in ("_push_all_rebuilt_params", "_rebuild_buckets")):
        log.warning(
            "this torch's DDP cannot fix its bucket layout: resume is exact only on 2 ranks"
        )
        return
    reducer._push_all_rebuilt_params()  # private API, present in torch 1.10 through 2.14
    reducer._rebuild_buckets()


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
    ) -> None:
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.run_dir = Path(run_dir or self.env.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR).resolve()
        self.paths = RunPaths(self.run_dir)
        self.config = config if config is not None else self._load_config()
        self.progress = Progress()
        self.device = torch.device("cpu")
        self._signal_name = self.config.requeue.signal
        self.stop_flag = StopFlag(())
        self._tracked: _Tracked | None = None
        self._last_saved: int | None = None
        self._writer = CheckpointWriter(self.paths.checkpoints, self.config.train.keep_last)
        self._metrics = MetricsWriter(self.paths.metrics)
        self._log_handler: logging.Handler | None = None
        self._started = False
        self._closed = False
        self._requeued = False
        self._coordinator: Coordinator | None = None
        self._begun = False

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
        self._started = True
        self._coordinator = Coordinator(self.dist, self.paths.ledger, self.config.requeue)
        if self.is_main:
            self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
        log.info(
            "session: rank %d/%d (%s, %s on %s), run dir %s",
            self.rank,
            self.world_size,
            self.dist.launcher,
            info.backend,
            self.device,
            self.run_dir,
        )
        return self

    def close(self, *, keep_signal_handlers: bool = False) -> None:
        """Wait for a checkpoint in flight, leave the process group, restore signal handlers."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started and self.is_main:
                self._writer.wait()
        finally:
            self._metrics.close()
            if self._started:
                destroy_process_group()
            if not keep_signal_handlers:
                self.stop_flag.close()
            if self._log_handler is not None:
                log.removeHandler(self._log_handler)

    def __enter__(self) -> Session:
        return self if self._started else self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None or isinstance(exc, SystemExit):
            if exc_type is None and self._coordinator is not None and not self._requeued:
                self._coordinator.finish(step=self.progress.step, checkpoint=self._last_name())
            self.close()
            return
        if self._coordinator is not None and isinstance(exc, BaseException):
            self._coordinator.crash(
                step=self.progress.step, checkpoint=self._last_name(), error=exc
            )
        try:
            self.close()
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

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a small picklable value)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # --- model, data, state ---------------------------------------------------------------

    def wrap(self, model: nn.Module, *, exact: bool | None = None, **ddp_kwargs: Any) -> nn.Module:
        """``model`` moved to :attr:`device` and wrapped in DistributedDataParallel.

        ``exact`` (default: on CPU) fixes DDP's gradient-bucket layout up front, which
        bit-identical resume needs with 3+ ranks (see :func:`fix_bucket_layout`); on GPUs it is
        off by default because it costs the overlap of communication with the backward pass.
        """
        model = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)
        if exact if exact is not None else self.device.type == "cpu":
            fix_bucket_layout(ddp)
        return ddp

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
        self._tracked = _Tracked(model, optimizer, scheduler, scaler)
        choice: str | None = None
        payload: dict[str, Any] | None = None
        if self.is_main:
            try:
                found = find_latest(self.paths.checkpoints, self.device)
            except CheckpointError as exc:
                choice = f"error:{exc}"
            else:
                if found is not None:
                    choice, payload = found[0].name, found[1]
        choice = self.broadcast_object(choice)
        if choice is not None and choice.startswith("error:"):
            raise CheckpointError(choice.removeprefix("error:"))
        if choice is None:
            self._begin_attempt(None)
            return None
        if payload is None:
            payload = load_checkpoint(self.paths.checkpoints / choice, self.device)
        self._apply(payload, choice)
        self._begin_attempt(choice)
        return self.progress

    def _last_name(self) -> str | None:
        return None if self._last_saved is None else f"step-{self._last_saved:08d}.pt"

    def _begin_attempt(self, checkpoint: str | None) -> None:
        """Ledger ``attempt_start`` (collective): an attempt past the budget ends right here."""
        if self._begun or self._coordinator is None:
            return
        self._begun = True
        outcome = self._coordinator.begin(
            resumed_from_step=self.progress.step if checkpoint else None, checkpoint=checkpoint
        )
        code = self.broadcast_object(None if outcome is None else outcome.exit_code)
        if code is not None:
            self._requeued = True
            self.close(keep_signal_handlers=True)
            raise RequeueExit(None, False, code)

    def _apply(self, payload: dict[str, Any], name: str) -> None:
        assert self._tracked is not None
        t = self._tracked
        unwrap(t.model).load_state_dict(payload["model"])
        for obj, key in (
            (t.optimizer, "optimizer"),
            (t.scheduler, "scheduler"),
            (t.scaler, "scaler"),
        ):
            if obj is not None and payload.get(key) is not None:
                obj.load_state_dict(payload[key])
        saved_world = int(payload["meta"]["world_size"])
        if saved_world == self.world_size:
            restore_rng_state(payload["rng"][self.rank], self.device)
        else:
            log.warning(
                "%s was written by %d ranks, this run has %d: the RNG states and data order "
                "differ from an uninterrupted run from here on",
                name,
                saved_world,
                self.world_size,
            )
        self.progress.update_from(payload["progress"], payload.get("extra") or {})
        self._last_saved = self.progress.step
        log.info(
            "resumed from %s: step %d, epoch %d, batch %d of the epoch",
            name,
            self.progress.step,
            self.progress.epoch,
            self.progress.batch_in_epoch,
        )

    def checkpoint(self, *, wait: bool = False) -> Path | None:
        """Save the tracked objects and :attr:`progress` (collective; rank 0 writes).

        The file is written on a background thread; ``wait=True`` returns only once it is
        durable. A second call at the same step saves nothing. Returns the path on rank 0.
        """
        t = self._tracked
        if t is None:
            raise HpcDdpError(
                "nothing to checkpoint. HINT: call session.restore(model=..., optimizer=...) "
                "first: it names the objects a checkpoint saves."
            )
        path = self.paths.checkpoints / checkpoint_name(self.progress.step)
        if self._last_saved != self.progress.step:
            rng = capture_rng_state(self.device)
            gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
            dist.gather_object(rng, gathered, dst=0)
            self._sync_errors()  # the previous background write, before starting the next
            if self.is_main:
                assert gathered is not None
                self._writer.submit(self._payload(t, gathered))
            self._last_saved = self.progress.step
        if wait:
            self._sync_errors()
        return path if self.is_main else None

    def _payload(self, t: _Tracked, rng: list[Any]) -> dict[str, Any]:
        def state(obj: Any) -> Any:
            return None if obj is None else snapshot(obj.state_dict())

        return build_payload(
            model=snapshot(unwrap(t.model).state_dict()),
            optimizer=state(t.optimizer),
            scheduler=state(t.scheduler),
            scaler=state(t.scaler),
            progress=self.progress,
            rng=rng,
            config=job_config_to_dict(self.config),
        )

    def _sync_errors(self) -> None:
        """Rank 0 waits for its writer; a failure becomes the same error on every rank."""
        error = None
        if self.is_main:
            try:
                self._writer.wait()
            except CheckpointError as exc:
                error = str(exc)
        error = self.broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)

    # --- stopping -----------------------------------------------------------------------

    @property
    def stop_signal(self) -> int | None:
        """The stop signal all ranks agreed on, or None."""
        return self.stop_flag.agreed

    def should_stop(self) -> bool:
        """Collective, between steps: has any rank been told to stop? (one tiny all-reduce)."""
        return self.stop_flag.agree(self.device) is not None

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
            if self.progress.step < total and self.should_stop():
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
        if self._requeued:
            raise RequeueExit(signum, False)
        self._requeued = True
        if self._tracked is not None:
            self.checkpoint(wait=True)  # saves nothing new when this step is already saved
        else:
            self._sync_errors()  # every rank got here, nothing is being written
        self._begin_attempt(None)
        outcome = None
        if self.is_main and self._coordinator is not None:
            outcome = self._coordinator.stop(
                signum if signum is not None else self.requeue_signal,
                step=self.progress.step,
                checkpoint=self._last_name(),
            )
        asked, code = self.broadcast_object(
            (False, 0) if outcome is None else (outcome.requeue_requested, outcome.exit_code)
        )
        # The handlers stay installed until the process is gone: the SIGTERM Slurm sends after
        # a requeue must not kill a process that is exiting cleanly.
        self.close(keep_signal_handlers=True)
        raise RequeueExit(signum, bool(asked) and self.is_main, int(code))

    # --- metrics --------------------------------------------------------------------------

    def log(self, **metrics: Any) -> None:
        """Append one row to ``RUN_DIR/metrics.jsonl`` (rank 0 only; other ranks do nothing)."""
        if self.is_main:
            self._metrics.write({"time": time.time(), **metrics})


def _signal_name(signum: int | None) -> str:
    return "none" if signum is None else signal.Signals(signum).name


def session(run_dir: str | Path | None = None, config: JobConfig | None = None) -> Session:
    """A started :class:`Session`; use it as a context manager so it always closes.

    ``run_dir``: this argument, else ``$HPC_DDP_RUN_DIR``, else ``./hpc-ddp-run``. ``config``:
    this argument, else ``RUN_DIR/config.yaml`` when present, else the defaults.
    """
    return Session(run_dir, config).start()
