"""Faults: how fast a dead rank, a hang, a stuck step and a lost node are found and training
goes on, as p50 and max over repeated faults.

The job is the built-in trainer on a small MLP whose data loads at a wall-clock pace, 2 ranks
on 2 of the dev cluster's 3 nodes, with hpc-ddp's default ``fault:`` settings except
``standby_after_s: 5`` (the default 20 s would only make each fault wait longer for its
standby; a fault sooner than that after a launch's first step starts cold). One job per kind
takes ``--runs`` faults in a row, each once the launch before has trained and its standby is
idle, on rank 1 and rank 0 in turn (the same node twice in a row would rightly be left out):

* **dead rank**: SIGKILL. Back to the first training step: p50 <= 3 s, max <= 8 s;
* **hang**: SIGSTOP. Found by its heartbeat within 5 s, training again within 10 s (max);
* **stuck**: the rank's data waits for ever inside a step, its process and heartbeat alive
  (``tests.e2e_util.STALL_DIR_ENV``). Found by the step deadline within max(10 s, 5 x the p99
  step time) + one beat (the deadline is checked once a beat), training again within 10 s of
  that;

then, one job each (a lost node leaves the allocation for good):

* **node loss**, ``slurm.spare_nodes: 1``: rank 1's node (its slurmd, slurmstepd and rank
  SIGKILLed). Training again <= 8 s after the fault;
* **node loss, no spare**: the job is requeued away from the lost node. Its next launch within
  15 s of the fault, not counting Slurm's hold of the requeued job (from the requeue to the
  next attempt's start, which ``cred_expire`` decides);

and the requeue path of a dead rank (``fault.max_restarts: 0``, ``requeue.on_crash``), whose
time back is compared with the in-job restart's p50 (<= 0.2x).

Every fault must be blamed on the rank and node it hit, and every job must end with the final
weights of an uninterrupted twin. The time back is to the end of the next launch's first step
(``metrics.jsonl``, written every step), from the fault as injected.

It runs on a dev cluster of its own, brought up for it and taken down after (unless it was
already up): 3 nodes, ``SlurmdTimeout=5``, ``cred_expire`` 10 s. Run:
``python -m benchmarks.bench_faults [--runs N] [--node-runs N] [--quick]`` as root, on a
quiet machine; ``--quick`` is 3 runs of the in-job kinds, one node loss with a spare.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import idle, rank_pids
from benchmarks.common import BIN, REPO, Targets
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.ledger import read_ledger

STATE_DIR_SUFFIX = "-faults"
"""The benchmark's cluster lives beside the default dev cluster, in its own state dir."""
STALL_DIR_ENV = "HPC_DDP_TEST_STALL_DIR"
"""``tests.e2e_util.STALL_DIR_ENV`` (the benchmark does not import the tests)."""
DEAD_P50_S, DEAD_MAX_S = 3.0, 8.0
HANG_FOUND_S, HANG_BACK_S = 5.0, 10.0
STUCK_FLOOR_S, STUCK_BACK_S = 10.0, 10.0
NODE_SPARE_S, NODE_AWAY_S = 8.0, 15.0
RATIO_TARGET = 0.2
TRAIN_BEFORE_S = 8.0
"""How long each launch trains before its fault (its standby starts after 5 s)."""
STEP_S = 0.1


def job(steps: int, *, extra: str = "", slurm: str = "", stall_dir: Path | None = None) -> str:
    """The job: ``steps`` steps, a checkpoint every 50, metrics every step; ``stall_dir``:
    where a rank's stall file makes it stuck (:data:`STALL_DIR_ENV`)."""
    stall = f", {STALL_DIR_ENV}: '{stall_dir}'" if stall_dir is not None else ""
    return (
        "name: bench-faults\n"
        f"slurm: {{nodes: 2, {slurm}tasks_per_node: 1, cpus_per_task: 1, time: '00:30:00'}}\n"
        f'env: {{vars: {{OMP_NUM_THREADS: "1"{stall}}}}}\n'
        "train: {model: mlp, dataset: 'tests.e2e_util:io_bound_synthetic', "
        f"max_steps: {steps}, checkpoint_every: 50, log_every: 1, batch_size: 32, "
        "synthetic_samples: 4096, eval_every: 0}\n" + extra
    )


@dataclass(frozen=True)
class Fault:
    """One injected fault and what the ledger and metrics say of it."""

    kind: str
    at: float
    rank: int
    node: str
    detected: float | None
    back: float | None
    """The end of the next launch's first step (the next attempt's, after a requeue)."""
    blamed_ranks: tuple[int, ...]
    blamed_nodes: tuple[str, ...]
    queued_s: float = 0.0
    """Slurm's hold of a requeued job, left out of its time back."""

    @property
    def found_s(self) -> float:
        return (self.detected or float("inf")) - self.at

    @property
    def back_s(self) -> float:
        return (self.back or float("inf")) - self.at - self.queued_s


@dataclass(frozen=True)
class Series:
    """One kind's faults, and whether its job ended with the twin's weights."""

    kind: str
    faults: tuple[Fault, ...]
    twin_weights: bool


def _hpc(*args: str, env: Mapping[str, str]) -> str:
    done = subprocess.run(
        [str(BIN / "hpc-ddp"), *args], cwd=REPO, env=dict(env), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"hpc-ddp {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def _wait(what: str, probe: Callable[[], object], timeout_s: float = 300.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"not seen within {timeout_s:.0f} s: {what}")


def _job_field(job_id: str, env: Mapping[str, str], name: str) -> str:
    """``NAME=value`` of ``scontrol show job -o``: the value, or "" once Slurm forgot it."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=dict(env), capture_output=True,
        text=True, check=False,
    ).stdout  # fmt: skip
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith(f"{name}=")), "")


def _job_state(job_id: str, env: Mapping[str, str]) -> str:
    return _job_field(job_id, env, "JobState")


def _start_time(job_id: str, env: Mapping[str, str]) -> float | None:
    """When Slurm last started ``job_id``'s batch script (``StartTime``, whole seconds)."""
    text = _job_field(job_id, env, "StartTime")
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _submit(name: str, tmp: Path, env: Mapping[str, str], text: str) -> tuple[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / f"{name}.yaml"
    config.write_text(text)
    # A lemon record of its own per job: faults injected on purpose, one kind after another,
    # would otherwise make a node a lemon for the next kind.
    env = {**env, "XDG_STATE_HOME": str(tmp / "state")}
    out = json.loads(_hpc("submit", str(config), "--runs-dir", str(tmp / "runs"), "--json",
                          env=env))  # fmt: skip
    return str(out["job_id"]), Path(out["run_dir"])


def _finish(job_id: str, env: Mapping[str, str], timeout_s: float = 900) -> str:
    """Wait for the job to end for good; its final state."""
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    _wait(f"job {job_id} done", lambda: _job_state(job_id, env) in done, timeout_s)
    return _job_state(job_id, env)


def final_weights(run_dir: Path, env: Mapping[str, str]) -> str:
    """The newest checkpoint's weights digest, as ``hpc-ddp checkpoints`` reports it."""
    rows = json.loads(_hpc("checkpoints", str(run_dir), "--json", env=dict(env)))["checkpoints"]
    return str(rows[-1]["weights_digest"]) if rows else "none"


def twin_weights(tmp: Path, env: Mapping[str, str], steps: int) -> str:
    """The final weights of the job run once without a fault."""
    job_id, run_dir = _submit("twin", tmp / "twin", env, job(steps))
    state = _finish(job_id, env)
    if state != "COMPLETED":
        raise RuntimeError(f"the uninterrupted twin ended {state}")
    return final_weights(run_dir, env)


def _ledger(run_dir: Path) -> list[Attempt]:
    try:
        return read_ledger(run_dir / "ledger.jsonl")
    except (OSError, ValueError):
        return []


def _started(run_dir: Path, launches: int) -> bool:
    """Whether ``launches`` launches have started."""
    return sum(1 for a in _ledger(run_dir) if a.launched_at is not None) >= launches


def _first_step_after(run_dir: Path, since: float) -> float | None:
    """When rank 0 logged its first step after ``since`` (wall clock)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    times = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "step" in row and float(row.get("time", 0)) > since:
            times.append(float(row["time"]))
    return min(times) if times else None


def _standby_idle(job_id: str, launch: int) -> bool:
    """Every rank of ``launch`` waits on standby with its imports done (no CPU for 0.5 s)."""
    pids = [p for rank in (0, 1) for p in rank_pids(job_id, rank, launch=launch)[-1:]]
    return len(pids) == 2 and idle(pids)


def _node_of(run_dir: Path, rank: int) -> str:
    first = _ledger(run_dir)[0]
    return first.nodelist.split(",")[rank]


def _inject(kind: str, job_id: str, launch: int, rank: int, stall_dir: Path) -> float:
    if kind == "stuck":
        at = time.time()
        (stall_dir / f"stall-{rank}").write_text(str(launch))
        return at
    pid = _wait(f"rank {rank}'s process", lambda: rank_pids(job_id, rank, launch=launch)[-1:])
    sig = signal.SIGSTOP if kind == "hang" else signal.SIGKILL
    at = time.time()
    os.kill(int(pid[0]), sig)  # type: ignore[index]
    return at


def in_job_series(
    kind: str, runs: int, tmp: Path, env: Mapping[str, str], twin: str, steps: int
) -> Series:
    """``runs`` faults of ``kind`` in one job, each once its launch trained and its standby
    is idle."""
    stall_dir = tmp / "stall"
    stall_dir.mkdir(parents=True, exist_ok=True)
    extra = f"fault: {{standby_after_s: 5, max_restarts: {runs + 2}, no_progress_limit: 0}}\n"
    job_id, run_dir = _submit(kind.replace(" ", "-"), tmp, env,
                              job(steps, extra=extra, stall_dir=stall_dir))  # fmt: skip
    injected: list[tuple[float, int, str, int]] = []
    for launch in range(runs):
        rank = 1 if launch % 2 == 0 else 0
        _wait(f"launch {launch} started", partial(_started, run_dir, launch + 1))
        _wait(f"launch {launch} trains", partial(_first_step_after, run_dir, time.time()), 120)
        time.sleep(TRAIN_BEFORE_S)
        _wait(f"launch {launch + 1}'s standby", partial(_standby_idle, job_id, launch + 1), 60)
        node = _node_of(run_dir, rank)
        at = _inject(kind, job_id, launch, rank, stall_dir)
        injected.append((at, rank, node, launch))
        _wait(f"launch {launch + 1}", partial(_started, run_dir, launch + 2), 120)
        if kind == "hang":  # let the stopped process go: its step is over, it is killed
            time.sleep(0.5)
        print(f"  {kind} {launch + 1}/{runs}: rank {rank} on {node}", flush=True)
    state = _finish(job_id, env)
    faults = _read_faults(kind, run_dir, injected)
    same = state == "COMPLETED" and final_weights(run_dir, env) == twin
    return Series(kind, faults, same)


def _read_faults(
    kind: str, run_dir: Path, injected: list[tuple[float, int, str, int]]
) -> tuple[Fault, ...]:
    attempts = _ledger(run_dir)
    by_launch = {(a.restart, a.launch): a for a in attempts}
    out = []
    for at, rank, node, launch in injected:
        ended = by_launch.get((0, launch))
        blame = ended.blame if ended is not None else None
        nxt = by_launch.get((0, launch + 1))
        back = None
        if nxt is not None and nxt.launched_at is not None:
            back = _first_step_after(run_dir, nxt.launched_at)
        out.append(Fault(
            kind, at, rank, node, blame.detected_at if blame is not None else None, back,
            blame.ranks if blame is not None else (), blame.nodes if blame is not None else (),
        ))  # fmt: skip
    return tuple(out)


def node_loss(
    kind: str, tmp: Path, env: Mapping[str, str], state_dir: Path, twin: str, steps: int
) -> Series:
    """One lost node (rank 1's): with a spare, an in-job restart on the other two nodes;
    without, a requeue away from it."""
    spare = "spare_nodes: 1, " if kind == "node loss" else ""
    extra = "fault: {standby_after_s: 5}\nrequeue: {max_requeues: 3}\n"
    job_id, run_dir = _submit(kind.replace(" ", "-").replace(",", ""), tmp, env,
                              job(steps, extra=extra, slurm=spare))  # fmt: skip
    _wait("launch 0 trains", lambda: _first_step_after(run_dir, 0.0), 120)
    time.sleep(TRAIN_BEFORE_S)
    node = _node_of(run_dir, 1)
    at = time.time()
    devcluster.kill_node(state_dir, node)
    try:
        state = _finish(job_id, env)
        began = _start_time(job_id, env)  # the last attempt's, before Slurm forgets the job
    finally:
        devcluster.revive_node(state_dir, node, env, timeout_s=120)
    attempts = _ledger(run_dir)
    faulted = attempts[0]
    blame = faulted.blame
    nxt = next((a for a in attempts[1:] if a.launched_at is not None), None)
    back = _first_step_after(run_dir, nxt.launched_at) if nxt and nxt.launched_at else None
    queued = 0.0
    if nxt is not None and nxt.restart != faulted.restart and faulted.launch_ended is not None:
        # Requeued: the new attempt's first launch came after Slurm held and restarted the job.
        # The hold runs from the supervisor's requeue (the end of its launch) to the new
        # attempt's batch start (Slurm's StartTime, whole seconds: floored, so the hold left
        # out is never longer than it was); the launch away is the rest, from the fault to the
        # requeue plus from the batch start to the new launch.
        queued = max(0.0, began - faulted.launch_ended) if began is not None else 0.0
        back = nxt.launched_at
    same = state == "COMPLETED" and final_weights(run_dir, env) == twin
    fault = Fault(
        kind, at, 1, node, blame.detected_at if blame is not None else None, back,
        blame.ranks if blame is not None else (), blame.nodes if blame is not None else (),
        queued,
    )  # fmt: skip
    return Series(kind, (fault,), same)


def requeue_path(tmp: Path, env: Mapping[str, str], twin: str, steps: int) -> Series:
    """A dead rank through Slurm's requeue (no in-job restart): its time back, hold included."""
    extra = "fault: {max_restarts: 0}\nrequeue: {on_crash: true}\n"
    job_id, run_dir = _submit("requeue", tmp, env, job(steps, extra=extra))
    _wait("launch 0 trains", lambda: _first_step_after(run_dir, 0.0), 120)
    time.sleep(TRAIN_BEFORE_S)
    at = _inject("dead rank", job_id, 0, 1, tmp)
    node = _node_of(run_dir, 1)
    state = _finish(job_id, env)
    attempts = _ledger(run_dir)
    blame = attempts[0].blame
    nxt = next((a for a in attempts[1:] if a.launched_at is not None), None)
    back = _first_step_after(run_dir, nxt.launched_at) if nxt and nxt.launched_at else None
    same = state == "COMPLETED" and final_weights(run_dir, env) == twin
    fault = Fault(
        "requeue", at, 1, node, blame.detected_at if blame is not None else None, back,
        blame.ranks if blame is not None else (), blame.nodes if blame is not None else (),
    )  # fmt: skip
    return Series("requeue", (fault,), same)


def cluster_env() -> tuple[Path, dict[str, str], bool]:
    """The benchmark's cluster (up now), the environment its clients need, and whether it was
    brought up here (then it is taken down at the end)."""
    default = devcluster.state_dir_from(os.environ)
    state_dir = default.with_name(default.name + STATE_DIR_SUFFIX)
    spec = devcluster.resolve_spec(state_dir, nodes=3, slurmd_timeout_s=5, cred_expire_s=10)
    was_up = devcluster.pid_alive(devcluster.layout_for(state_dir, spec).ctld_pid) is not None
    result = devcluster.up(state_dir, os.environ, spec)
    env = {**os.environ, "SLURM_CONF": str(result.conf), "PATH": f"{BIN}:{os.environ['PATH']}"}
    return state_dir, env, not was_up


def run_kinds(
    kinds: list[str],
    runs: int,
    node_runs: int,
    root: Path,
    env: Mapping[str, str],
    state_dir: Path,
) -> list[Series]:
    """Each kind's series, printed as it ends."""
    # In one job: steps enough for every fault's train-and-standby wait (about 12 s of
    # training each), and 20 s more. A job with one fault (after TRAIN_BEFORE_S): 30 s.
    long, short = runs * 150 + 200, 300
    results: list[Series] = []
    twins: dict[int, str] = {}

    def twin(steps: int) -> str:
        if steps not in twins:
            twins[steps] = twin_weights(root / f"twin-{steps}", env, steps)
            print(f"twin (no fault, {steps} steps): final weights {twins[steps][:16]}",
                  flush=True)  # fmt: skip
        return twins[steps]

    for kind in kinds:
        where = root / kind.replace(" ", "-")
        if kind in ("dead rank", "hang", "stuck"):
            results.append(in_job_series(kind, runs, where, env, twin(long), long))
        elif kind in ("node loss", "node loss no spare"):
            name = "node loss" if kind == "node loss" else "node loss, no spare"
            series = [node_loss(name, where / str(i), env, state_dir, twin(short), short)
                      for i in range(node_runs)]  # fmt: skip
            results.append(Series(name, tuple(f for s in series for f in s.faults),
                                  all(s.twin_weights for s in series)))  # fmt: skip
        elif kind == "requeue":
            results.append(requeue_path(where, env, twin(short), short))
        else:
            raise ValueError(f"no fault kind {kind!r}")
        print(_table(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="faults of each in-job kind")
    parser.add_argument("--node-runs", type=int, default=3, help="jobs of each node-loss kind")
    parser.add_argument("--kinds", default="dead rank,hang,stuck,node loss,node loss no spare,"
                        "requeue", help="comma-separated")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="3 runs; one node loss (spare)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if args.quick:
        args.runs, args.node_runs = 3, 1
        kinds = [k for k in kinds if k not in ("node loss no spare", "requeue")]
    if os.geteuid() != 0:
        print("bench_faults needs root (it brings up its own dev cluster)", file=sys.stderr)
        return 1
    try:
        state_dir, env, started = cluster_env()
    except HpcDdpError as exc:
        print(f"bench_faults: no cluster: {exc}", file=sys.stderr)
        return 1
    try:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            results = run_kinds(kinds, args.runs, args.node_runs, Path(tmp), env, state_dir)
    finally:
        if started:
            devcluster.down(state_dir)
    return check(results).exit_code()


def _p50_max(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


def _table(s: Series) -> str:
    found = [f.found_s for f in s.faults]
    back = [f.back_s for f in s.faults]
    (fp, fm), (bp, bm) = _p50_max(found), _p50_max(back)
    rows = "\n".join(
        f"    {f.kind} on rank {f.rank} ({f.node}): found {f.found_s:6.2f} s, training again "
        f"{f.back_s:6.2f} s"
        + (f" (+{f.queued_s:.1f} s held by Slurm)" if f.queued_s else "")
        + f"; blamed ranks {list(f.blamed_ranks)} nodes {list(f.blamed_nodes)}"
        for f in s.faults
    )
    return (
        f"{s.kind:20} n={len(s.faults):2}  found p50 {fp:6.2f} s max {fm:6.2f} s   training "
        f"again p50 {bp:6.2f} s max {bm:6.2f} s   final weights "
        f"{'equal the twin' if s.twin_weights else 'DIFFER from the twin'}\n{rows}"
    )


def check(results: list[Series]) -> Targets:
    """Every target, one line each."""
    t = Targets()
    by = {s.kind: s for s in results}
    for s in results:
        found = [f.found_s for f in s.faults]
        back = [f.back_s for f in s.faults]
        named = all(
            f.blamed_nodes == (f.node,) and f.blamed_ranks in (((), (f.rank,)))
            if s.kind.startswith("node loss") else
            (f.blamed_ranks, f.blamed_nodes) == ((f.rank,), (f.node,))
            for f in s.faults
        )  # fmt: skip
        t.check(f"{s.kind} blames the rank and node hit (1 = yes)", float(named), "==", 1,
                fmt=".0f")  # fmt: skip
        t.check(f"{s.kind} final weights equal the twin's (1 = yes)", float(s.twin_weights),
                "==", 1, fmt=".0f")  # fmt: skip
        p50, top = _p50_max(back)
        if s.kind == "dead rank":
            t.check("dead rank back p50", p50, "<=", DEAD_P50_S, fmt=".2f", unit=" s")
            t.check("dead rank back max", top, "<=", DEAD_MAX_S, fmt=".2f", unit=" s")
        elif s.kind == "hang":
            t.check("hang found max", max(found), "<=", HANG_FOUND_S, fmt=".2f", unit=" s")
            t.check("hang back max", top, "<=", HANG_BACK_S, fmt=".2f", unit=" s")
        elif s.kind == "stuck":
            bound = max(STUCK_FLOOR_S, 5 * STEP_S) + 0.25  # the deadline, checked 0.05 s after it
            t.check("stuck found max", max(found), "<=", bound, fmt=".2f", unit=" s")
            since = max(f.back_s - f.found_s for f in s.faults)
            t.check("stuck back after found max", since, "<=", STUCK_BACK_S, fmt=".2f", unit=" s")
        elif s.kind == "node loss":
            t.check("node loss (spare) back max", top, "<=", NODE_SPARE_S, fmt=".2f", unit=" s")
        elif s.kind == "node loss, no spare":
            t.check("node loss (no spare) launch away max, hold left out", top, "<=",
                    NODE_AWAY_S, fmt=".2f", unit=" s")  # fmt: skip
    if "requeue" in by and "dead rank" in by:
        in_job = statistics.median(f.back_s for f in by["dead rank"].faults)
        ratio = in_job / by["requeue"].faults[0].back_s
        t.check("dead rank in-job p50 / requeue path", ratio, "<=", RATIO_TARGET, fmt=".3f")
    return t


if __name__ == "__main__":
    sys.exit(main())
