"""The process group: the master port, the backend and device, the rendezvous, and DDP wrapping.

An edge: it probes ports, writes the chosen port into the run directory, sets the CUDA device,
may write ``os.environ`` (the ``env`` method) and opens sockets or files. torch is imported
inside the functions that need it, so importing this module stays cheap: the parent process of
a ``command:`` job only agrees on the port here and never loads torch.

The master port. :func:`~hpc_ddp.runtime.distenv.derive_master_port` already keeps jobs with
nearby ids apart, but two unrelated jobs on one node can still derive the same port, and
something else may already listen there. So rank 0, which runs on the master node, probes the
derived port and, if it is taken, the job's deterministic fallbacks; it publishes the port it
chose in ``RUN_DIR/rendezvous/master_port.<job_ref>.<attempt>`` (the key names the attempt and
the launch within it, so a file left by an earlier attempt or launch is never read), and the
other ranks read it from there. A port fixed by ``dist.port`` or by torchrun is used as given.

Rendezvous, by ``dist.init_method``:

``env``   ``env://``: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and LOCAL_RANK, ...) are put
          into ``os.environ``, where torch and the user's code read them.
``tcp``   ``tcp://MASTER_ADDR:PORT`` with rank and world size passed explicitly.
``file``  ``file://RUN_DIR/rendezvous/pg.<job_ref>.<attempt>`` on the shared filesystem; no port.

For ``env`` and ``tcp`` with a derived port the ranks meet on a TCPStore made here rather than
by torch's rendezvous: rank 0 listens on the port the moment it has published it. torch's own
rendezvous binds the port only after ``init_process_group`` has imported ``torch._dynamo``
(about a second), and a peer that read the port and connected in between was refused and
retried only after a backoff of 0.3-1 s: every other restart was that much slower. A port set
by a launcher (torchrun's) is left to torch: its agent may serve a store there. A one-rank
group needs no rendezvous at all: it is formed on an in-memory store, so no port or file can
clash with a neighbour's, and user code can still call collectives.

The backend and device follow the GPUs the job was given (:func:`gpu_grant`, read from Slurm's
variables or the local backend's), never merely the GPUs a task can see: a job that asked for
none trains on gloo and the CPU even where CUDA is visible. Each rank computes on its own GPU
(:func:`choose_device`); ranks that would share one are refused before NCCL is started.

DDP wrapping (:func:`wrap_model`) fixes the gradient-bucket layout that exact resume needs
(:func:`fix_bucket_layout`), and :func:`unwrap` finds the plain module inside the wrappers.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.allocation import GpuGrant
from hpc_ddp.config.model import DistConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import DistEnvError
from hpc_ddp.runtime.distenv import DistEnv, derive_master_port

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

BACKENDS = ("auto", "gloo", "nccl")
INIT_METHODS = ("env", "tcp", "file")
_LISTEN_BACKLOG = 1024


@dataclass(frozen=True)
class ProcessGroupInfo:
    """The group this process joined."""

    backend: str
    device: str
    """``cpu`` or ``cuda:N``."""
    init_method: str
    """The URL used (``env://``, ``tcp://host:port``, ``file://path``), or ``local`` for a
    one-rank group on an in-memory store."""
    master_port: int | None = None
    """The agreed port for ``env``/``tcp`` (after collision checks), else None."""


def choose_backend(requested: str, cuda_available: bool, gpus_asked: bool | None = None) -> str:
    """``auto`` -> nccl when this task has CUDA and the job asked for GPUs, else gloo; an
    explicit ``nccl`` without CUDA is an error.

    ``gpus_asked`` is what the launcher says (:attr:`GpuGrant.asked`): None when it cannot tell
    (torchrun, a plain process), and then visible CUDA decides. A job that asked for no GPUs
    never forms NCCL on GPUs it can merely see: on a node without device cgroups they are
    another job's.
    """
    if requested not in BACKENDS:
        raise DistEnvError(
            f"dist.backend={requested!r} is not one of {', '.join(BACKENDS)}. "
            "HINT: use auto (nccl on GPUs, gloo on CPUs)."
        )
    if requested == "auto":
        return "nccl" if cuda_available and gpus_asked is not False else "gloo"
    if requested == "nccl" and not cuda_available:
        raise DistEnvError(
            "dist.backend='nccl' but this task sees no CUDA device. HINT: request GPUs "
            "(slurm.gpus_per_task or slurm.gpus_per_node), or set dist.backend=auto to use gloo "
            "on CPUs."
        )
    return requested


def gpu_grant(dist: DistEnv, env: Mapping[str, str]) -> GpuGrant:
    """What GPUs this task was given, as the scheduler whose job ``env`` is says
    (:meth:`~hpc_ddp.backends.allocation.Allocation.gpu_grant`: Slurm's ``SLURM_GPU*``
    variables, the local backend's ``HPC_DDP_LOCAL_GPUS``; nobody's: the devices it sees)."""
    from hpc_ddp.backends.node_registry import allocation_for

    return allocation_for(env).gpu_grant(dist.rank, dist.world_size)


def check_grant(grant: GpuGrant, count: int, visible: str | None, cuda_build: str | None) -> None:
    """A :class:`DistEnvError` when this task sees fewer GPUs than it was given (pure).

    ``count``: the CUDA devices torch sees; ``visible``: ``CUDA_VISIBLE_DEVICES``;
    ``cuda_build``: ``torch.version.cuda`` (None: a CPU-only build of torch). A job that asked
    for GPUs and would train on the CPU instead wastes its allocation: it stops here.
    """
    shown = "unset" if visible is None else repr(visible)
    if grant.given is not None and count < grant.given and cuda_build is not None:
        why = "this machine has no usable GPU" if count == 0 else "it lists GPUs this machine lacks"
        raise DistEnvError(
            f"the local backend gave this rank {grant.given} GPU(s) (CUDA_VISIBLE_DEVICES "
            f"{shown}) but torch sees {count}: {why}. HINT: set CUDA_VISIBLE_DEVICES to GPUs that "
            "exist (nvidia-smi -L) before submitting, or leave out slurm.gpus_per_task and "
            "slurm.gpus_per_node to train on CPUs."
        )
    if grant.asked and count == 0:
        why = (
            "this torch is a CPU-only build. HINT: install a CUDA build of torch in the job's "
            "environment"
            if cuda_build is None
            else f"torch (CUDA {cuda_build}) finds no usable device. HINT: check the node's "
            "driver (nvidia-smi) and that the job's environment matches it"
        )
        raise DistEnvError(
            f"the job gave this task GPUs ({grant.source}; CUDA_VISIBLE_DEVICES {shown}) but "
            f"{why}, or leave out slurm.gpus_per_task and slurm.gpus_per_node to train on CPUs."
        )


def choose_device(dist: DistEnv, count: int, per_task: int | None, visible: str | None) -> str:
    """The device this rank computes on, from what this task sees (pure).

    ``count``: the GPUs torch sees and this rank may use (0: none, or none the job asked for);
    ``per_task``: :attr:`GpuGrant.per_task`. A rank alone on its node, or with GPUs of its own
    (``--gpus-per-task``: each task sees only its own), computes on ``cuda:0``. Ranks that
    share the node's GPUs (``--gpus-per-node``, torchrun) split them evenly and compute on the
    first of their share: ``cuda:LOCAL_RANK`` with one GPU per rank. Fewer GPUs than the ranks
    sharing them is refused here, before NCCL fails with "Duplicate GPU detected".
    """
    if count < 1:
        return "cpu"
    local_world = dist.local_world_size
    if local_world == 1 or (per_task is not None and count == per_task):
        return "cuda:0"
    if count >= local_world:
        return f"cuda:{dist.local_rank * (count // local_world)}"
    shown = "unset" if visible is None else repr(visible)
    raise DistEnvError(
        f"{local_world} ranks on this node share {count} visible GPU(s) (CUDA_VISIBLE_DEVICES "
        f"{shown}): local rank {dist.local_rank} has no GPU of its own, and NCCL refuses two "
        "ranks on one GPU. HINT: one rank per GPU: set slurm.tasks_per_node to the GPUs per "
        "node, or use slurm.gpus_per_task: 1."
    )


def collective_device(backend: str) -> torch.device:
    """Where a tensor for a collective of a ``backend`` group must live: this process's current
    GPU under NCCL (which has no CPU path), the CPU otherwise."""
    import torch

    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_process_group(
    dist: DistEnv,
    cfg: DistConfig,
    run_dir: Path,
    env: Mapping[str, str],
    *,
    startup_timeout_s: float | None = None,
) -> ProcessGroupInfo:
    """Set this rank's device and join the default process group.

    Every wait (rendezvous, store, collectives) is bounded by ``cfg.timeout_s``, so a rank
    whose peers never come fails with an error instead of hanging. With ``init_method: env``
    this writes the rank variables into ``os.environ``.

    ``startup_timeout_s`` (longer): the collectives' bound until :func:`end_startup`. The
    ranks leave the rendezvous together, but each then builds its model and restores at its
    own pace (a busy node, a compile): DDP's first broadcast may wait on a peer for longer
    than a ``dist.timeout_s`` that suits the training steps.
    """
    import torch
    import torch.distributed as tdist

    if cfg.init_method not in INIT_METHODS:
        raise DistEnvError(
            f"dist.init_method={cfg.init_method!r} is not one of {', '.join(INIT_METHODS)}. "
            "HINT: use env."
        )
    if tdist.is_initialized():
        raise DistEnvError(
            "the default process group is already initialised. HINT: call "
            "hpc_ddp.runtime.procgroup.destroy_process_group() before joining again."
        )
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    grant = gpu_grant(dist, env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    check_grant(grant, count, visible, torch.version.cuda)
    backend = choose_backend(cfg.backend, count > 0, grant.asked)
    count = _usable_gpus(count, grant, backend)
    device = choose_device(dist, count, grant.per_task, visible)
    if device != "cpu":
        # Before the group exists: NCCL ties its communicator to the current device.
        torch.cuda.set_device(device)
    device_id = torch.device(device) if backend == "nccl" else None
    timeout = timedelta(seconds=cfg.timeout_s)
    rendezvous = run_dir / "rendezvous"
    port: int | None = None
    if cfg.init_method in ("env", "tcp"):
        # Probed here, after the slow parts (torch import, CUDA set-up), so that little time
        # passes between rank 0 finding the port free and binding it.
        port = resolve_master_port(dist, rendezvous, timeout_s=float(cfg.timeout_s))
    if cfg.init_method == "env":
        # Written even for one rank, which does not need them: the user's code may read them.
        os.environ.update({**dist.as_environ(), "MASTER_PORT": str(port)})
    store: Any = None  # None: torch's rendezvous at ``url``
    if dist.world_size == 1:
        url = "local"
        store = tdist.HashStore()  # type: ignore[attr-defined]  # public; stubs omit it
    else:
        url = _init_url(dist, cfg.init_method, rendezvous, env, port)
        if port is not None and _owns_store(dist, cfg):
            store = _tcp_store(dist, port, timeout)
    collectives = timeout
    if startup_timeout_s is not None and startup_timeout_s > cfg.timeout_s:
        collectives = timedelta(seconds=startup_timeout_s)
    tdist.init_process_group(
        backend,
        init_method=None if store is not None else url,
        store=store,
        rank=dist.rank,
        world_size=dist.world_size,
        timeout=collectives,
        device_id=device_id,
    )
    log.info(
        "rank %d/%d joined the process group: %s on %s via %s",
        dist.rank,
        dist.world_size,
        backend,
        device,
        url,
    )
    return ProcessGroupInfo(backend=backend, device=device, init_method=url, master_port=port)


def end_startup(cfg: DistConfig) -> None:
    """The start-up is over (the first step ended): the default group's collectives are bounded
    by ``cfg.timeout_s`` from now on (see :func:`init_process_group`)."""
    import torch.distributed as tdist
    from torch.distributed import distributed_c10d

    if not (tdist.is_initialized() and tdist.get_world_size() > 1):
        return
    # Public from torch 2.14; earlier ones (the supported range starts at 2.3) have the
    # private name only.
    set_timeout = getattr(tdist, "set_timeout", None) or getattr(
        distributed_c10d, "_set_pg_timeout", None
    )
    if set_timeout is None:
        log.warning(
            "this torch cannot change a process group's timeout: collectives keep the start-up "
            "bound (fault.startup_timeout_s) instead of dist.timeout_s=%s",
            cfg.timeout_s,
        )
        return
    set_timeout(timedelta(seconds=cfg.timeout_s))


def _usable_gpus(count: int, grant: GpuGrant, backend: str) -> int:
    """The visible GPUs this rank may use: none when the job asked for none (they are not its
    own), unless ``dist.backend: nccl`` says to use them anyway (a site that hands out GPU
    nodes without Slurm's GRES)."""
    if not count or grant.asked is not False:
        return count
    if backend == "nccl":
        log.warning(
            "dist.backend is nccl though the job asked for no GPUs (%s): using the %d visible",
            grant.source,
            count,
        )
        return count
    log.warning(
        "%d CUDA device(s) visible, but the job asked for none (%s): %s on the CPU. HINT: ask "
        "for GPUs with slurm.gpus_per_node or slurm.gpus_per_task",
        count,
        grant.source,
        backend,
    )
    return 0


def _init_url(
    dist: DistEnv, method: str, rendezvous: Path, env: Mapping[str, str], port: int | None
) -> str:
    if method == "env":
        return "env://"
    if method == "tcp":
        host = f"[{dist.master_addr}]" if ":" in dist.master_addr else dist.master_addr
        return f"tcp://{host}:{port}"
    # torch's FileStore must never be reused: ranks joining a file left by an earlier group see
    # its stale counters and fail or hang. The name is unique per attempt and launch (a requeue
    # gets a new restart count, an in-job restart a new launch; a crashed attempt's file is
    # simply never opened again). Removing a stale
    # file first is not safe: rank 0 cannot know whether a peer has already joined it. Outside
    # Slurm, torchrun's run id keys it; a plain rerun under the same key must clear
    # RUN_DIR/rendezvous first.
    key = dist.job_ref or env.get("TORCHELASTIC_RUN_ID") or "local"
    rendezvous.mkdir(parents=True, exist_ok=True)
    return f"file://{rendezvous / f'pg.{key}.{dist.attempt_key}'}"


def _owns_store(dist: DistEnv, cfg: DistConfig) -> bool:
    """True when hpc-ddp picks the master port (derived from the Slurm job) for a TCP store."""
    return cfg.init_method in ("env", "tcp") and dist.port_source == "derived"


def _listen(port: int) -> socket.socket:
    """A socket listening on ``port`` on every address: IPv6 and IPv4 where the host has IPv6
    (as torch's own store does), else IPv4; an error names the port."""
    families = [(socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")]
    for family, anywhere in families if socket.has_ipv6 else families[1:]:
        try:
            return _bind_and_listen(family, anywhere, port)
        except OSError as exc:
            # Only a port in use is final; no IPv6 on this host means: try IPv4.
            if exc.errno == errno.EADDRINUSE or family == socket.AF_INET:
                raise DistEnvError(
                    f"rank 0 cannot listen on master port {port}: {exc}. HINT: another process "
                    "took it just now; the job's next attempt derives another, or set dist.port."
                ) from None
    raise AssertionError("unreachable: the IPv4 attempt returns or raises")


def _bind_and_listen(family: socket.AddressFamily, anywhere: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((anywhere, port))
        sock.listen(_LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _tcp_store(dist: DistEnv, port: int, timeout: timedelta) -> Any:
    """The group's TCPStore: served by rank 0 on a socket listening before anything slow runs,
    joined by the others (a peer that comes early waits in the backlog, it is not refused)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public; stubs omit it

    if not dist.is_main:
        return TCPStore(dist.master_addr, port, dist.world_size, False, timeout)
    sock = _listen(port)
    return TCPStore(
        dist.master_addr,
        port,
        dist.world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),  # the store owns the descriptor from now on
    )


def destroy_process_group(*, together: bool = False) -> None:
    """Leave the default process group; a no-op when there is none (safe to call twice).

    ``together``: first wait at a barrier for every rank, when all of them are known to be
    leaving (a finished run, an agreed stop). A rank that tore its gloo connections down while
    its peer was still finishing (rank 0 writes the last checkpoint and the ledger) was once
    seen to abort at exit ("terminate called without an active exception"), failing a run that
    had finished. A barrier that fails (a peer already gone) is logged, never raised.

    Not ``together`` (an error path, a peer may be gone), an NCCL group is left as it is: its
    teardown can wait for collectives in flight that never finish (pytorch #141510), and the
    process is about to exit, which frees it anyway.
    """
    tdist = sys.modules.get("torch.distributed")
    if tdist is None:
        return  # torch was never imported, so no group was ever made
    if tdist.is_available() and tdist.is_initialized():
        if together and tdist.get_world_size() > 1:
            try:
                tdist.barrier()
            except Exception as exc:  # leaving anyway: say why, do not fail
                log.warning("leaving the process group without the others: %s", exc)
        if not together and tdist.get_backend() == "nccl":
            log.info("leaving the NCCL group without a teardown (the process is ending)")
            return
        tdist.destroy_process_group()


MAX_CANDIDATES = 16
"""How many ports rank 0 tries (the derived one, then hashed fallbacks) before giving up."""


def port_file(dist: DistEnv, rendezvous_dir: Path) -> Path:
    """Where rank 0 publishes the port of this attempt."""
    return rendezvous_dir / f"master_port.{dist.job_ref or 'local'}.{dist.attempt_key}"


def resolve_master_port(
    dist: DistEnv, rendezvous_dir: Path, *, timeout_s: float, poll_s: float = 0.05
) -> int:
    """The master port every rank of this attempt will use.

    Rank 0 picks the first free candidate and publishes it; other ranks wait up to
    ``timeout_s`` for the file (:class:`DistEnvError` then, with a hint). A single rank only
    probes: it has no one to tell. A port that was not derived is returned untouched.
    """
    if dist.port_source != "derived":
        return dist.master_port
    if dist.world_size == 1:
        return _first_free_port(dist)
    path = port_file(dist, rendezvous_dir)
    if dist.is_main:
        port = _first_free_port(dist)
        _publish(path, port)
        return port
    return _wait_for_port(path, dist, timeout_s, poll_s)


def _first_free_port(dist: DistEnv) -> int:
    # A race remains: the port is free now, and torch binds it a moment later (after this
    # probe socket is closed, or torch could not bind it at all). Another process may take it in
    # between; then torch fails with "address already in use" and the attempt fails loudly
    # rather than hanging. The window is short because this runs right before
    # init_process_group, and derived ports lie below the ephemeral range, so the kernel does
    # not hand them out to other processes' outgoing connections or bind(port=0) calls.
    tried: list[int] = []
    for candidate in range(MAX_CANDIDATES):
        port = derive_master_port(
            dist.job_id, dist.restart_count, candidate=candidate, launch=dist.launch
        )
        if port in tried:
            continue
        tried.append(port)
        if is_port_free(port):
            if candidate:
                log.warning("master port %d is taken; using fallback %d", tried[0], port)
            return port
    raise DistEnvError(
        f"ports {', '.join(map(str, tried))} are all in use on {dist.node_name or 'this node'} "
        f"(job {dist.job_ref}, attempt {dist.restart_count}). HINT: set dist.port to a port "
        "you know is free on the first node."
    )


def is_port_free(port: int) -> bool:
    """True if nothing on this host holds TCP ``port`` (on any IPv4 or IPv6 address)."""
    # No SO_REUSEADDR: without it bind() also refuses ports held by a listener on a specific
    # address and ports in TIME_WAIT, which is the conservative answer we want.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock6:
                sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock6.bind(("::", port))
        except OSError as exc:
            # No IPv6 on this host is fine; only an IPv6-only holder of the port makes it taken.
            return exc.errno != errno.EADDRINUSE
    return True


def _publish(path: Path, port: int) -> None:
    """Write the port so that a reader on any node sees no file or the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, f"{port}\n")


def _wait_for_port(path: Path, dist: DistEnv, timeout_s: float, poll_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        # Listing the directory makes an NFS client revalidate it, so a file created on
        # another node shows up without waiting out the negative lookup cache.
        with contextlib.suppress(OSError):
            os.listdir(path.parent)
        try:
            return int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    raise DistEnvError(
        f"rank {dist.rank} waited {timeout_s:g} s for rank 0 to publish the master port in "
        f"{path}. HINT: the run directory must be on a filesystem every node sees (not /tmp); "
        "if it is, see rank 0's log (logs/rank-0.err) for why it did not get there."
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (and ``torch.compile``) wrappers."""
    from torch import nn

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


def wrap_model(
    model: nn.Module, device: torch.device, *, exact: bool | None = None, **ddp_kwargs: Any
) -> nn.Module:
    """``model`` moved to ``device`` and wrapped in DistributedDataParallel (see
    :meth:`hpc_ddp.sessions.session.Session.wrap`)."""
    from torch import nn

    model = model.to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)
    if exact if exact is not None else device.type == "cpu":
        fix_bucket_layout(ddp)
    return ddp
