"""Where runs and sweeps stand, as ``hpc-ddp status`` shows them: typed, and asked of Slurm once.

:func:`collect_status` is what ``status`` shows for its targets (every run and sweep under the
runs directory when none is given): Slurm is asked once for every run shown, by job id, and
``sacct`` once for the jobs the controller no longer holds; :mod:`hpc_ddp.state` weighs that
against each run's ledger. A run whose manifest or files cannot be read is one ``DAMAGED``
:class:`RunStatus`, never the end of the list; plain runs come before the sweeps. The ``status``
verb prints what this returns (:func:`status_json` is its ``--json``), and :func:`hpc_ddp.runs`,
:meth:`hpc_ddp.Job.status` and :meth:`hpc_ddp.Sweep.status` return it, so a script and the
command line always see the same verdict.

Never imports torch: checkpoints are judged by their zip structure alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpc_ddp.api.arguments import path_arg
from hpc_ddp.api.targets import resolve_targets, sweep_task_of
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import MANIFEST_FILE
from hpc_ddp.rundir.manifest import Manifest, read_manifest
from hpc_ddp.state.report import (
    DAMAGED,
    ask_backend,
    damaged_row,
    fmt_elapsed,
    reason_lines,
    run_status,
    with_accounting,
)
from hpc_ddp.state.task import TaskState
from hpc_ddp.state.verdict import BackendView

if TYPE_CHECKING:
    from hpc_ddp.backends.registry import SlurmClient

RUN_ENDED = frozenset({*(s.value for s in JobState if s.finished), "INCOMPLETE", "GONE?", DAMAGED})
"""A run's verdicts after which it does not go on by itself: Slurm's final states, a job that
ended without finishing (``INCOMPLETE``), one gone with no word of how (``GONE?``), and a run
whose files cannot be read. A guess made while Slurm does not answer (``RUNNING?``,
``FAILED?``) is not final: Slurm may answer at the next look."""
TASK_ENDED = frozenset(
    {TaskState.FINISHED.value, TaskState.FAILED.value, TaskState.CANCELLED.value}
)
"""A sweep task's states after which it does not go on by itself."""
SUCCEEDED = frozenset({"COMPLETED", TaskState.FINISHED.value})
"""A run's verdict, or a sweep task's state, that says training finished."""


@dataclass(frozen=True)
class RunStatus:
    """One run as ``hpc-ddp status`` shows it: the row of its table and the lines under it.

    :meth:`to_dict` is its entry of ``status --json`` (schema ``hpc-ddp.status/1``,
    :mod:`hpc_ddp.output`): the fields below under the same names, ``run`` as ``run_dir`` and
    ``job`` as ``job_id``. For a sweep task (a :class:`~hpc_ddp.api.job.Job` of
    :meth:`~hpc_ddp.api.sweep.Sweep.tasks`) :attr:`state` is the sweep table's word for it
    (``finished``, ``failed``, ``running``, ...); :attr:`ended` and :attr:`succeeded` read
    both vocabularies alike.
    """

    run: str
    """The run directory."""
    job: str | None
    """Its current Slurm job id (a local run: its controller's pid; a sweep task: its
    ``ARRAYJOB_TASK``)."""
    backend: str | None
    state: str
    """The verdict: Slurm's state weighed against the run's ledger (``COMPLETED`` only when
    training finished; ``INCOMPLETE``, ``GONE?``, ``DAMAGED``, ...)."""
    nodes: str | None
    """Where it runs or last ran (a Slurm nodelist); None when not known."""
    elapsed_s: float | None
    """Seconds from its first attempt's start to now (running) or to its last end."""
    attempts: int | None
    """Attempts in the ledger, across every job of the run."""
    causes: tuple[str, ...]
    """Each attempt's end cause, oldest first (``running`` for one still going)."""
    ckpt_step: int | None
    """The newest checkpoint on disk that looks whole (``checkpoint_step`` in JSON)."""
    loss: float | None
    """The last loss logged."""
    failed_rank: str | None
    note: str | None
    attempt_list: tuple[Mapping[str, Any], ...] = ()
    """Every attempt (``status --attempts``)."""
    code_changed: Mapping[str, Any] | None = None
    """Set when the latest attempt ran other code than the first (``file``, ``digest``,
    ``first_file``, ``first_digest``); None when it did not, or nothing recorded it."""
    reasons: tuple[str, ...] = ()
    """The lines ``status`` prints under its table for this run: the rank that failed first,
    and why the run stands where it does."""

    @property
    def run_dir(self) -> Path:
        """:attr:`run` as a path."""
        return Path(self.run)

    @property
    def ended(self) -> bool:
        """True once the run will not go on by itself (completed, failed, cancelled, ...)."""
        return self.state in RUN_ENDED or self.state in TASK_ENDED

    @property
    def succeeded(self) -> bool:
        """True when training finished (``COMPLETED``; a sweep task: ``finished``)."""
        return self.state in SUCCEEDED

    @property
    def damaged(self) -> bool:
        """True when the run's manifest or files cannot be read (``DAMAGED``)."""
        return self.state == DAMAGED

    @property
    def elapsed(self) -> str:
        """:attr:`elapsed_s` as ``H:MM:SS`` for a table; ``-`` for none."""
        return fmt_elapsed(self.elapsed_s)

    def to_dict(self) -> dict[str, Any]:
        """The run's entry of ``hpc-ddp status --json`` (``runs`` of schema
        ``hpc-ddp.status/1``)."""
        return {
            "run_dir": self.run, "job_id": self.job, "backend": self.backend,
            "state": self.state, "nodes": self.nodes, "elapsed_s": self.elapsed_s,
            "attempts": self.attempts, "causes": list(self.causes),
            "checkpoint_step": self.ckpt_step, "loss": self.loss,
            "failed_rank": self.failed_rank, "note": self.note, "reasons": list(self.reasons),
            "code_changed": None if self.code_changed is None else dict(self.code_changed),
            "attempt_list": [attempt_json(a) for a in self.attempt_list],
        }  # fmt: skip

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunStatus:
        """A status from one row of :func:`hpc_ddp.state.report.run_status`."""
        elapsed = row.get("elapsed_s")
        return cls(
            run=str(row["run"]),
            job=row["job"],
            backend=row["backend"],
            state=str(row["state"]),
            nodes=None if row["nodes"] in (None, "-", "") else str(row["nodes"]),
            elapsed_s=None if elapsed is None else round(float(elapsed), 3),
            attempts=row["attempts"],
            causes=tuple(c for c in str(row["causes"]).split(",") if c and c != "-"),
            ckpt_step=row["ckpt step"],
            loss=row["loss"],
            failed_rank=row["failed_rank"],
            note=row["note"],
            code_changed=row.get("code_changed"),
            attempt_list=tuple(row["attempt_list"]),
            reasons=tuple(reason_lines(dict(row))),
        )


def attempt_json(a: Mapping[str, Any]) -> dict[str, Any]:
    """One attempt of a run's ``attempt_list`` as ``status --json`` prints it: ``job`` as
    ``job_id`` and ``world`` as ``world_size``, like everywhere else."""
    renamed = {"job": "job_id", "world": "world_size"}
    # An attempt that ran on no Slurm node (a local run) has no nodelist: null, not "".
    return {renamed.get(k, k): (None if v == "" else v) for k, v in a.items()}


@dataclass(frozen=True)
class SweepStatus:
    """One sweep as ``hpc-ddp status`` shows it: how many tasks are in each state, and one row
    per task (the rows of ``hpc-ddp results``, in index order)."""

    sweep: str
    """The sweep directory."""
    summary: Mapping[str, int]
    """Tasks per state (``pending``, ``running``, ``requeued``, ``finished``, ``failed``,
    ``cancelled``, ``unknown``), zeros included."""
    tasks: tuple[Mapping[str, Any], ...]
    task: int | None = None
    """Set when one task was asked for by its directory: :attr:`tasks` is that task alone."""

    @property
    def sweep_dir(self) -> Path:
        """:attr:`sweep` as a path."""
        return Path(self.sweep)

    @property
    def ended(self) -> bool:
        """True once no task will go on by itself (each finished, failed or was cancelled)."""
        return all(t["state"] in TASK_ENDED for t in self.tasks)

    @property
    def succeeded(self) -> bool:
        """True when every task finished."""
        return all(t["state"] == TaskState.FINISHED.value for t in self.tasks)

    @property
    def unfinished(self) -> list[Mapping[str, Any]]:
        """The rows of the tasks that have not finished (yet)."""
        return [t for t in self.tasks if t["state"] != TaskState.FINISHED.value]

    def to_dict(self) -> dict[str, Any]:
        """The sweep's entry of ``hpc-ddp status --json`` (``sweeps`` of schema
        ``hpc-ddp.status/1``): each task as a row of ``results --json``; ``task`` is the one
        task asked for by its directory, else null."""
        return {
            "sweep_dir": self.sweep,
            "summary": dict(self.summary),
            "tasks": [dict(t) for t in self.tasks],
            "task": self.task,
        }


def status_json(found: Sequence[RunStatus | SweepStatus]) -> dict[str, Any]:
    """What ``hpc-ddp status --json`` prints for :func:`collect_status`'s answer: schema
    ``hpc-ddp.status/1``, the runs (``runs``) and the sweeps (``sweeps``)."""
    from hpc_ddp.output import STATUS, document

    return document(
        STATUS,
        {
            "runs": [s.to_dict() for s in found if isinstance(s, RunStatus)],
            "sweeps": [s.to_dict() for s in found if isinstance(s, SweepStatus)],
        },
    )


def add_goodput(shown: dict[str, Any]) -> None:
    """``status --goodput``: add each run's (and sweep task's) goodput account to
    :func:`status_json`'s document, and each sweep's sum, as ``goodput``."""
    from hpc_ddp.state.goodput import total
    from hpc_ddp.state.report import run_goodput, still_running

    for row in shown["runs"]:
        if row["state"] != DAMAGED:
            row["goodput"] = run_goodput(Path(row["run_dir"]), running=still_running(row["state"]))
    for entry in shown["sweeps"]:
        accounts = []
        for task in entry["tasks"]:
            # A task's state is a TaskState ("running"), a run's Slurm's word ("RUNNING").
            g = run_goodput(Path(task["run_dir"]), running=still_running(task["state"]))
            task["goodput"] = g
            accounts.append(g)
        entry["goodput"] = total(accounts)


def goodput_lines(shown: dict[str, Any]) -> list[str]:
    """The lines ``status --goodput`` prints for the accounts :func:`add_goodput` added: each
    run's, each sweep's sum and a line per task."""
    from hpc_ddp.state.goodput import describe

    lines = []
    for row in shown["runs"]:
        if "goodput" in row:
            lines.append(f"\n{row['run_dir']}")
            lines.append("\n".join(describe(row["goodput"])))
    for entry in shown["sweeps"]:
        lines.append(f"\n{entry['sweep_dir']} ({len(entry['tasks'])} tasks)")
        lines.append("\n".join(describe(entry["goodput"])))
        for task in entry["tasks"]:
            g = task["goodput"]
            lines.append(f"  task {task['index']}: ETTR {g.ettr:.2f} of {g.wall_s:.0f} s")
    return lines


def collect_status(
    targets: Sequence[str], runs_dir: Path, backends: Registry | None
) -> list[RunStatus | SweepStatus]:
    """What ``hpc-ddp status TARGETS`` shows: one :class:`RunStatus` per plain or damaged run,
    then one :class:`SweepStatus` per sweep, then one per sweep task asked for by its
    directory (``SWEEP_DIR/tasks/N``). No targets: every run and sweep under ``runs_dir``.

    A target that names nothing is a :class:`~hpc_ddp.errors.TargetError` with a hint.
    ``backends``: where each run's backend is picked, and the queue asked (None: the real ones).
    """
    tasks = {t: found for t in targets if (found := _sweep_task(t)) is not None}
    others = [t for t in targets if t not in tasks]
    dirs = resolve_targets(others, runs_dir) if others or not tasks else []
    registry = registry_of(backends)
    manifests = _read_manifests(dirs, registry)
    good = {d: m for d, m in manifests.items() if isinstance(m, Manifest)}
    sweeps = [d for d in good if (d / "tasks").is_dir()]
    # The ids a queue holds (a local run's are pids, which no queue knows), asked all at once
    # of the one queue there is, Slurm's.
    plain = [
        j for d, m in good.items() if d not in sweeps for j in registry.backend(m).job_refs(d, m)
    ]
    arrays = [j for d in sweeps for j in good[d].array_jobs]
    arrays += [j for sweep, _ in tasks.values() for j in read_manifest(sweep).array_jobs]
    queue = registry.backend("slurm")
    view = ask_backend(queue, list(dict.fromkeys([*plain, *arrays])), plain)
    view = with_accounting(queue, view, _unheld(sweeps, tasks, view))
    rows, entries = _collect(dirs, manifests, sweeps, view, registry)
    entries += [_task_entry(sweep, index, view, registry) for sweep, index in tasks.values()]
    return [*(RunStatus.from_row(r) for r in rows), *(SweepStatus(**e) for e in entries)]


def runs(
    runs_dir: str | Path | None = None,
    *,
    backends: Registry | None = None,
    slurm: SlurmClient | None = None,
) -> list[RunStatus | SweepStatus]:
    """Every run and sweep under ``runs_dir`` (else ``$HPC_DDP_RUNS_DIR``, else ``./runs``),
    as ``hpc-ddp status`` lists them: one :class:`RunStatus` per run (a damaged one included,
    ``DAMAGED``), then one :class:`SweepStatus` per sweep. Slurm is asked once for them all
    (``backends``: the registry to ask through, or, deprecated, ``slurm``, a Slurm client
    alone; None: the real commands)."""
    registry = registry_of(backends, slurm)
    import os

    from hpc_ddp.submission.submit import runs_dir_from

    base = runs_dir_from(path_arg("runs_dir", runs_dir), os.environ)
    return collect_status([], base, registry)


def _sweep_entry(sweep_dir: Path, view: BackendView, backends: Registry) -> dict[str, Any]:
    # Imported here: a listing of plain runs needs none of the sweep's readers.
    from hpc_ddp.sweep.results import gather_results, row_dict, sweep_summary

    # live None: states from the ledgers alone; sacct for the tasks squeue no longer holds.
    rows = gather_results(
        sweep_dir, backends.sweeps_of(sweep_dir), view.live, accounting=view.accounting
    )
    tasks = tuple(row_dict(r) for r in rows)
    return {"sweep": str(sweep_dir), "summary": sweep_summary(rows), "tasks": tasks}


def _unheld(sweeps: list[Path], tasks: dict[str, tuple[Path, int]], view: BackendView) -> list[str]:
    """The array jobs of the sweeps shown whose tasks squeue no longer holds (all of them may
    have ended long ago): sacct is asked about those."""
    if view.live is None:
        return []
    from hpc_ddp.sweep.results import unheld_arrays

    dirs = dict.fromkeys([*sweeps, *(sweep for sweep, _ in tasks.values())])
    return list(dict.fromkeys(j for d in dirs for j in unheld_arrays(d, view.live)))


def _sweep_task(target: str) -> tuple[Path, int] | None:
    """(sweep dir, point) for a target that is a sweep task's directory (it has no manifest
    of its own: the sweep's records say which array task runs it), made or not: a task that has
    not started has none yet."""
    path = Path(target)
    if (path / MANIFEST_FILE).exists():
        return None
    return sweep_task_of(path)


def _task_entry(
    sweep_dir: Path, index: int, view: BackendView, backends: Registry
) -> dict[str, Any]:
    """One sweep task, as the sweep's own entry shows it, alone."""
    entry = _sweep_entry(sweep_dir, view, backends)
    entry["tasks"] = tuple(t for t in entry["tasks"] if t["index"] == index)
    entry["summary"] = {state: sum(t["state"] == state for t in entry["tasks"])
                        for state in entry["summary"]}  # fmt: skip
    entry["task"] = index
    return entry


def _read_manifests(dirs: list[Path], backends: Registry) -> dict[Path, Manifest | RunDirError]:
    """Each run's manifest, or why it cannot be read (that run becomes a DAMAGED row).

    A Slurm run's job ids must be job ids: ``--me`` or ``1,2`` there is a damaged manifest,
    shown as such rather than left out of the squeue call in silence.
    """
    manifests: dict[Path, Manifest | RunDirError] = {}
    for d in dirs:
        try:
            manifest = read_manifest(d)
            backends.backend(manifest).job_refs(d, manifest)  # raises for an id that is no job id
            manifests[d] = manifest
        except RunDirError as exc:
            manifests[d] = exc
    return manifests


def _collect(
    dirs: list[Path],
    manifests: dict[Path, Manifest | RunDirError],
    sweeps: list[Path],
    view: BackendView,
    backends: Registry,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per plain or damaged run, one entry per sweep), in the order of ``dirs``."""
    rows = []
    entries = []
    for d in dirs:
        manifest = manifests[d]
        if isinstance(manifest, RunDirError):
            rows.append(damaged_row(d, manifest))
        elif d in sweeps:
            try:
                entries.append(_sweep_entry(d, view, backends))
            except (RunDirError, OSError) as exc:
                rows.append(damaged_row(d, exc))
        else:
            rows.append(run_status(d, view, backends))
    return rows, entries


# --- waiting ------------------------------------------------------------------------------------

FIRST_POLL_S = 0.5
MAX_POLL_S = 15.0
"""Looks start fast (a short job ends in about a second) and back off to this: a long wait
then costs slurmctld one small squeue every 15 s, as ``submit --wait`` does."""

S = TypeVar("S", RunStatus, SweepStatus)


def wait_until_ended(
    look: Callable[[], S],
    *,
    timeout: float | None,
    what: str,
    poll_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    between: Callable[[], None] | None = None,
    settled: Callable[[], bool] | None = None,
) -> S:
    """Look (``look()``) until the status says ended, backing off between looks; ``poll_s``
    fixes the pause instead. Past ``timeout`` seconds a :class:`WaitTimeoutError` naming
    ``what`` and where it stood. ``between`` runs before each look (a local job started by
    this process is reaped there); ``settled()``, asked once the status says ended, must agree
    too (a local run's processes have exited)."""
    from hpc_ddp.errors import WaitTimeoutError

    deadline = None if timeout is None else time.monotonic() + timeout
    delay = FIRST_POLL_S if poll_s is None else poll_s
    while True:
        if between is not None:
            between()
        status = look()
        if status.ended and (settled is None or settled()):
            return status
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise WaitTimeoutError(
                f"{what}: still {_state_words(status)} after waiting {timeout:g} s; it goes on. "
                "HINT: wait again with a longer timeout (or none), look with .status() or "
                f"`hpc-ddp status {_where(status)}`, or stop it with .cancel()",
                status=status,
            )
        pause = delay if deadline is None else min(delay, max(0.0, deadline - now))
        sleep(pause)
        if poll_s is None:
            delay = min(MAX_POLL_S, delay * 1.5)


def _state_words(status: RunStatus | SweepStatus) -> str:
    if isinstance(status, RunStatus):
        return status.state
    return ", ".join(f"{n} {state}" for state, n in status.summary.items() if n) or "no tasks"


def _where(status: RunStatus | SweepStatus) -> str:
    return status.run if isinstance(status, RunStatus) else status.sweep
