"""A run's log files: which ones a run has, and reading them.

On Slurm srun puts rank N's stderr in ``logs/rank-N.err`` and its stdout in ``logs/rank-N.out``
(the local backend does the same); hpc-ddp's own progress (steps, loss, checkpoints, stops,
errors) is Python logging, which writes to stderr. The batch script's own log is
``logs/batch-<job>.{out,err}`` (a sweep task's: the sweep's
``logs/batch-<array job>_<task id>``, see :func:`~hpc_ddp.backends.arrays.batch_logs`).
``hpc-ddp logs`` and :meth:`hpc_ddp.Job.logs` find them here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from hpc_ddp.api.targets import (
    find_array_task,
    point_task,
    require_dir,
    resolve_targets,
    sweep_task_of,
)
from hpc_ddp.backends.arrays import batch_logs, format_index_ranges, live_task
from hpc_ddp.backends.jobs import is_job_ref
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.errors import BackendError, HpcDdpError, RunDirError, TargetError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import read_manifest
from hpc_ddp.sweep.records import read_sweep_record

LOG_STREAMS = ("err", "out")
"""The streams a log is read from: a rank's (or the batch script's) stderr and stdout."""


def log_target(target: str, task: int | None, runs_dir: Path) -> tuple[Path, int | None]:
    """(the directory, the sweep task) whose logs ``target`` means: a path as given, or the run
    of a job id (``ARRAYJOB_TASK``: its sweep and point) under ``runs_dir``, found as ``status``
    and ``cancel`` find it (:func:`~hpc_ddp.api.targets.resolve_targets`)."""
    path = Path(target)
    if path.exists() or not is_job_ref(target) or sweep_task_of(path) is not None:
        return path, task
    if task is not None:
        raise TargetError(
            f"--task {task}: {target} is a job id, not a sweep directory. HINT: pass the sweep "
            "directory with --task, or the array task's own id (ARRAYJOB_TASK, e.g. 1234_5)."
        )
    if "_" in target:
        found = find_array_task(target, runs_dir)
        return found.sweep_dir, found.point
    runs = resolve_targets([target], runs_dir)
    if len(runs) > 1:
        raise TargetError(
            f"job id {target} names {len(runs)} runs under {runs_dir}: "
            f"{', '.join(map(str, runs))}. HINT: pass the run directory instead."
        )
    return runs[0], None


def run_paths(target: Path, task: int | None) -> RunPaths:
    """The run directory to read: ``target`` itself, or sweep task ``task`` of it (whose
    directory is made when the task starts: until then it has no logs)."""
    if task is None and not target.exists() and sweep_task_of(target) is not None:
        return RunPaths(target)  # SWEEP_DIR/tasks/N of a task that has not started
    paths = RunPaths(require_dir(str(target)))
    have = _task_indices(paths)
    if task is None:
        if have:
            raise TargetError(
                f"{target} is a sweep directory with tasks {_ranges(have)}. "
                "HINT: pick one with --task N."
            )
        return paths
    if task not in have:
        what = f"has tasks {_ranges(have)}" if have else "is not a sweep directory (no tasks/)"
        raise TargetError(
            f"--task {task}: {target} {what}. HINT: pass a sweep directory printed by "
            "`hpc-ddp sweep` and one of its task indices."
        )
    return paths.task(task)


def _task_indices(paths: RunPaths) -> list[int]:
    """A sweep directory's points (``sweep.yaml``'s: a task that has not started has no
    directory yet), else (no readable record) the task directories under ``tasks/``; [] for a
    run directory."""
    if not paths.tasks.is_dir():
        return []
    try:
        return sorted(p.index for p in read_sweep_record(paths.root).points)
    except RunDirError:
        return sorted(int(p.name) for p in paths.tasks.iterdir() if p.name.isdigit())


def check_rank(paths: RunPaths, rank: int) -> None:
    """A :class:`TargetError` (exit 2) for a rank the run does not have: its resolved config
    says how many it has (``nodes x tasks_per_node``); a run without a readable config is not
    checked (its logs say what there is)."""
    from hpc_ddp.config.load import load_resolved_config
    from hpc_ddp.rundir.taskconfig import load_task_config

    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(
            f"rank={rank!r}: expected an int, not {type(rank).__name__}. HINT: pass a rank "
            "number, e.g. rank=0."
        )
    if rank < 0:
        raise TargetError(
            f"--rank {rank}: no such rank (ranks are numbered from 0). HINT: pass --rank 0, or "
            "another rank of the run."
        )
    task = None if paths.config.is_file() else sweep_task_of(paths.root)
    try:
        # A sweep task that has not started has its config in the sweep's packed file only.
        cfg = load_task_config(*task) if task is not None else load_resolved_config(paths.config)
    except (HpcDdpError, OSError):
        return
    ranks = cfg.slurm.ntasks
    if rank < 0 or rank >= ranks:
        have = "0" if ranks == 1 else f"0-{ranks - 1}"
        raise TargetError(
            f"--rank {rank}: no such rank (the run has {ranks} rank{'s' if ranks > 1 else ''}: "
            f"{have}). HINT: pass --rank {have if ranks == 1 else f'0 to {ranks - 1}'}."
        )


def _ranges(indices: list[int]) -> str:
    """``0-3, 7`` for [0, 1, 2, 3, 7]."""
    return format_index_ranges(indices).replace(",", ", ")


def _log_file(path: Path) -> Path | None:
    """``path`` if it is a log file, None if there is none yet; anything else in its place (a
    directory, a dangling symlink) is a :class:`RunDirError`."""
    if path.is_file():
        return path
    if path.exists():
        raise RunDirError(
            f"{path}: is not a regular file, so not a log. HINT: something else created it; "
            "move it aside (the job writes the log there)."
        )
    if path.is_symlink():
        raise RunDirError(
            f"{path}: a symlink to {path.readlink()}, which does not exist. HINT: restore the "
            "file it points to, or remove the link."
        )
    return None


def log_paths(paths: RunPaths, *, rank: int, stream: str, batch: bool) -> list[Path]:
    """The log files asked for that exist ([] when none does yet)."""
    streams = ["err", "out"] if stream == "both" else [stream]
    found: list[Path | None] = []
    for s in streams:
        if batch:
            found.extend(_log_file(p) for p in batch_logs(paths.logs, s)[-1:])
        else:
            found.append(_log_file(paths.rank_log(rank, s)))
    return [p for p in found if p is not None]


def missing_logs(paths: RunPaths, *, rank: int, stream: str, batch: bool) -> RunDirError:
    """The error for logs that do not exist (yet), listing those that do."""
    streams = ["err", "out"] if stream == "both" else [stream]
    have = sorted(p.name for p in paths.logs.glob("*")) if paths.logs.is_dir() else []
    name = "batch-*" if batch else f"rank-{rank}"
    if not paths.root.exists() and sweep_task_of(paths.root) is not None:
        return RunDirError(
            f"{paths.root}: sweep task {paths.root.name} has not started yet, so there is no "
            f"{name}.{'/'.join(streams)} log. HINT: `hpc-ddp status {paths.root}` shows its "
            "state; `hpc-ddp logs --follow` waits for the log while the task is queued."
        )
    return RunDirError(
        f"{paths.logs}: no {name}.{'/'.join(streams)} log yet. "
        f"HINT: logs present: {', '.join(have) or 'none (has the job started?)'}."
    )


def read_log(paths: RunPaths, *, rank: int = 0, stream: Literal["err", "out"] = "err",
             batch: bool = False) -> str:  # fmt: skip
    """The text of one log of a run (``rank``'s, or the batch script's newest), as it is now.

    A rank the run does not have is a :class:`TargetError`; a log that does not exist (yet) a
    :class:`RunDirError` listing the logs there are. Bytes that are not UTF-8 are replaced.
    """
    if stream not in LOG_STREAMS:
        raise ValueError(
            f"stream={stream!r} is not a log stream. HINT: pass one of "
            f"{', '.join(map(repr, LOG_STREAMS))} (stderr: hpc-ddp's progress and tracebacks; "
            "stdout: what the script printed)."
        )
    if not batch:
        check_rank(paths, rank)
    found = log_paths(paths, rank=rank, stream=stream, batch=batch)
    if not found:
        raise missing_logs(paths, rank=rank, stream=stream, batch=batch)
    try:
        return found[0].read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RunDirError(
            f"{found[0]}: cannot read it ({exc.strerror or exc}). HINT: check its permissions."
        ) from None


def job_waiting(
    backends: Registry | None, target: Path, task: int | None, paths: RunPaths
) -> str | None:
    """``job 12 is PENDING`` while the job that writes ``paths``' logs is queued or running;
    None once it has ended, or when that cannot be told (no job id, Slurm not answering)."""
    live, said = job_liveness(backends, target, task, paths)
    return said if live else None


def job_liveness(
    backends: Registry | None, target: Path, task: int | None, paths: RunPaths
) -> tuple[bool | None, str]:
    """Whether the job that writes ``paths``' logs is queued or running: (True, ``job 12 is
    PENDING``), (False, "") once it has ended (squeue no longer holds it, or holds it in a
    finished state; a local run's processes are gone), (None, "") when that cannot be told
    (no job id, Slurm not answering). ``backends``: where the run's backend is picked (None:
    the real ones)."""
    registry = registry_of(backends)
    sweep = (target, task) if task is not None else sweep_task_of(target)
    try:
        if sweep is not None:
            ref = point_task(*sweep).ref
            job, _, index = ref.partition("_")
            info = live_task(registry.backend("slurm").states([job]), job, int(index))
        else:
            manifest = read_manifest(paths.root)
            backend = registry.backend(manifest)
            return backend.running(paths.root, manifest.job_id, str(paths.manifest))
    except (RunDirError, BackendError):
        return None, ""
    if info is None or info.state.finished:
        return False, ""
    return True, f"job {ref} is {info.state.value}"
