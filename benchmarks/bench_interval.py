"""``train.checkpoint_every: auto`` against every fixed interval, on one seeded fault schedule.

Run: ``python -m benchmarks.bench_interval [--quick] [--seed N] [--measured C,W,R]``.

1. **Measure** C (the stall of a save), W (until it is durable) and R (a restart: a fresh
   process to its first step after restoring the checkpoint) with a short real local run: one
   CPU process through :class:`~hpc_ddp.sessions.session.Session` training the built-in
   ``resnet18`` (an 89 MB checkpoint) at ``checkpoint_every="auto"``; C and W are read back from
   the run's ledger (the ``checkpoint`` lines), R from a second process that resumes it.
   ``--measured C,W,R`` takes given numbers instead.
2. **Simulate** a run of :data:`HORIZON_FAULTS` mean times between faults of wall time under
   one seeded schedule of interruptions that lose every rank's state (exponential gaps, the
   same draws scaled to each MTBF: 60 s, 300 s, 1,800 s). The simulation follows the real
   mechanics, not the model's formula: a save blocks C, plus what is left of the previous write;
   it is durable W after it was asked for; a fault rolls back to the newest durable save, and
   the restart takes R (a fault during it restarts again). ``auto`` decides as the session
   does: a save at once to measure, then the model's interval from the costs and M estimated
   from the interruptions seen so far (the 8 h prior before the first), re-chosen after every
   save. The fixed intervals are 60 log-spaced values from 0.5 W to 2 h.
3. **Target** at each MTBF: ETTR of ``auto`` within 1 point of the best fixed interval's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, Targets
from hpc_ddp.checkpoint.interval import (
    DEFAULT_MAX_S,
    Exposure,
    SaveCost,
    choose_interval,
    estimate_mtbf,
)

SEED = 42
MTBFS = (60.0, 300.0, 1800.0)
HORIZON_FAULTS = 400
"""Wall time simulated, in mean times between faults: enough faults that one schedule's luck
is shared by every policy and small against the 1-point target."""
FIXED = 60


@dataclass(frozen=True)
class Costs:
    """The measured costs."""

    stall_s: float
    durable_s: float
    restart_s: float


# --- 1. measuring ---------------------------------------------------------------------------


def worker(run_dir: Path, steps: int) -> None:
    """One process of the measuring run: resnet18 on CPU at ``checkpoint_every="auto"``;
    prints the seconds from the process's start to its first step done."""
    began = float(os.environ.get("BENCH_STARTED", time.time()))
    import torch

    from benchmarks.checkpoint_cost import build
    from hpc_ddp.config.model import JobConfig, TrainConfig
    from hpc_ddp.sessions.session import Session

    config = JobConfig(name="interval", train=TrainConfig(checkpoint_every="auto", keep_last=2))
    model, opt = build("resnet18")
    x = torch.randn(4, 3, 32, 32)
    first: float | None = None
    with Session(run_dir, config) as s:
        s.restore(model=model, optimizer=opt)
        for _ in s.steps(s.progress.step + steps, checkpoint_every="auto"):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if first is None:
                first = time.time() - began
    print(json.dumps({"first_step_s": first}), flush=True)


def _run_worker(run_dir: Path, steps: int) -> dict[str, float]:
    env = {**os.environ, "BENCH_STARTED": repr(time.time()), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_interval", "--worker", str(run_dir), str(steps)],
        cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(tmp: Path) -> Costs:
    """C and W from a short real run's ledger, R from a second process resuming it."""
    from hpc_ddp.rundir.ledger import read_ledger

    run_dir = tmp / "run"
    _run_worker(run_dir, 60)
    resumed = _run_worker(run_dir, 5)
    saves = [s for a in read_ledger(run_dir / "ledger.jsonl") for s in a.saves]
    timed = [s for s in saves if s.durable_s is not None]
    if not timed:
        raise SystemExit("the measuring run recorded no save with its W")
    stall = sorted(s.stall_s for s in timed)[len(timed) // 2]
    durable = sorted(s.durable_s or 0.0 for s in timed)[len(timed) // 2]
    print(f"measured from {len(timed)} saves (medians) and one resume:", flush=True)
    return Costs(stall, max(durable, stall), resumed["first_step_s"])


# --- 2. simulating --------------------------------------------------------------------------

Policy = Callable[[Exposure], float]
"""The interval (seconds of work) after a save, from the exposure seen so far."""


def schedule(seed: int, horizon_units: float) -> list[float]:
    """Fault times in units of the MTBF: one seeded exponential draw per gap."""
    rng = random.Random(seed)
    times, t = [], 0.0
    while t < horizon_units:
        t += rng.expovariate(1.0)
        times.append(t)
    return times


def simulate(costs: Costs, policy: Policy, faults: Sequence[float], horizon: float) -> float:
    """ETTR of one policy over one fault schedule (absolute times): work kept / wall."""
    c, w, r = costs.stall_s, costs.durable_s, costs.restart_s
    t = 0.0
    fi = 0
    durable_work = 0.0  # work in the newest durable save
    interruptions = 0
    while t < horizon:
        next_fault = faults[fi] if fi < len(faults) else math.inf
        # Training from the newest durable save, saving as the policy says.
        work = durable_work
        pending: list[tuple[float, float]] = []  # (durable at, work it holds)
        write_free = t  # when the previous write ends
        # The first save comes at once (to measure it), as the session's; after a restart
        # the costs are known and the policy decides at once.
        interval = 0.0 if t == 0 else policy(Exposure(t, interruptions))
        last_save_work = work
        while True:
            due = t + max(0.0, interval - (work - last_save_work))
            if due >= min(next_fault, horizon):
                end = min(next_fault, horizon)
                work += end - t
                t = end
                break
            work += due - t
            t = due
            # The save: waits for the previous write, then blocks C; durable W - C later.
            start = max(t, write_free)
            blocked_until = start + c
            if blocked_until >= min(next_fault, horizon):
                t = min(next_fault, horizon)
                break
            t = blocked_until
            write_free = start + w
            pending.append((write_free, work))
            last_save_work = work
            # M is wall-clock time between faults (they strike restarts too), as in the model.
            interval = policy(Exposure(t, interruptions))
        for at, held in pending:
            if at <= t:
                durable_work = max(durable_work, held)
        if t >= horizon:
            return work / horizon
        # A fault: the state since the newest durable save is lost; restart (again if hit).
        interruptions += 1
        fi += 1
        t += r
        while fi < len(faults) and faults[fi] < t:
            fi += 1
            interruptions += 1
            t = faults[fi - 1] + r
    return durable_work / horizon


def auto_policy(costs: Costs) -> Policy:
    """What the session decides after each save (:mod:`hpc_ddp.sessions.autointerval`)."""
    cost = SaveCost(costs.stall_s, costs.durable_s, costs.restart_s)

    def decide(seen: Exposure) -> float:
        return choose_interval(cost, estimate_mtbf(seen, Exposure())).seconds

    return decide


def every(seconds: float) -> Policy:
    """A fixed interval."""

    def fixed(_seen: Exposure) -> float:
        return seconds

    return fixed


def fixed_grid(costs: Costs) -> list[float]:
    low, high = max(0.5 * costs.durable_s, 0.05), 7200.0
    return [low * (high / low) ** (i / (FIXED - 1)) for i in range(FIXED)]


def compare(costs: Costs, mtbf: float, seed: int, horizon_faults: int) -> dict[str, float]:
    horizon = horizon_faults * mtbf
    faults = [u * mtbf for u in schedule(seed, horizon_faults * 1.2)]
    auto = simulate(costs, auto_policy(costs), faults, horizon)
    fixed = [(simulate(costs, every(t), faults, horizon), t) for t in fixed_grid(costs)]
    best, best_t = max(fixed)
    chosen = choose_interval(
        SaveCost(costs.stall_s, costs.durable_s, costs.restart_s),
        estimate_mtbf(Exposure(horizon, horizon_faults), Exposure()),
        upper_s=DEFAULT_MAX_S,
    ).seconds
    stall = costs.stall_s / (chosen + costs.stall_s)  # the share of training time saves stall
    return {"mtbf_s": mtbf, "auto": auto, "best_fixed": best, "best_fixed_s": best_t,
            "auto_s_at_true_m": chosen, "stall_share": stall}  # fmt: skip


# --- 3. reporting ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--quick", action="store_true", help="200 MTBFs of wall time, not 400")
    parser.add_argument("--measured", help="C,W,R in seconds instead of a measuring run")
    parser.add_argument("--worker", nargs=2, metavar=("RUN_DIR", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(Path(args.worker[0]), int(args.worker[1]))
        return 0
    if args.measured:
        c, w, r = (float(v) for v in args.measured.split(","))
        costs = Costs(c, max(w, c), r)
        print("given costs:", flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-interval-") as tmp:
            costs = measure(Path(tmp))
    print(f"  C {costs.stall_s:.3f} s, W {costs.durable_s:.3f} s, R {costs.restart_s:.2f} s")
    horizon = 200 if args.quick else HORIZON_FAULTS
    print(f"schedule: seed {args.seed}, {horizon} MTBFs of wall time each\n")
    print(
        f"{'MTBF':>8} {'auto ETTR':>10} {'auto T*':>9} {'best fixed':>11} {'at T':>9} "
        f"{'gap (pt)':>9} {'C/(T*+C)':>9}"
    )
    targets = Targets()
    rows = [compare(costs, m, args.seed, horizon) for m in MTBFS]
    for row in rows:
        gap = 100 * (row["best_fixed"] - row["auto"])
        print(
            f"{row['mtbf_s']:>7.0f}s {row['auto']:>10.4f} {row['auto_s_at_true_m']:>8.1f}s "
            f"{row['best_fixed']:>11.4f} "
            f"{row['best_fixed_s']:>8.1f}s {gap:>9.2f} {100 * row['stall_share']:>8.2f}%"
        )
    print()
    for row in rows:
        gap = 100 * (row["best_fixed"] - row["auto"])
        targets.check(f"auto ETTR gap to the best fixed at MTBF {row['mtbf_s']:.0f} s", gap,
                      "<=", 1.0, fmt=".2f", unit=" pt")  # fmt: skip
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
