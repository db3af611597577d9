"""The job configuration model: frozen dataclasses, one per YAML section.

Pure: no I/O beyond what callers hand in, no ``os.environ``, no subprocess. Loading, layering
and validation live in :mod:`hpc_ddp.config.load`.

YAML layout (every key optional except where noted)::

    name: str
    command: [argv...]          # bring-your-own script (mutually exclusive with entrypoint)
    entrypoint: "pkg.mod:fn"    # bring-your-own Python entry point
    slurm:   {nodes, tasks_per_node, cpus_per_task, gpus_per_task, gpus_per_node, mem, time,
              partition, account, qos, constraint, exclusive, template, extra: {flag: value},
              srun_args: [..]}
    env:     {modules: [..], setup: [..], vars: {K: V},
              container: {runtime: apptainer|pyxis, image, binds: [..], options: [..], python}}
    dist:    {backend: auto|gloo|nccl, init_method: env|tcp|file, port, timeout_s}
    train:   {model, dataset, data_root, num_classes, image_size, synthetic_samples,
              max_steps, epochs, batch_size, grad_accum, optimizer, lr, momentum,
              weight_decay, lr_schedule, warmup_steps, amp, seed, checkpoint_every, keep_last,
              eval_every, log_every, num_workers}
    requeue: {signal, lead_time, max_requeues, on_crash}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ContainerRuntime = Literal["apptainer", "pyxis"]
Backend = Literal["auto", "gloo", "nccl"]
InitMethod = Literal["env", "tcp", "file"]
Optimizer = Literal["sgd", "adamw"]
LrSchedule = Literal["constant", "cosine", "step"]


@dataclass(frozen=True)
class SlurmConfig:
    """Resources requested from Slurm; each field maps to one sbatch flag."""

    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    gpus_per_node: int | None = None
    mem: str | None = None
    """Per-node memory in Slurm's syntax (``16G``, ``4000M``, ``4000``)."""
    time: str = "01:00:00"
    """Time limit in any form sbatch accepts (``MM``, ``HH:MM:SS``, ``D-HH:MM`` ...)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    template: str | None = None
    """Path to a user sbatch template; ``None`` uses ``slurm_templates/default.sbatch.j2``."""
    extra: tuple[tuple[str, str | None], ...] = ()
    """Other sbatch flags as (long name without dashes, value or None for a bare flag)."""
    srun_args: tuple[str, ...] = ()
    """Extra options appended to the job step's ``srun`` line (each starts with ``-``), e.g.
    ``--mpi=none`` or ``--network=...``; each is one shell-quoted argument."""

    @property
    def ntasks(self) -> int:
        """Total number of tasks (ranks) in the job."""
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True)
class ContainerConfig:
    """Optional container wrapper around every task."""

    runtime: ContainerRuntime
    image: str
    binds: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    python: str = "python3"
    """The interpreter inside the image that runs ``-m hpc_ddp run`` (a name on the image's
    PATH or an absolute path): the login node's ``sys.executable`` does not exist in the image."""


@dataclass(frozen=True)
class EnvConfig:
    """The software environment each task starts in."""

    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    """Shell lines run before the tasks start (``source venv/bin/activate``). These are shell on
    purpose, written by the user; they are the only config values not quoted."""
    vars: tuple[tuple[str, str], ...] = ()
    container: ContainerConfig | None = None


@dataclass(frozen=True)
class DistConfig:
    """How the process group is formed."""

    backend: Backend = "auto"
    init_method: InitMethod = "env"
    port: int | None = None
    """Fixed MASTER_PORT; ``None`` derives one from the job id (collision-checked)."""
    timeout_s: int = 300
    """Collective timeout: a dead peer fails the job after this long instead of hanging."""


@dataclass(frozen=True)
class TrainConfig:
    """What the built-in trainer runs."""

    model: str = "mlp"
    """torchvision model name (``resnet18``), ``mlp``, or an import string ``pkg.mod:fn``."""
    dataset: str = "synthetic"
    """``synthetic`` | ``cifar10`` | ``mnist`` | ``imagefolder`` | ``pkg.mod:fn``."""
    data_root: str | None = None
    num_classes: int = 10
    image_size: int = 32
    synthetic_samples: int = 2048
    max_steps: int | None = None
    epochs: int | None = 1
    batch_size: int = 32
    """Per-rank batch size; the global batch is this times the world size."""
    grad_accum: int = 1
    optimizer: Optimizer = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: LrSchedule = "cosine"
    warmup_steps: int = 0
    amp: bool = False
    seed: int = 0
    checkpoint_every: int = 100
    """Optimizer steps between periodic checkpoints; 0 saves only on stop and at the end."""
    keep_last: int = 3
    eval_every: int = 0
    log_every: int = 10
    num_workers: int = 0


@dataclass(frozen=True)
class RequeueConfig:
    """What happens when Slurm warns of a time limit or preempts the job."""

    signal: str = "USR2"
    """Signal Slurm sends ahead of the time limit (USR2 by default: NCCL may catch USR1)."""
    lead_time: int = 120
    """Seconds before the time limit at which the signal is sent."""
    max_requeues: int = 5
    on_crash: bool = False
    """Requeue after a crash too (off: a crash is not a preemption and fails fast)."""


@dataclass(frozen=True)
class JobConfig:
    """A whole, validated job."""

    name: str
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    command: tuple[str, ...] | None = None
    entrypoint: str | None = None
