"""The job configuration model: frozen dataclasses, one per YAML section.

Pure: no I/O beyond what callers hand in, no ``os.environ``, no subprocess. Loading, layering
and validation live in :mod:`hpc_ddp.config.load`.

YAML layout (every key optional except where noted)::

    name: str
    command: [argv...]          # bring-your-own script (mutually exclusive with entrypoint)
    entrypoint: "pkg.mod:fn"    # bring-your-own Python entry point
    slurm:   {nodes, min_nodes, tasks_per_node, cpus_per_task, gpus_per_task, gpus_per_node,
              mem, time, partition, account, qos, constraint, exclusive, template,
              extra: {flag: value}, srun_args: [..], spare_nodes}
    env:     {modules: [..], setup: [..], vars: {K: V},
              container: {runtime: apptainer|pyxis|charliecloud, image, binds: [..],
                          options: [..], python}}
    dist:    {backend: auto|gloo|nccl, init_method: env|tcp|file, port, timeout_s,
              launcher: srun|torchrun, procs_per_node, local_rank_arg}
    train:   {model, dataset, data_root, num_classes, image_size, synthetic_samples,
              max_steps, epochs, batch_size, grad_accum, optimizer, lr, momentum,
              weight_decay, lr_schedule, warmup_steps, compile, strategy, amp, seed,
              checkpoint_every, checkpoint_min_s, checkpoint_max_s, keep_last,
              keep_best: {metric, mode}, eval_every, log_every, num_workers, deterministic}
    requeue: {signal, lead_time, max_requeues, on_crash}
    fault:   {enabled, beat_s, stale_s, startup_stale_s, startup_timeout_s, step_timeout_s,
              step_timeout_factor, warmup_steps, checkpoint_timeout_s, max_restarts,
              no_progress_limit, rescue, exclude_bad_nodes, lemon_nodes,
              lemon_window_days, standby, standby_after_s}
    params:  {name: value, ...}   # free-form: your script's own values (see config.params)
"""

from __future__ import annotations

from dataclasses import field
from functools import cached_property
from typing import Literal

from hpc_ddp.config.leadtime import PRIOR_LEAD_S
from hpc_ddp.config.params import Params
from hpc_ddp.config.units import parse_slurm_time
from hpc_ddp.frozen import dataclass

ContainerRuntime = Literal["apptainer", "pyxis", "charliecloud"]
Backend = Literal["auto", "gloo", "nccl"]
InitMethod = Literal["env", "tcp", "file"]
TaskLauncher = Literal["srun", "torchrun"]
Optimizer = Literal["sgd", "adamw"]
LrSchedule = Literal["constant", "cosine", "step"]
Strategy = Literal["ddp", "fsdp"]
MetricMode = Literal["min", "max"]


@dataclass(frozen=True)
class SlurmConfig:
    """Resources requested from Slurm; each field maps to one sbatch flag."""

    nodes: int = 1
    """Nodes to allocate (``--nodes``); with ``min_nodes``, the most nodes the job may get."""
    min_nodes: int | None = None
    """Fewest nodes the job may start on: ``--nodes=MIN_NODES-NODES``, for an allocation that
    comes sooner. A start or requeue on fewer nodes than ``nodes`` trains at the smaller world
    size with the same global batch (``train.grad_accum`` is meant for ``nodes``; fewer ranks
    accumulate more), sample-exact, not bit-exact (docs/concepts.md). ``None``: exactly
    ``nodes``."""
    tasks_per_node: int = 1
    """Tasks (DDP ranks) per node (``--ntasks-per-node``); usually one per GPU."""
    cpus_per_task: int | None = None
    """CPUs per task (``--cpus-per-task``), also the task's ``OMP_NUM_THREADS``; ``None``:
    the cluster's default (usually 1)."""
    gpus_per_task: int | None = None
    """GPUs per task (``--gpus-per-task``); ``None``: no GPUs requested this way."""
    gpus_per_node: int | None = None
    """GPUs per node (``--gpus-per-node``), the tasks sharing them; ``None``: not requested
    this way. Set at most one of this and ``gpus_per_task``."""
    mem: str | None = None
    """Per-node memory in Slurm's syntax (``16G``, ``4000M``, ``4000``)."""
    time: str = "01:00:00"
    """Time limit in any form sbatch accepts (``MM``, ``HH:MM:SS``, ``D-HH:MM`` ...)."""
    partition: str | None = None
    """Partition (``--partition``); ``None``: the cluster's default partition."""
    account: str | None = None
    """Account charged (``--account``); ``None``: your default account."""
    qos: str | None = None
    """Quality of service (``--qos``); ``None``: the default QOS."""
    constraint: str | None = None
    """Node features required (``--constraint``, e.g. ``a100``); ``None``: any node."""
    exclusive: bool = False
    """Ask for whole nodes (``--exclusive``), shared with no other job."""
    template: str | None = None
    """Path to a user sbatch template; ``None`` uses ``slurm_templates/default.sbatch.j2``."""
    extra: tuple[tuple[str, str | None], ...] = ()
    """Other sbatch flags as (long name without dashes, value or None for a bare flag)."""
    srun_args: tuple[str, ...] = ()
    """Extra options appended to the job step's ``srun`` line (each starts with ``-``), e.g.
    ``--mpi=none`` or ``--network=...``; each is one shell-quoted argument."""
    spare_nodes: int = 0
    """Extra nodes allocated beside ``nodes`` (needs ``fault.enabled``): training runs on
    ``nodes`` of them, and after a fault the restart runs on healthy ones at the same world
    size, skipping a node whose rank died or hung. Spares cost node-hours while idle."""

    @property
    def ntasks(self) -> int:
        """Total number of tasks (ranks) in the job."""
        return self.nodes * self.tasks_per_node

    @cached_property
    def time_s(self) -> int:
        """The time limit in seconds: ``time`` parsed once, here, for every user of it."""
        return parse_slurm_time(self.time)


@dataclass(frozen=True)
class ContainerConfig:
    """Optional container wrapper around every task."""

    runtime: ContainerRuntime
    """``apptainer`` (``apptainer exec`` around each task), ``pyxis`` (srun
    ``--container-image``) or ``charliecloud`` (``ch-run IMAGE --`` around each task)."""
    image: str
    """The image: a ``.sif`` file or URI for apptainer, an image name or squashfs for pyxis,
    a directory image (or SquashFS file) for charliecloud."""
    binds: tuple[str, ...] = ()
    """Host paths to mount in the container (``SRC[:DST[:OPTS]]``; charliecloud: ``SRC[:DST]``,
    and ``DST`` must exist in the image); the run directory must be reachable at the same
    path."""
    options: tuple[str, ...] = ()
    """Extra options for ``apptainer exec``, srun's pyxis flags or ``ch-run``, each one
    argument."""
    python: str = "python3"
    """The interpreter inside the image that runs ``-m hpc_ddp run`` (a name on the image's
    PATH or an absolute path): the login node's ``sys.executable`` does not exist in the image."""

    def ch_run_shows(self, path: str) -> bool | None:
        """Whether ch-run (charliecloud) shows the host's absolute ``path`` inside at the same
        path: it binds the host's ``/tmp`` (unless ``--private-tmp``) and ``binds``, nothing
        else of the host's files. None when ``options`` bind more (``-b``, ``--home``): ch-run
        alone can tell then."""
        if any(o.startswith(("-b", "--bind", "--home")) for o in self.options):
            return None
        shown = [] if any(o in ("-t", "--private-tmp") for o in self.options) else ["/tmp"]
        for bind in self.binds:
            src, _, dst = bind.partition(":")
            if not dst or dst.rstrip("/") == src.rstrip("/"):
                shown.append(src)
        inside = path.rstrip("/") + "/"
        return any(inside.startswith(s.rstrip("/") + "/") for s in shown)


@dataclass(frozen=True)
class EnvConfig:
    """The software environment each task starts in."""

    modules: tuple[str, ...] = ()
    """Environment modules loaded first (``module load ...``), in order."""
    setup: tuple[str, ...] = ()
    """Shell lines run before the tasks start (``source venv/bin/activate``). These are shell on
    purpose, written by the user; they are the only config values not quoted."""
    vars: tuple[tuple[str, str], ...] = ()
    """Environment variables exported to every task (``NAME: value``, quoted); the
    distributed ones (``RANK``, ``MASTER_PORT``, ...) are set by hpc-ddp."""
    container: ContainerConfig | None = None
    """Run every task in a container; ``None``: directly on the node."""


@dataclass(frozen=True)
class DistConfig:
    """How the process group is formed."""

    backend: Backend = "auto"
    """Collective backend: ``auto`` picks ``nccl`` with GPUs, ``gloo`` without."""
    init_method: InitMethod = "env"
    """How ranks find each other: ``env`` (MASTER_ADDR/MASTER_PORT from Slurm), ``tcp`` or
    ``file`` (a rendezvous file in the run directory)."""
    port: int | None = None
    """Fixed MASTER_PORT; ``None`` derives one from the job id (collision-checked)."""
    timeout_s: int = 300
    """Collective timeout: a dead peer fails the job after this long instead of hanging. With
    ``fault.enabled`` the start-up's collectives (DDP's first broadcast, up to the end of the
    first step) wait up to ``fault.startup_timeout_s`` instead: ranks build and restore at
    their own pace."""
    launcher: TaskLauncher = "srun"
    """What starts a ``command``'s processes: ``srun``, one process per Slurm task (the
    default); or ``torchrun``, one per node (``slurm.tasks_per_node: 1``), which starts
    ``dist.procs_per_node`` workers there, its rendezvous taken from the allocation (rank 0's
    node, the job's port) and ``--max-restarts=0`` (restarts are the supervisor's)."""
    procs_per_node: int | None = None
    """Workers per node under ``dist.launcher: torchrun``; ``None``: ``slurm.gpus_per_node``
    when set, else 1."""
    local_rank_arg: str | None = None
    """For a classic script that reads its local rank only from its arguments: the option to
    append as ``OPTION=N`` (``--local_rank`` or torch 2's ``--local-rank``); ``None``: none
    appended (the rank is in ``LOCAL_RANK``, as torchrun gives it)."""


@dataclass(frozen=True)
class KeepBestConfig:
    """Which checkpoint is the best one, kept on disk beside the newest ``keep_last``."""

    metric: str
    """A metric logged in the rows of ``s.log(...)`` (the built-in trainer's evaluation logs
    ``val_loss`` and ``val_acc``): a checkpoint is scored by the newest value logged at its step
    or before it."""
    mode: MetricMode = "min"
    """``min`` (a loss) or ``max`` (an accuracy): which way is better."""


@dataclass(frozen=True)
class TrainConfig:
    """What the built-in trainer runs."""

    model: str = "mlp"
    """torchvision model name (``resnet18``), ``mlp``, or an import string ``pkg.mod:fn``."""
    dataset: str = "synthetic"
    """``synthetic`` | ``cifar10`` | ``mnist`` | ``imagefolder`` | ``pkg.mod:fn``."""
    data_root: str | None = None
    """Directory of pre-staged data for ``cifar10``, ``mnist`` and ``imagefolder`` (nothing is
    downloaded at run time); ``$VAR``, ``${VAR}`` and ``~`` are expanded on each task, in its
    environment. ``None`` for ``synthetic``."""
    num_classes: int = 10
    """Classes the model's head predicts."""
    image_size: int = 32
    """Side in pixels of the (square) images fed to the model."""
    synthetic_samples: int = 2048
    """Samples in the ``synthetic`` dataset."""
    max_steps: int | None = None
    """Optimizer steps to train for; when set it wins over ``epochs``. ``None``: ``epochs``
    decides."""
    epochs: int | None = 1
    """Passes over the training data; ``None``: ``max_steps`` decides."""
    batch_size: int = 32
    """Per-rank batch size; the global batch is this times the world size and ``grad_accum``."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step; 1 means no accumulation. At a smaller
    world size than ``slurm.nodes x slurm.tasks_per_node`` (``slurm.min_nodes``, or
    ``hpc-ddp resume --elastic``) each rank accumulates more, to keep the global batch."""
    optimizer: Optimizer = "sgd"
    """``sgd`` (with ``momentum``) or ``adamw``."""
    lr: float = 0.05
    """Peak learning rate (after warm-up, before the schedule decays it)."""
    momentum: float = 0.9
    """SGD momentum (ignored by ``adamw``)."""
    weight_decay: float = 0.0
    """Weight decay (L2 for ``sgd``, decoupled for ``adamw``); 0 disables it."""
    lr_schedule: LrSchedule = "cosine"
    """How the learning rate decays after warm-up: ``constant``, ``cosine`` (to 0 at the last
    step) or ``step`` (x0.1 at 50% and again at 75% of the steps)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up up to ``lr``; 0: none."""
    compile: bool = False
    """``torch.compile`` the model after it is wrapped in DDP (the built-in trainer). The first
    steps of each launch compile it: they run under ``fault.startup_timeout_s``
    (``fault.warmup_steps``), not the step timeout. Compiled kernels may round differently from
    eager ones, so changing it on a resume makes the run not comparable to an uninterrupted
    one. Needs a C compiler on CPU and Triton on GPUs."""
    strategy: Strategy = "ddp"
    """How the model is spread over the ranks: ``ddp`` (a full copy on every rank, gradients
    all-reduced) or ``fsdp`` (FSDP2: parameters, gradients and optimizer state sharded over
    the ranks, per block, for models larger than one rank's memory; checkpoints are then
    sharded: every rank writes its own shard). Also the default of ``s.wrap()`` in your own
    script."""
    amp: bool = False
    """Mixed precision on GPUs (bfloat16 on GPUs that compute in it natively, Ampere and newer;
    float16 with a grad scaler on older ones); ignored on CPU, with a warning."""
    seed: int = 0
    """Seed of weights, data order and augmentation: the same seed gives the same run."""
    checkpoint_every: int | Literal["auto"] = 100
    """Optimizer steps between periodic checkpoints; 0 saves only on stop and at the end.
    ``auto``: the interval that loses the least expected time to saves and interruptions,
    from the measured save cost, step time and interruption rate, re-chosen after every save
    (docs/resilience.md, "checkpoint_every: auto")."""
    checkpoint_min_s: float = 0.0
    """Under ``checkpoint_every: auto``: never save more often than this (seconds)."""
    checkpoint_max_s: float = 3600.0
    """Under ``checkpoint_every: auto``: save at least this often (seconds), however rare
    interruptions are. Neither bound goes below the time a save takes to be durable."""
    keep_last: int = 3
    """Checkpoints kept on disk, newest first; older ones are deleted."""
    keep_best: KeepBestConfig | None = None
    """Also keep the checkpoint with the best ``metric`` so far, which pruning never deletes
    (the newest checkpoint records its step under ``meta.best``). ``None``: only ``keep_last``."""
    eval_every: int = 0
    """Optimizer steps between evaluations on the validation split; 0: none during training."""
    log_every: int = 10
    """Optimizer steps between progress lines and metrics records."""
    tensorboard: bool = False
    """Also write the metrics records to ``RUN_DIR/tensorboard/`` as TensorBoard scalars
    (rank 0; needs ``pip install 'hpc-ddp[tensorboard]'``)."""
    num_workers: int | Literal["auto"] = "auto"
    """DataLoader worker processes per rank; 0 loads in the training process. ``auto``: 0 on
    CPUs (workers would take the cores the model computes on); on a GPU one fewer than the
    task's CPUs (``slurm.cpus_per_task``, else its share of the CPUs it may use), 1 to 8, so
    that decoding overlaps the GPU's work. Resume stays exact with workers: the data order is
    fixed by the sampler, not by them."""
    deterministic: bool = False
    """Deterministic GPU kernels (cuDNN deterministic, no cuDNN benchmark,
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``torch.use_deterministic_algorithms`` with an op
    that has no deterministic version named in the log, not raised). With it, a resume on GPUs
    is bit-identical when the nodes, GPU topology and software are unchanged; without it, GPU
    runs are step- and sample-exact only (docs/concepts.md). Costs speed; nothing changes on
    CPU, which is always bit-identical."""


@dataclass(frozen=True)
class RequeueConfig:
    """What happens when Slurm warns of a time limit or preempts the job."""

    signal: str = "USR2"
    """Signal Slurm sends ahead of the time limit. USR2 by default, as submitit's: USR1 is
    claimed by other tools (PyTorch Lightning handles it; NCCL takes it when
    ``NCCL_PROXY_DUMP_SIGNAL=10`` is set, and NCCL 2.12 always did)."""
    lead_time: int | Literal["auto"] = 120
    """Seconds before the time limit at which the signal is sent. ``auto``: sized at submit
    from this user's measured save times, twice the slowest recent save plus the stop, or 120 s
    before any save was measured (docs/resilience.md, "lead_time: auto"); the number chosen is
    what the run directory's config records, kept across requeues."""
    max_requeues: int = 5
    """Requeues allowed before the job stops unfinished (exit 3); 0 never requeues."""
    on_crash: bool = False
    """Requeue after a crash too (off: a crash is not a preemption and fails fast)."""

    @property
    def lead_s(self) -> int:
        """The lead time in seconds: ``auto`` not yet resolved at submit reads as the prior."""
        return PRIOR_LEAD_S if self.lead_time == "auto" else self.lead_time


@dataclass(frozen=True)
class FaultConfig:
    """Hung and dead ranks, lost nodes and crash loops: found in seconds, restarted in the job."""

    enabled: bool = True
    """Every rank beats and watches its peers, and a supervisor restarts a launch that failed,
    inside the allocation. ``false``: one srun step, no watchdog, no in-job restart."""
    beat_s: float = 0.5
    """Seconds between a rank's heartbeats (a small file rewritten in place in the run
    directory, by a thread of its own: a long step, an evaluation or a save never delays it)."""
    stale_s: float = 4.0
    """A peer whose heartbeat has not changed for this long is frozen, killed or cut off: the
    step ends and the peer is named. At least 3 beats. On NFS with long attribute caching,
    raise it (or mount the run directory with ``actimeo=1``)."""
    startup_stale_s: float = 30.0
    """``stale_s`` for a peer still starting (before its first step): loading torch's libraries
    from a shared file system or initialising CUDA holds the GIL in C for seconds, and stops the
    heartbeat of a rank that is not hung. The longer of the two applies."""
    startup_timeout_s: int = 900
    """Longest start-up: launch to the first steps (imports, rendezvous, restoring the
    checkpoint), and the collectives' bound until the first step ends. More than
    ``dist.timeout_s``."""
    step_timeout_s: int = 10
    """The step timeout's floor: a step is hung after max(this, ``step_timeout_factor`` x the
    99th percentile of the recent step times)."""
    step_timeout_factor: float = 5.0
    """How many times the 99th percentile of the last 200 step times a step may take."""
    warmup_steps: int = 5
    """The first steps of each launch run under ``startup_timeout_s`` (compilation,
    autotuning, allocator warm-up), not the step timeout."""
    checkpoint_timeout_s: int = 900
    """Longest blocking part of a checkpoint save or restore, and of an evaluation."""
    max_restarts: int = 3
    """In-job restarts per allocation after a crash, hang or lost rank: each one a new srun step
    from the newest checkpoint, no requeue. Then ``requeue.on_crash`` decides; a requeued job's
    new allocation has them anew (a crash loop stops at ``no_progress_limit``)."""
    no_progress_limit: int = 2
    """Launches in a row that end in a fault without a newer checkpoint before the run stops
    with ``no_progress`` (a crash loop); 0 never stops for that."""
    rescue: bool = True
    """When a peer dies, hangs or loses its node, the lowest surviving rank saves the last step
    every rank completed, so the restart trains no step twice (DDP; see docs/resilience.md).
    ``false``: the restart goes on from the newest periodic checkpoint."""
    exclude_bad_nodes: bool = True
    """Leave out of the next launch (and ask a requeue to avoid) a node that was lost, that
    failed twice in a row, or whose rank failed while a spare node was free."""
    lemon_nodes: bool = True
    """Remember the nodes blamed for faults across runs, in the user's state directory
    (``$XDG_STATE_HOME/hpc-ddp/nodes``), and leave out a "lemon" (lost, a hardware error, or
    faults in 2 runs within ``lemon_window_days``): at submit (``--exclude``, while the
    partition keeps enough nodes) and in the supervisor's launches. See ``hpc-ddp nodes``."""
    lemon_window_days: float = 7.0
    """How long a fault counts against its node in the lemon record."""
    standby: bool = True
    """Keep the next launch's processes started on the same nodes, their Python and torch
    imported, waiting: a restart of the same shape (a dead, crashed or hung rank) calls them
    instead of starting cold, which saves seconds per restart. Costs one idle process per rank
    (a few hundred MB of memory each) once a launch has trained ``standby_after_s``. Built-in
    trainer and ``entrypoint`` jobs (a ``command`` or torchrun launch starts cold)."""
    standby_after_s: float = 20.0
    """How long a launch trains before its standby starts: a short job never pays for one, and
    its imports never compete with the launch's own start-up."""


@dataclass(frozen=True)
class JobConfig:
    """A whole, validated job."""

    name: str
    """Job name: names the run directory (``<name>-<timestamp>``) and the Slurm job."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Resources requested from Slurm."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The software environment of each task."""
    dist: DistConfig = field(default_factory=DistConfig)
    """How the process group is formed."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """What the built-in trainer runs; a session in your own script uses only ``keep_last``,
    ``keep_best`` and ``seed`` (the default seed of ``session().loader``)."""
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    """Requeue on time limits and preemption."""
    fault: FaultConfig = field(default_factory=FaultConfig)
    """Hang detection, blame, in-job restart, bad nodes and crash loops."""
    command: tuple[str, ...] | None = None
    """Run your own program on every task instead of the built-in trainer: an argv list,
    run without a shell; ``{params.NAME}`` in an item is replaced by that param's value
    (``{{params.NAME}}`` for the literal text). A first item of exactly ``python`` or
    ``python3`` runs the interpreter that runs hpc-ddp on the task (the one you submitted
    with, or ``env.container.python``), not whichever ``python`` comes first on the nodes'
    PATH. ``None``: no command."""
    entrypoint: str | None = None
    """Call your own Python function on every task instead: ``package.module:function``.
    ``None``: no entry point."""
    params: Params = field(default_factory=Params)
    """Your script's own values, free-form: names to numbers, strings, booleans or null, or to
    nested mappings of those (``params.opt.lr``). Set and swept like any key
    (``params.lr=0.1``, even for a name not in the file); read in Python as
    ``hpc_ddp.session().params``; substituted into ``command`` as ``{params.lr}``."""
