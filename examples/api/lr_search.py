"""Search for a learning rate with nothing but hpc-ddp's Python API: a plain loop that submits a
run, waits for it, reads its validation loss from ``metrics()`` and picks the next rate.

Run it on a login node (no torch is imported here; the runs import it on the nodes)::

    python examples/api/lr_search.py                            # 4 runs of jobs/quickstart.yaml
    python examples/api/lr_search.py --rounds 2 --set train.max_steps=40 --set slurm.nodes=1

The search walks in log(lr): it starts at ``--lr``, steps up by ``--factor``, keeps going while
the loss falls, and when a step makes it worse turns back from the best rate so far with half
the step (the factor's square root). A run that fails (a rate that diverges, a crash) scores
infinity and the search goes on; ``hpc_ddp.RunFailedError`` carries its reason lines. The
same loop works with ``hpc_ddp.submit_sweep`` and ``Sweep.results()`` for several rates per
round.
"""

from __future__ import annotations

import argparse
import math
import sys

import hpc_ddp


def val_loss(job: hpc_ddp.Job) -> float:
    """The run's last validation loss (each step counted once, resumes included)."""
    losses = [row["val_loss"] for row in job.metrics() if row.get("val_loss") is not None]
    return float(losses[-1]) if losses else math.inf


def evaluate(lr: float, args: argparse.Namespace) -> tuple[float, hpc_ddp.Job]:
    """Train one run at ``lr`` and return its validation loss (infinity if it failed)."""
    job = hpc_ddp.submit(args.config, [f"train.lr={lr!r}", *args.set], backend=args.backend,
                         runs_dir=args.runs_dir)  # fmt: skip
    try:
        job.wait(timeout=args.timeout)
    except hpc_ddp.RunFailedError as failed:
        print(f"  lr {lr:.4g} failed: {'; '.join(failed.reasons) or failed}", file=sys.stderr)
        return math.inf, job
    return val_loss(job), job


def search(args: argparse.Namespace) -> dict[float, float]:
    """Every rate tried and its loss, in the order tried."""
    tried: dict[float, float] = {}
    best, step, direction = args.lr, math.log(args.factor), 1.0
    lr = args.lr
    for number in range(1, args.rounds + 1):
        loss, job = evaluate(lr, args)
        tried[lr] = loss
        print(f"round {number}: lr {lr:.4g} -> val_loss {loss:.4f} ({job.run_dir})", flush=True)
        if loss < tried[best]:
            best = lr  # better: keep walking the same way
        elif lr != best:
            direction, step = -direction, step / 2  # worse: turn back, with half the step
        lr = best * math.exp(direction * step)
        while lr in tried:  # never run a rate twice
            step /= 2
            lr = best * math.exp(direction * step)
    return tried


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="jobs/quickstart.yaml", help="the job to tune")
    parser.add_argument("--lr", type=float, default=0.05, help="the first rate tried")
    parser.add_argument("--factor", type=float, default=4.0, help="the first step (x or /)")
    parser.add_argument("--rounds", type=int, default=4, help="runs in all, one at a time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every run, e.g. train.max_steps=40")  # fmt: skip
    parser.add_argument("--runs-dir", help="where the runs go (default $HPC_DDP_RUNS_DIR, ./runs)")
    parser.add_argument("--backend", default="auto", choices=["auto", "slurm", "local"])
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run, at most")
    args = parser.parse_args(argv)
    try:
        tried = search(args)
    except hpc_ddp.HpcDdpError as exc:  # a bad config, no Slurm: the message has a HINT
        print(f"lr_search: error: {exc}", file=sys.stderr)
        return exc.exit_code
    best = min(tried, key=lambda lr: tried[lr])
    print(f"best: lr {best:.4g} (val_loss {tried[best]:.4f}) of {len(tried)} run(s)")
    return 0 if math.isfinite(tried[best]) else 1


if __name__ == "__main__":
    sys.exit(main())
