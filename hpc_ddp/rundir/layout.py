"""The layout of a run directory: where the login-node side and the on-node runtime meet.

This module is the contract between the two sides, and nothing more: the names of the files
(checkpoint files included) and of every ``HPC_DDP_*`` environment variable, and
:class:`RunPaths`. It is pure (no file I/O, no environment reads), so that pure modules may
import it. Creating run directories is :mod:`hpc_ddp.submission.submit`; each file has the
module that reads and writes it (:mod:`hpc_ddp.rundir.manifest`, :mod:`hpc_ddp.rundir.run_id`,
:mod:`hpc_ddp.rundir.ledger`, ...), all writes go through :mod:`hpc_ddp.durable`.

Everything a later command needs (``status``, ``logs``, ``cancel``, a requeued attempt, a
``results`` table days later) is in here as plain text: YAML, JSON and JSON lines, no pickles.

    RUN_DIR/
      config.yaml        the resolved job config the runtime reads
      job.sbatch         the rendered script, exactly as submitted (Slurm runs only)
      manifest.json      job id, backend, submit time and command (written after submission)
      submit.lock        held while a job is chosen, submitted and recorded (one job per run)
      ledger.jsonl       one line per attempt event (start, end, cause)
      metrics.jsonl      rank-0 metrics
      progress.json      rank-0's live progress (step, total, samples/s, ETA), for ``status``
      run_id             ``<name>-<8 hex>``: one id for every attempt, for W&B and the like
      tensorboard/       rank-0 metrics as TensorBoard events (``train.tensorboard: true``)
      checkpoints/       step-XXXXXXXX.pt and a ``latest`` pointer
      logs/              batch-<job>.out/.err and rank-<N>.out/.err
      rendezvous/        file:// stores and the published master port
      launches/          <job>.<restart>.<launch>/: each rank's heartbeat, the fault record,
                         each rank's thread stacks (rank-<N>.stacks, hpc-ddp's own threads
                         included, kept out of the program's stderr);
                         bad_nodes.json: nodes the supervisor will not use again (``fault:``)
      local.json         local backend: the controller's identity (pid, start time, boot id)
      local-ranks/       local backend: rank-<N>.json, each rank process's identity
      local-cancelled    local backend: written by ``cancel`` before it signals
      submitit/          local backend: submitit's folder (each rank's result)

A sweep directory holds ``sweep.yaml``, ``arrays.json``, ``manifest.json``, ``submit.lock``,
``logs/`` (each array task's batch log, ``batch-<array job>_<task id>.out/.err``),
``task_configs.jsonl`` (every point's resolved config, one JSON line each) and ``tasks/``, which
gets one run directory ``tasks/<index>/`` with the layout above per point once its task
starts: submit writes no per-point file (a thousand fewer directories and files to create
then), the batch script makes ``logs/`` (for the rank logs) before ``srun``, and the task
writes its ``config.yaml`` from ``task_configs.jsonl`` before it reads it
(:mod:`hpc_ddp.rundir.taskconfig`). A point whose task has not started has no directory yet.
"""

from __future__ import annotations

import re
from pathlib import Path

from hpc_ddp.frozen import dataclass

MANIFEST_FILE = "manifest.json"
"""What was submitted, where and when: see :mod:`hpc_ddp.rundir.manifest`."""
RUN_ID_FILE = "run_id"
"""The run's stable id: see :mod:`hpc_ddp.rundir.run_id`."""
TASK_CONFIGS_FILE = "task_configs.jsonl"
"""A sweep's point configs, one JSON line each: see :mod:`hpc_ddp.rundir.taskconfig`."""
WORKDIR_FILES_FILE = "workdir_files.json"
"""What a ``command`` program wrote in its working directory: see
:mod:`hpc_ddp.rundir.workdir_files`."""
SUBMIT_LOCK_FILE = "submit.lock"
"""Locked (``flock``) while a job is chosen, submitted and recorded in a run or sweep directory,
and briefly by each task that checks it is the recorded job: see
:func:`hpc_ddp.rundir.manifest.record_lock`."""
STAMP_FORMAT = "%Y%m%d-%H%M%S"
"""The UTC submit time in a run directory's name, ``<name>-<stamp>[-N]``."""

# Every HPC_DDP_* environment variable, declared once. The first three are the login-to-node
# contract: the rendered script (or the local backend) sets them, the runtime reads them.
RUN_DIR_ENV = "HPC_DDP_RUN_DIR"
"""This task's run directory (in a sweep's array: ``SWEEP_DIR/tasks/<index>``)."""
ARRAY_OFFSET_ENV = "HPC_DDP_ARRAY_OFFSET"
"""Added to ``SLURM_ARRAY_TASK_ID`` when a sweep is split over several arrays (MaxArraySize)."""
PER_RANK_LOGS_ENV = "HPC_DDP_PER_RANK_LOGS"
"""Set where each rank has its own log file, so every rank may log at INFO."""
RUNS_DIR_ENV = "HPC_DDP_RUNS_DIR"
"""Login side: where runs are created and looked for (default ``./runs``)."""
DEV_CLUSTER_DIR_ENV = "HPC_DDP_DEV_CLUSTER_DIR"
"""Contributors: the dev cluster's state directory."""
RUN_ID_ENV = "HPC_DDP_RUN_ID"
"""Node side: the run's stable id (``RUN_DIR/run_id``), the same in every attempt."""
LOCAL_GPUS_ENV = "HPC_DDP_LOCAL_GPUS"
"""Local backend, on each rank: how many GPUs it gave this rank (``0``: none), as Slurm's
``SLURM_GPUS_ON_NODE`` says it on a Slurm task."""
LOCAL_GPUS_PER_TASK_ENV = "HPC_DDP_LOCAL_GPUS_PER_TASK"
"""Local backend, with ``slurm.gpus_per_task``: the GPUs each rank has to itself (as Slurm's
``SLURM_GPUS_PER_TASK``); unset when the ranks share them (``slurm.gpus_per_node``)."""
NO_PDEATHSIG_ENV = "HPC_DDP_TEST_NO_PDEATHSIG"
"""Tests only: ``1`` keeps local ranks alive when their controller dies (to test orphans)."""
LAUNCH_ENV = "HPC_DDP_LAUNCH"
"""Node side: which launch of this job attempt the task belongs to (0, 1, ...), set by the
supervisor for each srun step (or local process set) it starts; unset means 0."""
SUPERVISED_ENV = "HPC_DDP_SUPERVISED"
"""Node side: ``1`` when a supervisor owns this launch: it decides what follows a fault, so a
rank never requeues a crash itself and never waits on a collective on its way out."""
LAUNCH_DIR_ENV = "HPC_DDP_LAUNCH_DIR"
"""Node side: this launch's directory (``RUN_DIR/launches/<key>``), made by the supervisor
with every rank's beat file in it before the ranks start."""
STANDBY_ENV = "HPC_DDP_STANDBY"
"""Node side: set on a launch's standby (:mod:`hpc_ddp.fault.standby`): the task loads its
imports and waits until :attr:`LaunchPaths.standby_call` says ``go`` or ``dismiss``."""
LOCAL_JOB_ENV = "HPC_DDP_LOCAL_JOB"
"""Local backend, on each rank: the run's job id (its controller's pid), as the manifest
records it; a Slurm task has ``SLURM_JOB_ID`` instead."""
TASK_LAUNCHER_ENV = "HPC_DDP_TASK_LAUNCHER"
"""Set by a ``command:`` task's ``hpc-ddp run`` parent for its child: how the task itself was
started (``slurm``). The child's RANK and WORLD_SIZE are then the task's own, given by
hpc-ddp, not a torchrun's (which also sets ``TORCHELASTIC_RUN_ID``)."""
WATCHDOG_OWNER_ENV = "HPC_DDP_WATCHDOG_OWNER"
"""Set by a ``command:`` task's ``hpc-ddp run`` parent for its child: the parent beats for the
rank, so a session in the child starts no watchdog of its own."""

TASK_PLACE_ENV = "HPC_DDP_TASK_PLACE"
"""Set with :data:`WATCHDOG_OWNER_ENV`: ``RANK/WORLD`` of the parent's task among the launch's
tasks, the numbering its beat and the launch's fault records use. A program that runs several
ranks per task (torchrun's workers) maps a fault onto its own ranks with it."""

LATEST_CHECKPOINT = "latest"
"""``checkpoints/latest``: names the newest checkpoint file, a hint for people and tools."""
CHECKPOINT_TMP_PREFIX = ".tmp-"
"""Temp files of a checkpoint writer start with this, so that they never match ``step-*.pt``."""
# Compiled at first use (re caches them): a submit lists no checkpoints.
_CHECKPOINT = r"^step-(\d+)\.pt$"


def checkpoint_name(step: int) -> str:
    """``step-00000120.pt``: zero-padded so names sort like steps."""
    return f"step-{step:08d}.pt"


def parse_checkpoint_name(name: str) -> int | None:
    """The step in a checkpoint file name, or None for any other file."""
    m = re.match(_CHECKPOINT, name)
    return int(m.group(1)) if m else None


_SHARDED = r"^step-(\d+)$"
SHARDED_RECORD = "digests.json"
"""Inside a sharded checkpoint's ``step-N/``: the digest record, written last (see
:mod:`hpc_ddp.checkpoint.sharded`)."""


def sharded_checkpoint_name(step: int) -> str:
    """``step-00000120``: the directory of a sharded (FSDP) checkpoint, the file name's stem."""
    return f"step-{step:08d}"


def parse_sharded_checkpoint_name(name: str) -> int | None:
    """The step in a sharded checkpoint's directory name, or None for any other name."""
    m = re.match(_SHARDED, name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint in ``checkpoints/`` as it is named on disk: its step and its name there,
    ``step-N.pt`` (a file) or ``step-N`` (an FSDP run's shard set). The name comes from what
    was listed or saved, never rebuilt from the step: the step alone does not say which kind
    a run keeps."""

    step: int
    name: str


@dataclass(frozen=True)
class RunPaths:
    """Every path inside one run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def manifest(self) -> Path:
        """Job id, backend, submit time and command: see :mod:`hpc_ddp.rundir.manifest`."""
        return self.root / MANIFEST_FILE

    @property
    def submit_lock(self) -> Path:
        """Held across "is the run live? submit, record"
        (:func:`hpc_ddp.rundir.manifest.record_lock`)."""
        return self.root / SUBMIT_LOCK_FILE

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def live_progress(self) -> Path:
        """Rank 0's latest progress line as JSON (:mod:`hpc_ddp.runtime.progress_log`)."""
        return self.root / "progress.json"

    @property
    def run_id_file(self) -> Path:
        """One line, the run id: see :func:`hpc_ddp.rundir.run_id.read_run_id`."""
        return self.root / RUN_ID_FILE

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files (rank 0, only with ``train.tensorboard: true``)."""
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def rendezvous(self) -> Path:
        return self.root / "rendezvous"

    @property
    def doctor(self) -> Path:
        """``hpc-ddp doctor``'s per-rank reports (``rank-N.json``) and the login side's token."""
        return self.root / "doctor"

    @property
    def tasks(self) -> Path:
        """Per-task run directories of a sweep."""
        return self.root / "tasks"

    def task(self, index: int) -> RunPaths:
        """The run directory of sweep task ``index`` (made when that task starts)."""
        return RunPaths(self.tasks / str(index))

    @property
    def task_configs(self) -> Path:
        """A sweep's ``config.yaml`` texts, one JSON line per point, written once at submit;
        each task writes its own ``tasks/<i>/config.yaml`` from it when it starts."""
        return self.root / TASK_CONFIGS_FILE

    def rank_log(self, rank: int, stream: str = "out") -> Path:
        """Where srun writes rank ``rank``'s stdout (``out``) or stderr (``err``)."""
        return self.logs / f"rank-{rank}.{stream}"

    @property
    def launches(self) -> Path:
        """One directory per launch (``<key>/``, see :func:`launch_key`) and ``bad_nodes.json``."""
        return self.root / "launches"

    def launch(self, key: str) -> LaunchPaths:
        """The files of the launch ``key``."""
        return LaunchPaths(self.launches / key)

    @property
    def bad_nodes(self) -> Path:
        """The nodes the supervisor found bad in the run's current job (JSON), kept so a
        requeued attempt and the next launch avoid them."""
        return self.launches / "bad_nodes.json"


@dataclass(frozen=True)
class LaunchPaths:
    """The files of one launch: every rank's heartbeat, the supervisor's, the fault claim.

    The supervisor makes the directory and every beat file before it starts the ranks, so
    that every later read is of a file that exists (no negative lookup cached on NFS).
    """

    root: Path

    def beat(self, rank: int) -> Path:
        """Rank ``rank``'s heartbeat: one fixed-size record rewritten in place."""
        return self.root / f"rank-{rank}.beat"

    @property
    def supervisor(self) -> Path:
        """The supervisor's heartbeat: holds the fault it declared (a dead task, a lost node)."""
        return self.root / "supervisor.beat"

    @property
    def fault(self) -> Path:
        """The launch's fault record, claimed by exclusive create: the first to declare wins."""
        return self.root / "fault.json"

    def exit_note(self, rank: int) -> Path:
        """Rank ``rank``'s session's word on how it left: its training loop before its end,
        or an error (one fixed-size record, rewritten in place like a beat)."""
        return self.root / f"rank-{rank}.exit"

    def rescue_note(self, rank: int) -> Path:
        """Written by rank ``rank``'s session in a ``command:`` child when it can make the
        survivor's save: its parent, which beats for it, then lets it finish before ending it
        (the child's pid in it)."""
        return self.root / f"rank-{rank}.rescue"

    @property
    def standby_call(self) -> Path:
        """The supervisor's word to this launch's standby processes, rewritten in place
        (``wait``, then ``go`` or ``dismiss``): made before they start, like a beat."""
        return self.root / "standby.call"

    def stacks(self, rank: int) -> Path:
        """Rank ``rank``'s thread stacks, every thread, hpc-ddp's own included: written when
        the supervisor asks for them after a fault and when the rank leaves for one. hpc-ddp's
        file, not the program's stderr (which gets a hung rank's main thread only)."""
        return self.root / f"rank-{rank}.stacks"


def launch_key(job: str | None, restart: int, launch: int) -> str:
    """``4242.0.1``: job (``ARRAYJOB_TASK`` for an array task, the local controller's pid, or
    ``local``), Slurm's restart count, and the launch within that attempt."""
    return f"{job or 'local'}.{restart}.{launch}"


def run_dir_name(name: str, stamp: str, n: int = 1) -> str:
    """``<name>-<stamp>``, or ``<name>-<stamp>-<n>`` for the n-th run of that name and second."""
    return f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}"


__all__ = [
    "ARRAY_OFFSET_ENV",
    "CHECKPOINT_TMP_PREFIX",
    "DEV_CLUSTER_DIR_ENV",
    "LATEST_CHECKPOINT",
    "LAUNCH_DIR_ENV",
    "LAUNCH_ENV",
    "LOCAL_JOB_ENV",
    "MANIFEST_FILE",
    "NO_PDEATHSIG_ENV",
    "PER_RANK_LOGS_ENV",
    "RUNS_DIR_ENV",
    "RUN_DIR_ENV",
    "RUN_ID_ENV",
    "RUN_ID_FILE",
    "SHARDED_RECORD",
    "STAMP_FORMAT",
    "STANDBY_ENV",
    "SUBMIT_LOCK_FILE",
    "SUPERVISED_ENV",
    "TASK_CONFIGS_FILE",
    "TASK_LAUNCHER_ENV",
    "TASK_PLACE_ENV",
    "WATCHDOG_OWNER_ENV",
    "WORKDIR_FILES_FILE",
    "Checkpoint",
    "LaunchPaths",
    "RunPaths",
    "checkpoint_name",
    "launch_key",
    "parse_checkpoint_name",
    "parse_sharded_checkpoint_name",
    "run_dir_name",
    "sharded_checkpoint_name",
]
