"""Faults: how fast a hang, a dead rank, a crash and a lost node are found, and training resumes.

Each fault (SIGSTOP, SIGKILL, SIGSEGV, the loss of its node) hits rank 1 of a 2-rank job (the
built-in trainer, a small MLP whose data loads at a wall-clock pace) right after its step-20
checkpoint, with hpc-ddp's default ``fault:`` settings. For each kind this prints the time to
detect (the fault to the supervisor's or a watchdog's declaration, from the ledger) and the time
to the first step again (to the next attempt's start), against targets:

* a hung rank (SIGSTOP) is found, and its step ended, within 60 s (``dist.timeout_s`` used to
  decide, after 300 s);
* every fault is blamed on rank 1 and the node it ran on, never on the survivor;
* training is back within 15 s of the fault (of the detection, for a hang), by an in-job restart;
* the in-job restart takes at most 0.2x the requeue path (the same dead rank with
  ``fault.max_restarts: 0`` and ``requeue.on_crash``), measured side by side on a cluster with
  Slurm's default ``cred_expire`` (120 s: a requeued job is held 121 s, as on a stock Slurm);
* every run ends with the final weights of an uninterrupted twin (the same job, no fault).

Node loss (rank 1's node: its slurmd, slurmstepd and rank SIGKILLed) runs twice: with
``slurm.spare_nodes: 1`` (an in-job restart on the other two nodes) and without (too few healthy
nodes: the supervisor requeues the job away from the lost node, through Slurm's hold, so only
its detection and blame have targets; its time back is printed).

It runs on a dev cluster of its own, brought up for it and taken down after (unless it was
already up): 3 nodes (the spare for node loss), ``SlurmdTimeout=5``, Slurm's default
``cred_expire``. Run: ``python -m benchmarks.bench_faults [--quick]`` as root; ``--quick``
leaves out the requeue comparison and node loss without a spare (two minutes of Slurm's hold
each).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cluster import rank_pids
from benchmarks.common import BIN, REPO, Targets
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.ledger import Attempt, read_ledger

STATE_DIR_SUFFIX = "-faults"
"""The benchmark's cluster lives beside the default dev cluster, in its own state dir."""
FAULT_AT = 20
STEPS = 40
DETECT_TARGET_S = 60.0
BACK_TARGET_S = 15.0
RATIO_TARGET = 0.2
JOB = f"""name: bench-faults
slurm: {{nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:15:00'}}
env: {{vars: {{OMP_NUM_THREADS: "1"}}}}
train: {{model: mlp, dataset: "tests.e2e_util:io_bound_synthetic", max_steps: {STEPS},
        checkpoint_every: 10, log_every: 5, batch_size: 32, synthetic_samples: 4096}}
"""


@dataclass(frozen=True)
class Measured:
    """One fault: when it was injected, declared, its step ended, training stepped again;
    whom it blamed, where rank 1 ran, and whether the final weights are the twin's."""

    kind: str
    fault: float
    detected: float
    ended: float
    back: float
    blame: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    rank1_node: str
    twin_weights: bool

    @property
    def ended_s(self) -> float:
        return self.ended - self.fault

    @property
    def detect_s(self) -> float:
        return self.detected - self.fault

    @property
    def back_s(self) -> float:
        return self.back - self.fault


def _hpc(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(BIN / "hpc-ddp"), *args], cwd=REPO, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"hpc-ddp {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def _wait(what: str, probe, timeout_s: float = 300.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"not seen within {timeout_s:.0f} s: {what}")


def _rank_pid(job_id: str, rank: int) -> int | None:
    pids = rank_pids(job_id, rank, launch=0)
    return pids[0] if pids else None


def _job_state(job_id: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True,
        check=False,
    ).stdout  # fmt: skip
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


def _submit(kind: str, tmp: Path, env: dict[str, str], job: str) -> tuple[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / f"{kind.replace(' ', '-')}.yaml"
    config.write_text(job)
    # A lemon record of its own per run: the faults injected on purpose, one kind after
    # another on rank 1's node, would otherwise make that node a lemon for the next kind.
    env = {**env, "XDG_STATE_HOME": str(tmp / "state")}
    out = json.loads(_hpc("submit", str(config), "--runs-dir", str(tmp / kind), "--json", env=env))
    return str(out["job_id"]), Path(out["run_dir"])


def _finish(job_id: str, env: dict[str, str]) -> str:
    """Wait for the job to end for good; its final state."""
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    _wait(f"job {job_id} done", lambda: _job_state(job_id, env) in done, 600)
    return _job_state(job_id, env)


def final_weights(run_dir: Path, env: Mapping[str, str]) -> str:
    """The newest checkpoint's weights digest, as ``hpc-ddp checkpoints`` reports it."""
    rows = json.loads(_hpc("checkpoints", str(run_dir), "--json", env=dict(env)))["checkpoints"]
    return str(rows[-1]["weights_digest"]) if rows else "none"


def twin_weights(tmp: Path, env: dict[str, str]) -> str:
    """The final weights of the job run once without a fault."""
    job_id, run_dir = _submit("twin", tmp, env, JOB)
    state = _finish(job_id, env)
    if state != "COMPLETED":
        raise RuntimeError(f"the uninterrupted twin ended {state}")
    return final_weights(run_dir, env)


def measure(
    kind: str, tmp: Path, env: dict[str, str], state_dir: Path, job: str, twin: str
) -> Measured:
    """Run ``job``, inject ``kind`` after the step-20 checkpoint, read the timings back."""
    job_id, run_dir = _submit(kind, tmp, env, job)
    _wait("the step-20 checkpoint", (run_dir / "checkpoints" / f"step-{FAULT_AT:08d}.pt").exists)
    first = read_ledger(run_dir / "ledger.jsonl")[0]
    rank1_node = first.nodelist.split(",")[1]
    killed_node: str | None = None
    if kind.startswith("node loss"):
        killed_node = rank1_node
        fault = time.time()
        devcluster.kill_node(state_dir, killed_node)
    else:
        pid = _wait("rank 1's process", lambda: _rank_pid(job_id, 1))
        sig = {"hang": signal.SIGSTOP, "segfault": signal.SIGSEGV}.get(kind, signal.SIGKILL)
        fault = time.time()
        os.kill(pid, sig)
    try:
        state = _finish(job_id, env)
    finally:
        if killed_node is not None:
            devcluster.revive_node(state_dir, killed_node, env, timeout_s=120)
    attempts = read_ledger(run_dir / "ledger.jsonl")
    same = state == "COMPLETED" and final_weights(run_dir, env) == twin
    return _timings(kind, fault, attempts, rank1_node, same)


def _timings(
    kind: str, fault: float, attempts: list[Attempt], rank1_node: str, same: bool
) -> Measured:
    faulted, again = attempts[0], attempts[-1]
    blame = faulted.blame
    if blame is None or blame.detected_at is None or len(attempts) < 2:
        raise RuntimeError(f"{kind}: no fault recorded: {attempts}")
    cause = faulted.cause.value if faulted.cause is not None else "?"
    ended = faulted.launch_ended if faulted.launch_ended is not None else again.launched_at
    return Measured(
        kind, fault, blame.detected_at, ended if ended is not None else again.started,
        again.started, f"{cause}: {blame.describe()}", blame.ranks, blame.nodes, rank1_node, same,
    )  # fmt: skip


def cluster_env() -> tuple[Path, dict[str, str], bool]:
    """The benchmark's cluster (up now), the environment its clients need, and whether it was
    brought up here (then it is taken down at the end)."""
    default = devcluster.state_dir_from(os.environ)
    state_dir = default.with_name(default.name + STATE_DIR_SUFFIX)
    spec = devcluster.resolve_spec(state_dir, nodes=3, slurmd_timeout_s=5, cred_expire_s=120)
    was_up = devcluster.pid_alive(devcluster.layout_for(state_dir, spec).ctld_pid) is not None
    result = devcluster.up(state_dir, os.environ, spec)
    env = {**os.environ, "SLURM_CONF": str(result.conf), "PATH": f"{BIN}:{os.environ['PATH']}"}
    return state_dir, env, not was_up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="leave out the requeue comparison")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_faults needs root (it brings up its own dev cluster)", file=sys.stderr)
        return 1
    try:
        state_dir, env, started = cluster_env()
    except HpcDdpError as exc:
        print(f"bench_faults: no cluster: {exc}", file=sys.stderr)
        return 1
    jobs = {
        "hang": JOB,
        "dead rank": JOB,
        "segfault": JOB,
        # One spare node: the restart runs on the other two at the same world size.
        "node loss": JOB.replace("nodes: 2,", "nodes: 2, spare_nodes: 1,"),
    }
    if not args.quick:
        # The requeue path of the same dead rank, and node loss with no spare (a requeue away
        # from the lost node): each waits out Slurm's hold after a requeue (cred_expire + 1 s).
        jobs["requeue"] = JOB + "fault: {max_restarts: 0}\nrequeue: {on_crash: true}\n"
        jobs["node loss, no spare"] = JOB
    results: dict[str, Measured] = {}
    try:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            twin = twin_weights(Path(tmp), env)
            print(f"twin (no fault): final weights {twin[:16]}", flush=True)
            for kind, job in jobs.items():
                # The requeue path is the dead rank's fault: a SIGKILL of rank 1.
                fault = "dead rank" if kind == "requeue" else kind
                m = measure(fault, Path(tmp) / kind.replace(" ", "-"), env, state_dir, job, twin)
                results[kind] = dataclasses.replace(m, kind=kind)
                print(_line(results[kind]), flush=True)
    finally:
        if started:
            devcluster.down(state_dir)
    return check(results).exit_code()


def _line(m: Measured) -> str:
    return (
        f"{m.kind:19} detect {m.detect_s:6.2f} s  step ended {m.ended_s:6.2f} s  first step "
        f"again {m.back_s:6.2f} s after the fault ({m.back - m.detected:6.2f} s after detection)"
        f"  rank 1 ran on {m.rank1_node}; blamed: {m.blame}  final weights "
        f"{'equal the twin' if m.twin_weights else 'DIFFER from the twin'}"
    )


IN_JOB = ("hang", "dead rank", "segfault", "node loss")
"""The faults restarted inside the allocation (the others go through Slurm's requeue)."""


def check(results: dict[str, Measured]) -> Targets:
    """Every target, one line each."""
    targets = Targets()
    for kind, m in results.items():
        targets.check(f"{kind} detect", m.detect_s, "<=", DETECT_TARGET_S, fmt=".2f", unit=" s")
        if kind == "hang":
            targets.check("hang step ended", m.ended_s, "<=", DETECT_TARGET_S, fmt=".2f",
                          unit=" s")  # fmt: skip
        named = m.ranks == (1,) and m.nodes == (m.rank1_node,)
        if kind.startswith("node loss"):  # the node is the culprit; its rank may be named too
            named = m.nodes == (m.rank1_node,) and m.ranks in ((), (1,))
        targets.check(f"{kind} blames rank 1 on {m.rank1_node} (1 = yes)", float(named), "==", 1,
                      fmt=".0f")  # fmt: skip
        targets.check(f"{kind} final weights equal the twin's (1 = yes)", float(m.twin_weights),
                      "==", 1, fmt=".0f")  # fmt: skip
        if kind not in IN_JOB:
            continue
        # A hang is found by design only after fault.stale_s: training is back that much later.
        back = m.back - m.detected if kind == "hang" else m.back_s
        since = "detection" if kind == "hang" else "fault"
        targets.check(
            f"{kind} first step again (from {since})", back, "<=", BACK_TARGET_S, fmt=".2f",
            unit=" s",
        )  # fmt: skip
    if "requeue" in results:
        ratio = results["dead rank"].back_s / results["requeue"].back_s
        print(f"dead rank: in-job {results['dead rank'].back_s:.2f} s, requeue path "
              f"{results['requeue'].back_s:.2f} s (fault -> first step again)")  # fmt: skip
        targets.check("dead rank in-job / requeue path", ratio, "<=", RATIO_TARGET, fmt=".3f")
    return targets


if __name__ == "__main__":
    sys.exit(main())
