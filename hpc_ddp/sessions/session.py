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
            s.log(step=step, loss=loss.item())  # metrics.jsonl; rank 0's progress lines
    # leaving the block normally saves the final step (unless it is saved already)

Works under the Slurm runtime, under ``torchrun``, and as one plain process. Every method that
talks to the other ranks (``restore``, ``checkpoint``, ``should_stop``, ``steps``, ``requeue``,
``main_first``) must be called by every rank at the same point. A stop ends with
:class:`RequeueExit`: exit status 0, the state safely on disk, and the job requeued (or Slurm
requeueing it); a stop that needed a requeue and could not get one exits non-zero, so Slurm
records the job FAILED.

While a session is open, the requeue signal, SIGTERM (and SIGINT outside Slurm, unless the
process was started with it ignored) are only recorded; they take effect where the loop asks
(:meth:`Session.steps`, or :meth:`Session.should_stop` in a loop of your own). A loop that
never asks is not stopped by them, and Slurm kills it after ``KillWait``.

At another world size (a ``slurm.min_nodes`` allocation that came with fewer nodes, ``hpc-ddp
resume RUN slurm.nodes=1 --elastic``) a loop keeps the run's global batch by running
:attr:`Session.grad_accum` micro-batches per optimizer step, and says so with
``s.restore(..., elastic=True)``; the rest of the interrupted epoch is then dealt out over the
new ranks by global sample index (sample-exact, not bit-exact). A loop that does not say so is
refused a world size other than its checkpoint's.

With ``fault.enabled`` the rank's watchdog (:mod:`hpc_ddp.fault.watchdog`) is told where the
session is: start-up, each step boundary, checkpoints, and any long work wrapped in
:meth:`Session.section` (an evaluation), each against its own deadline. A step that runs past
its deadline, or a peer that stops beating, ends the launch; under a supervisor a new launch
resumes from the newest checkpoint.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from hpc_ddp.backends.allocation import Allocation
from hpc_ddp.backends.node_registry import allocation_for
from hpc_ddp.checkpoint.checkpointer import Checkpointer, broadcast_object
from hpc_ddp.checkpoint.tracked import Tracked
from hpc_ddp.config.elastic import Resize
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import Params
from hpc_ddp.errors import ConfigError, HpcDdpError
from hpc_ddp.exitcodes import REQUEUE_EXIT_CODE
from hpc_ddp.fault.rankwatch import RankWatch
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.run_id import read_run_id
from hpc_ddp.runtime.distenv import DistEnv
from hpc_ddp.runtime.handoff import MAIN_FIRST_TIMEOUT_S, Turns, leader_first
from hpc_ddp.runtime.metrics import MetricsWriter, metric_row
from hpc_ddp.runtime.procgroup import wrap_model
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.runtime.progress_log import ProgressLog
from hpc_ddp.runtime.rng import StepSeeds
from hpc_ddp.runtime.sampler import ResumableLoader
from hpc_ddp.runtime.sharding import STRATEGIES, mixed_precision, shard_model
from hpc_ddp.runtime.stopflag import AgreementCadence, StopFlag
from hpc_ddp.sessions.attempt import SessionAttempt
from hpc_ddp.sessions.autointerval import loop_interval
from hpc_ddp.sessions.evaluation import EvalLoader
from hpc_ddp.sessions.startup import (
    Rank,
    StartupMarks,
    session_config,
    session_run_dir,
    start_rank,
)

log = logging.getLogger("hpc_ddp")


class RequeueExit(SystemExit):
    """Raised on every rank once a stop is handled: checkpoint durable, process group gone.

    Exit status 0 (:data:`REQUEUE_EXIT_CODE`): the process ended on purpose and nothing was
    lost. A run that will not come back exits non-zero, so Slurm records it FAILED, never
    COMPLETED with training unfinished: :data:`hpc_ddp.exitcodes.BUDGET_EXIT_CODE` when its
    requeue budget ran out,
    :data:`hpc_ddp.exitcodes.REQUEUE_FAILED_EXIT_CODE` when the requeue
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


class Session:
    """One process's view of a distributed run; see the module docstring."""

    dist: DistEnv
    """Rank, world, launcher and Slurm job of this process (set by :meth:`start`)."""
    backend: str
    grad_accum: int
    """Micro-batches each rank runs per optimizer step (set by :meth:`start`):
    ``train.grad_accum``, or more at a smaller world size than ``slurm.nodes`` (a
    ``slurm.min_nodes`` allocation, ``hpc-ddp resume --elastic``), so that the global batch
    stays the run's. A loop that runs this many and passes ``elastic=True`` to
    :meth:`restore` may go on at another world size; :meth:`loader` trims epochs to it."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        config: JobConfig | None = None,
        env: Mapping[str, str] | None = None,
        *,
        allocation: Allocation | None = None,
        dist: DistEnv | None = None,
    ) -> None:
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self._given_dist = dist  # the task's, derived from this env (None: derived at start)
        self.run_dir, self._picked = session_run_dir(run_dir, self.env)
        self.paths = RunPaths(self.run_dir)
        self.config = config if config is not None else session_config(self.paths)
        self._run_id: str | None = None
        self.progress = Progress()
        self.device = torch.device("cpu")
        self.stop_flag = StopFlag(())
        self.cadence = AgreementCadence()
        """When :meth:`steps` agrees on stops; ``AgreementCadence(fixed=1)`` for every step."""
        self.phase = Phase.NEW
        self._allocation = allocation  # None: the one this env belongs to, made at start
        tensorboard = self.paths.tensorboard if self.config.train.tensorboard else None
        self._metrics = MetricsWriter(self.paths.metrics, tensorboard_dir=tensorboard)
        self._rank: Rank | None = None  # what start() set up, and close() takes down
        self._attempt: SessionAttempt | None = None  # its checkpoints and ledger (at start)
        self._began = time.time()  # before any peer of this attempt can write its start
        self._turns = Turns()  # main_first calls so far, per group: the store keys
        self._watch = RankWatch.off()  # the rank's watchdog and exit note (at start)
        self._training_data = False  # s.loader() called: its Progress is the data position
        self._progress_log = ProgressLog(self.config.train.log_every, self.paths.live_progress)
        self._startup = StartupMarks()
        self.startup: list[tuple[str, float]] = self._startup.marks
        """Wall-clock marks of this launch's start-up, in order: the process's start, then
        the end of each phase (``session``: its imports done, ``process group``, ``model``:
        wrapped and on its device, ``restore``, ``first step``). Logged at the first step."""
        self._startup.mark("session")

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Session:
        """Catch stop signals, join the process group, pick the device."""
        rank = start_rank(self.config, self.run_dir, self.env, self._given_dist)
        self._rank, self.dist, self._watch = rank, rank.dist, rank.watch
        self.stop_flag, self.requeue_signal = rank.stop_flag, rank.requeue_signal
        self.device, self.grad_accum = rank.device, rank.grad_accum
        self.backend = rank.group.backend
        self.phase = Phase.STARTED
        self._startup.mark("process group")
        allocation = self._allocation or allocation_for(self.env)
        self._attempt = SessionAttempt.open(
            rank, self.paths, self.config, self.progress,
            run_id=self.run_id, allocation=allocation, since=self._began, env=self.env,
        )  # fmt: skip
        rank.log_start(self.run_dir, self.run_id, self._picked)
        return self

    def close(self, *, keep_signal_handlers: bool = False, together: bool = True) -> None:
        """Wait for a checkpoint in flight, leave the process group, restore signal handlers.

        ``together``: every rank is closing too (a finished run, an agreed stop), so they
        leave the group together (see :func:`~hpc_ddp.runtime.procgroup.destroy_process_group`);
        False after an error, when a peer may be gone.
        """
        if self.phase is Phase.CLOSED:
            return
        self.phase = Phase.CLOSED
        self._watch.enter("closing")
        try:
            if together:
                self.stop_flag.settle()  # a loop left early may leave an agreement in flight
            if self._attempt is not None:
                # Together: the others wait for rank 0's write on the store, not in the
                # leaving barrier (a collective, which dist.timeout_s would cut short).
                self._attempt.checkpointer.wait(together=together)
        finally:
            self._metrics.close()
            if self._rank is not None:
                self._rank.leave(together=together, keep_signal_handlers=keep_signal_handlers)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None or isinstance(exc, SystemExit):
            stopped = isinstance(exc, SystemExit) and exc.code not in (0, None)
            if isinstance(exc, RequeueExit) or stopped:
                # An agreed stop or a failure, not a loop left early.
                self._watch.left_loop(self.progress.step, None)
            # After a stop the coordinator has written the attempt's end: finish() adds none.
            if exc_type is None and self._attempt is not None:
                self._attempt.finish(began=self.phase is Phase.TRAINING)
            self.close()
            return
        if self._attempt is not None and isinstance(exc, BaseException):
            self._attempt.crash(exc)
        try:
            self.close(together=False)
        except Exception:  # do not hide the error that is already on its way out
            log.exception("while closing the session after an error")

    def section(self, name: str, *, timeout_s: float | None = None) -> AbstractContextManager[None]:
        """``with s.section("eval"):`` long work outside a training step, timed against its own
        deadline (``timeout_s``, default ``fault.checkpoint_timeout_s``) instead of the step
        timeout, which follows the observed step times and would call it a hang."""
        return self._watch.section(name, timeout_s)

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

    def main_first(
        self, *, timeout_s: float = MAIN_FIRST_TIMEOUT_S
    ) -> AbstractContextManager[None]:
        """``with s.main_first():`` rank 0 runs the block first, every other rank after it.

        For work one rank must do before the others read its result (unpack a dataset, build
        a cache)::

            with s.main_first():
                dataset = build_or_load_cache(path)   # rank 0 builds it, the others load it

        The others wait outside any collective (on the process group's store), so rank 0 may
        take longer than ``dist.timeout_s``; they wait at most ``timeout_s``. If rank 0 fails
        in the block, they raise :class:`~hpc_ddp.errors.PeerError` naming its error instead
        of running it; if rank 0 dies, they raise it at once. A stop signal meanwhile is only
        recorded, and every rank stops at the next agreement point after the block
        (:meth:`steps`, :meth:`should_stop`). Every rank must enter the same ``main_first``
        blocks in the same order, and a block must not call collectives (the others are not
        there yet): no ``barrier``, ``checkpoint`` or ``should_stop`` inside.
        """
        return self._first_turn("all", self.is_main, "rank 0", timeout_s)

    def local_main_first(
        self, *, timeout_s: float = MAIN_FIRST_TIMEOUT_S
    ) -> AbstractContextManager[None]:
        """:meth:`main_first` per node: each node's local rank 0 runs the block first, the
        node's other ranks after it (a cache on node-local disk such as ``/tmp``)."""
        node = self.dist.node_name or str(self.dist.node_rank)
        leader = f"local rank 0 of node {node}"
        return self._first_turn(
            f"node{self.dist.node_rank}", self.local_rank == 0, leader, timeout_s
        )

    def _first_turn(
        self, group: str, is_leader: bool, leader: str, timeout_s: float
    ) -> AbstractContextManager[None]:
        if self.phase not in (Phase.STARTED, Phase.TRAINING, Phase.STOPPING):
            raise HpcDdpError(
                f"main_first needs a started session (this one is {self.phase.value}). HINT: "
                "use it inside `with hpc_ddp.session() as s:`."
            )
        members = self.world_size if group == "all" else self.dist.local_world_size
        turn = self._turns.next(
            group, is_leader=is_leader, leader=leader, rank=self.rank, members=members,
            timeout_s=timeout_s,
        )  # fmt: skip
        # Private but stable since torch 1.8: the store the default process group was formed on.
        store = None if members == 1 else dist.distributed_c10d._get_default_store()
        return leader_first(store, turn)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a small picklable value)."""
        return broadcast_object(obj)

    def _started(self) -> SessionAttempt:
        if self._attempt is None:
            raise HpcDdpError(
                "the session is not started. HINT: use it inside `with hpc_ddp.session() as s:`."
            )
        return self._attempt

    def _ckpt(self) -> Checkpointer:
        return self._started().checkpointer

    def __enter__(self) -> Session:
        return self if self.phase is not Phase.NEW else self.start()

    # --- model, data, state ---------------------------------------------------------------

    def wrap(
        self,
        model: nn.Module,
        *,
        exact: bool | None = None,
        strategy: str | None = None,
        shard: Sequence[str] | None = None,
        **ddp_kwargs: Any,
    ) -> nn.Module:
        """``model`` moved to :attr:`device` and wrapped in DistributedDataParallel, or sharded
        with FSDP2.

        ``strategy``: ``ddp`` or ``fsdp`` (default: ``train.strategy``). ``fsdp`` shards per
        block, then the root (:mod:`hpc_ddp.runtime.sharding`): ``shard`` names the blocks
        (class names or attribute paths; default: a ResNet's stages, else the root's children
        with parameters), and ``train.amp`` on a GPU gathers parameters in bfloat16. A sharded
        model's checkpoints are sharded too: every rank writes its own shard.

        ``exact`` (DDP; default: on CPU) fixes DDP's gradient-bucket layout up front, which
        bit-identical resume needs with 3+ ranks (see :func:`fix_bucket_layout`); on GPUs it is
        off by default because it costs the overlap of communication with the backward pass.
        """
        strategy = self.config.train.strategy if strategy is None else strategy
        if strategy not in STRATEGIES:
            raise ConfigError(
                f"wrap(strategy={strategy!r}) is not one of {', '.join(STRATEGIES)}. HINT: "
                "strategy='ddp' keeps a full copy per rank; 'fsdp' shards the model."
            )
        if strategy == "fsdp":
            policy = mixed_precision(self.config.train.amp, self.device)
            wrapped = shard_model(model, self.device, shard=shard, mp_policy=policy)
        else:
            wrapped = wrap_model(model, self.device, exact=exact, **ddp_kwargs)
        self._startup.mark("model")
        return wrapped

    def loader(
        self, dataset: Any, *, batch_size: int, seed: int | None = None, **kwargs: Any
    ) -> ResumableLoader:
        """This rank's batches of ``dataset``, resuming at :attr:`progress`.

        Keyword arguments go to :class:`~hpc_ddp.runtime.sampler.ResumableLoader` (``shuffle``,
        ``num_workers``, ``multiple_of``, ``pin_memory``, ``collate_fn``); ``multiple_of``
        defaults to :attr:`grad_accum`, so that an epoch is whole optimizer steps, the same
        number at every world size with the same global batch.
        """
        if self._training_data:
            raise HpcDdpError(
                "s.loader() was already called in this session: a second loader would share "
                "and move the training data position that checkpoints save (Progress), so "
                "training would skip samples. HINT: evaluate with `s.eval_loader(dataset, "
                "batch_size=...)`, which never touches the training position; keep one "
                "s.loader() for the training data."
            )
        self._training_data = True
        self._progress_log.step_samples = batch_size * self.world_size * self.grad_accum
        kwargs.setdefault("multiple_of", self.grad_accum)
        kwargs.setdefault("on_wait", self._watch.waiting_for_data)
        return ResumableLoader(
            dataset,
            self.progress,
            batch_size=batch_size,
            num_replicas=self.world_size,
            rank=self.rank,
            seed=self.config.train.seed if seed is None else seed,
            **kwargs,
        )

    def eval_loader(self, dataset: Any, *, batch_size: int, **kwargs: Any) -> EvalLoader:
        """This rank's batches of an evaluation set: every sample exactly once over all ranks
        (contiguous shards, no padding duplicates), in order, and sums that reduce exactly
        over the ranks (:meth:`~hpc_ddp.sessions.evaluation.EvalLoader.add`, ``reduce``).

        It never touches the training data position (:attr:`progress`) or the global RNG, so
        training after an evaluation goes on exactly as without one. Keyword arguments:
        ``num_workers``, ``pin_memory``, ``collate_fn``. Wrap the evaluation in
        ``s.section("eval")`` so the watchdog does not take it for a hung step.
        """
        return EvalLoader(
            dataset,
            batch_size=batch_size,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            **kwargs,
        )

    def restore(
        self,
        *,
        model: nn.Module,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        elastic: bool = False,
        **objects: Any,
    ) -> Progress | None:
        """Track these objects for :meth:`checkpoint`, and load the newest good checkpoint.

        Returns the restored :attr:`progress`, or None on a first run (nothing loaded). Restores
        model, optimizer, scheduler, scaler, any more ``objects`` and this rank's RNG states.

        ``objects``: any number of further objects by name, each with ``state_dict()`` and
        ``load_state_dict()`` (torch DCP's ``Stateful``): an EMA copy, a GAN's second model and
        optimizer, a curriculum. Each is saved with its own digest and verified on load like
        the model; a checkpoint that lacks one of them is refused (:class:`ConfigError`), so
        pass them under the same names in every attempt. ``model`` is the run's main model:
        its digest is the weights digest that ``hpc-ddp checkpoints`` shows.

        ``elastic=True`` says this loop runs :attr:`grad_accum` micro-batches per optimizer
        step and takes its data from :meth:`loader`: it may then go on from a checkpoint of
        another world size, with the same global batch, the rest of the interrupted epoch dealt
        out over this world's ranks and the RNG reseeded from (seed, step, rank) (sample-exact,
        not bit-exact; the log and the ledger say so). Without it a world size other than the
        checkpoint's, or than ``slurm.nodes`` asks for, is refused (:class:`ConfigError`).
        """
        tracked = Tracked(model, optimizer, scheduler, scaler, objects)
        loaded = self._started().restore(tracked, elastic=elastic)
        self._startup.mark("restore")
        self._begin_attempt(loaded)
        return None if loaded is None else self.progress

    @property
    def resize(self) -> Resize | None:
        """How :meth:`restore` changed the world size (None: it did not), for the log."""
        return None if self._attempt is None else self._attempt.checkpointer.resize

    def _begin_attempt(self, checkpoint: str | None) -> None:
        """Ledger ``attempt_start``, once (collective): see :meth:`_write_start`."""
        if self.phase is Phase.STARTED:
            self.phase = Phase.TRAINING
            # TensorBoard drops what an earlier attempt logged after this checkpoint's step.
            self._metrics.resume_at(self.progress.step)
            self._write_start(checkpoint)

    def _write_start(self, checkpoint: str | None) -> None:
        """Rank 0 writes the start; an attempt past the budget ends right here, on every rank."""
        code = self._started().begin(checkpoint)
        if code is not None:
            self.phase = Phase.STOPPING
            self.close(keep_signal_handlers=True)
            raise RequeueExit(None, False, code)

    def checkpoint(self, *, wait: bool = False) -> Path | None:
        """Save the tracked objects and :attr:`progress` (collective; rank 0 writes).

        The file is written on a background thread; ``wait=True`` returns only once it is
        durable. A second call at the same step saves nothing. Returns the path on rank 0.
        """
        return self._started().save(wait=wait)

    # --- stopping -----------------------------------------------------------------------

    @property
    def stop_signal(self) -> int | None:
        """The stop signal all ranks agreed on, or None."""
        return self.stop_flag.agreed

    def should_stop(self) -> bool:
        """Collective, between steps: has any rank been told to stop? (one tiny all-reduce).

        Call it at the same steps on every rank. It reads the answer at once, which on a GPU
        waits for the work queued before it; :meth:`steps` agrees at least every
        ``AGREE_BUDGET_S`` (0.1 s) of training and reads each answer one agreement later.
        """
        step = self.progress.step
        if self.world_size == 1:  # alone: no collective, and a stop comes at the very step
            self.cadence.agreed(step, 1)
            return self.stop_flag.agree_alone() is not None
        stop = self.stop_flag.agree(self.device, every=self.cadence.propose(step)) is not None
        self.cadence.agreed(step, self.stop_flag.every)
        return stop

    def steps(self, total: int, *, checkpoint_every: int | Literal["auto"] = 0) -> Iterator[int]:
        """The step numbers still to run, ``progress.step + 1`` to ``total``.

        Inside the loop body ``progress.step`` already is the step being run, so a checkpoint
        taken at the end of the body records it as done. When the body comes back, a periodic
        checkpoint is saved every ``checkpoint_every`` steps and the ranks agree on stop
        signals; on a stop, :meth:`requeue` saves a checkpoint and ends the attempt.
        ``checkpoint_every="auto"``: the interval is chosen from the measured save cost, step
        time and interruption rate, within ``train.checkpoint_min_s``/``checkpoint_max_s``,
        and chosen again after every save (:mod:`hpc_ddp.sessions.autointerval`).
        """
        every = loop_interval(checkpoint_every)  # None: "auto"
        self._begin_attempt(None)
        attempt = self._started()
        auto = attempt.auto_checkpoints() if every is None else None
        first = self.progress.step + 1
        attempt.arm_rescue(self.config.train.seed)
        seeds = StepSeeds(self.config.train.seed, self.rank, self.device)
        self._watch.enter("step")
        self._progress_log.begin(self.progress.step, total)
        self._watch.left_loop(self.progress.step, None)  # a new loop
        try:
            while self.progress.step < total:
                self.progress.step += 1
                seeds.seed_step(self.progress.step)  # no rank's streams are its own alone
                yield self.progress.step
                attempt.completed()
                if self._startup.open:
                    self._startup.first_step_done(self.config.dist)
                self._watch.step_done(self.progress.step)
                if auto is not None:
                    auto.after_step(self.progress.step, first, attempt.save)
                elif every and self.progress.step % every == 0:
                    self.checkpoint()
                # At the last step a stop changes nothing: the run ends and saves anyway.
                step = self.progress.step
                if step < total and self.cadence.due(step) and self._stop_between_steps():
                    self.requeue()
        except GeneratorExit:
            # Left mid-loop (a break, sys.exit, or an exception unwinding, which __exit__
            # then corrects): said now, before a later collective can block this rank.
            if self.phase is Phase.TRAINING and self.progress.step < total:
                self._watch.left_loop(self.progress.step, (self.progress.step, total))
            raise
        self.stop_flag.settle()  # an agreement launched before the last step

    def _stop_between_steps(self) -> bool:
        """The stop agreement of :meth:`steps`, at a boundary its :attr:`cadence` picked: alone
        (a rank agrees with itself, at the very step) or at a fixed cadence (a test that needs
        the stop after an exact step) :meth:`should_stop`, else the agreement in flight
        (:meth:`StopFlag.between_steps`)."""
        if self.world_size == 1 or self.cadence.fixed is not None:
            return self.should_stop()
        return self.stop_flag.between_steps(self.device, self.cadence, self.progress.step)

    def requeue(self) -> NoReturn:
        """End this attempt so the job can come back (every rank calls it).

        First the tracked objects are checkpointed (if :meth:`restore` named any) and the file
        is made durable. Then rank 0 asks ``scontrol show job`` why the stop came and asks
        Slurm to requeue the job (``scontrol requeue``) unless Slurm is already requeueing or
        cancelling it (:class:`hpc_ddp.fault.coordinator.Coordinator`). All ranks leave the
        process group and raise :class:`RequeueExit`, with a non-zero code when the job will not
        come back (budget spent, requeue request failed). Signals arriving meanwhile (Slurm's
        SIGTERM after a requeue) are only recorded.
        """
        signum = self.stop_flag.agreed
        if self.phase not in (Phase.STARTED, Phase.TRAINING):
            raise RequeueExit(signum, False)
        begun = self.phase is Phase.TRAINING
        self.phase = Phase.STOPPING
        attempt = self._started()
        attempt.save_at_stop()
        if not begun:
            self._write_start(None)
        asked, code = attempt.stop(signum if signum is not None else self.requeue_signal)
        # The handlers stay installed until the process is gone: the SIGTERM Slurm sends after
        # a requeue must not kill a process that is exiting cleanly.
        self.close(keep_signal_handlers=True)
        raise RequeueExit(signum, asked and self.is_main, code)

    # --- metrics --------------------------------------------------------------------------

    def log(self, **metrics: Any) -> None:
        """Append one row to ``RUN_DIR/metrics.jsonl`` (rank 0 only; other ranks do nothing).

        A row with a ``step`` also makes rank 0 log a progress line every ``train.log_every``
        steps and at the last (``step 120/600 | epoch 1 | loss 0.4321 | 2345 samples/s | ETA
        0:01:23``: the total from :meth:`steps`, samples/s from :meth:`loader`'s batches or a
        ``samples_per_s`` in the row), and update what ``hpc-ddp status`` shows of it.

        Tensors and numpy values become numbers; non-finite ones are written as null; a value
        of more than one element is refused on every rank (:func:`metric_row`)."""
        metrics = metric_row(metrics, convert=self.is_main)
        if self.is_main:
            self._metrics.write({"time": time.time(), **metrics})
            if self._attempt is not None:  # train.keep_best ranks checkpoints by them
                step = metrics.get("step")
                self._attempt.checkpointer.observe(
                    step if isinstance(step, int) else self.progress.step, metrics
                )
            line = self._progress_log.row(metrics, epoch=self.progress.epoch)
            if line is not None:
                log.info(line)


def session(
    run_dir: str | Path | None = None,
    config: JobConfig | None = None,
    *,
    allocation: Allocation | None = None,
) -> Session:
    """A started :class:`Session`; use it as a context manager so it always closes.

    ``run_dir``: this argument, else ``$HPC_DDP_RUN_DIR``, else ``./hpc-ddp-run`` or, once a run
    there finished, the next of ``./hpc-ddp-run-2``, ``-3``, ...
    (:mod:`hpc_ddp.rundir.numbering`). ``config``:
    this argument, else ``RUN_DIR/config.yaml`` when present, else the defaults.
    ``allocation``: the scheduler's node face that asks for requeues (None: the one the
    environment belongs to; tests pass Slurm's over
    :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`).
    """
    return Session(run_dir, config, allocation=allocation).start()
