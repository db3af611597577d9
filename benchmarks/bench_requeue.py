"""Interrupting a training job on the dev cluster: hpc-ddp against a submitit ``Checkpointable``.

Both train the quickstart MLP on the synthetic data, 2 nodes x 1 task over gloo, one intra-op
thread per rank, logging every step. Each run is sent ``scancel --signal=USR2`` (tasks only:
what Slurm sends before a time limit) once it has logged step 20, and measured:

* signal -> requeue: until ``Restarts`` goes up in ``scontrol show job`` (polled every 50 ms;
  the same yardstick for both). For hpc-ddp also until its ledger's ``attempt_end``, written
  right after rank 0's ``scontrol requeue`` came back.
* signal -> stopped: until the job is PENDING again, i.e. every process of the attempt ended.
* restart -> first step: from the requeued job being seen RUNNING again to the first step the
  new attempt logged. Slurm's hold of a requeued job (``cred_expire`` + 1 s, 11 s on the dev
  cluster) is left out: both jobs are released with ``scontrol update StartTime=now`` at once.
* steps lost: the step last logged when the signal was sent, minus the step the new attempt
  resumed from (0 when the stop came later than the signal, as it should).

Run from the repository root with the dev cluster up (``hpc-ddp dev-cluster up``):
``python -m benchmarks.bench_requeue [--repeats 3] [--no-submitit]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import e2e_util as e2e
from tests.conftest import Cluster

DEV_CONF = "/var/lib/hpc-ddp/dev-cluster/slurm.conf"
SIGNAL_AT_STEP = 20
TOTAL_STEPS = 160
TRAIN = [
    f"train.max_steps={TOTAL_STEPS}",
    "train.checkpoint_every=50",
    "train.log_every=1",
    e2e.STEADY_THREADS,
]


@dataclass(frozen=True)
class Interruption:
    """One measured interruption."""

    signal_to_requeue_s: float
    """Signal sent -> Restarts incremented in scontrol."""
    signal_to_request_s: float | None
    """Signal sent -> the job's own record of its requeue request (hpc-ddp's ledger)."""
    signal_to_stopped_s: float
    """Signal sent -> every process of the attempt gone (the job seen PENDING again)."""
    restart_to_first_step_s: float
    steps_lost: int
    steps_after_signal: int
    """Steps the stopped attempt still completed after the signal (the stop is at a boundary)."""


def _watch_requeue(cluster: Cluster, job_id: str, sent: float) -> tuple[float, float, float]:
    """Seconds from ``sent`` until Restarts went up and until the job was PENDING again, and
    the time it was seen RUNNING again (holds released at once)."""
    requeued = stopped = 0.0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        fields = e2e.job_fields(cluster, job_id)
        now = time.time()
        if not requeued and int(fields.get("Restarts", "0")) >= 1:
            requeued = now
        if requeued:
            if not stopped and fields["JobState"] == "PENDING":
                stopped = now
            if fields["JobState"] == "RUNNING" and stopped:
                return requeued - sent, stopped - sent, now
            e2e.release_if_held(cluster, job_id, fields)
        elif fields["JobState"] in e2e.FINAL_STATES:
            raise RuntimeError(f"job {job_id} ended {fields['JobState']} without a requeue")
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id}: no requeue within 180 s")


def measure_hpc_ddp(cluster: Cluster, runs: Path) -> Interruption:
    """Submit the quickstart job, interrupt it once, let it finish; the figures."""
    job = e2e.submit(cluster, runs, "jobs/quickstart.yaml", *TRAIN)
    e2e.wait_step(job.run_dir, SIGNAL_AT_STEP, timeout_s=180)
    signalled_at = e2e.last_step(job.run_dir)
    sent = e2e.signal_job(cluster, job.job_id)
    to_requeue, to_stopped, running = _watch_requeue(cluster, job.job_id, sent)
    fields = e2e.wait_done(cluster, job.job_id)
    if fields["JobState"] != "COMPLETED":
        raise RuntimeError(f"hpc-ddp job {job.job_id} ended {fields['JobState']}")
    first, second = e2e.ledger(job.run_dir)[:2]
    assert first.ended is not None
    assert second.resumed_from_step is not None
    resumed = second.resumed_from_step
    step_times = [
        r["time"] for r in e2e.metric_rows(job.run_dir) if "loss" in r and r["step"] > resumed
    ]
    return Interruption(
        signal_to_requeue_s=to_requeue,
        signal_to_request_s=first.ended - sent,
        signal_to_stopped_s=to_stopped,
        restart_to_first_step_s=step_times[0] - running,
        steps_lost=max(0, signalled_at - resumed),
        steps_after_signal=max(0, resumed - signalled_at),
    )


# --- the same job, written for submitit ----------------------------------------------------


class SubmititTrainer:
    """A submitit ``Checkpointable``: the quickstart MLP under DDP, state saved by
    ``checkpoint()`` (called in rank 0's signal handler, as submitit does), restored on start.
    Rank 0 appends ``{"time", "step", "attempt"}`` to ``out/metrics.jsonl`` after every step.
    """

    def __init__(self, out: str, total_steps: int) -> None:
        self.out = out
        self.total_steps = total_steps
        self.step = 0
        self._live: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"out": self.out, "total_steps": self.total_steps, "step": 0, "_live": {}}

    def __call__(self) -> int:
        import submitit
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.utils.data import DataLoader, DistributedSampler

        from hpc_ddp.config import TrainConfig
        from hpc_ddp.data import SyntheticImages
        from hpc_ddp.models import build_mlp

        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        dist.init_process_group("gloo")
        cfg = TrainConfig()
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(build_mlp(cfg))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        ckpt = Path(self.out, "state.pt")
        if ckpt.exists():
            state = torch.load(ckpt, weights_only=False)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            self.step = int(state["step"])
        self._live = {"model": model, "opt": opt}
        data = SyntheticImages(4096, cfg.num_classes, cfg.image_size, 0)
        sampler: DistributedSampler[Any] = DistributedSampler(
            data, env.world_size, env.rank, seed=0
        )
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        epoch = 0
        while self.step < self.total_steps:
            sampler.set_epoch(epoch)
            for x, y in DataLoader(data, batch_size=64, sampler=sampler):
                if self.step >= self.total_steps:
                    break
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                self.step += 1
                if env.rank == 0:
                    with open(Path(self.out, "metrics.jsonl"), "a") as f:
                        row = {"time": time.time(), "step": self.step, "attempt": attempt}
                        f.write(json.dumps(row) + "\n")
            epoch += 1
        dist.destroy_process_group()
        return self.step

    def checkpoint(self) -> Any:
        import submitit
        import torch

        model, opt = self._live["model"], self._live["opt"]
        state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": self.step}
        tmp = Path(self.out, "state.pt.tmp")
        torch.save(state, tmp)
        tmp.replace(Path(self.out, "state.pt"))
        return submitit.helpers.DelayedSubmission(self)


def measure_submitit(cluster: Cluster, folder: Path) -> Interruption:
    """The same interruption for the submitit job."""
    import submitit

    out = folder / "out"
    out.mkdir(parents=True)
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    executor.update_parameters(
        timeout_min=10, slurm_partition="debug", nodes=2, tasks_per_node=1, cpus_per_task=1,
        slurm_setup=["export OMP_NUM_THREADS=1"],
    )  # fmt: skip
    # By its importable name, not __main__'s: the nodes unpickle it from the module.
    from benchmarks.bench_requeue import SubmititTrainer as Trainer

    job = executor.submit(Trainer(str(out), TOTAL_STEPS))
    metrics = out / "metrics.jsonl"

    def rows() -> list[dict[str, Any]]:
        return e2e.metric_rows(out) if metrics.exists() else []

    e2e.wait_for(
        f"submitit step {SIGNAL_AT_STEP}",
        lambda: any(r["step"] >= SIGNAL_AT_STEP for r in rows()),
        timeout_s=180,
    )
    signalled_at = max(r["step"] for r in rows())
    sent = e2e.signal_job(cluster, job.job_id)
    to_requeue, to_stopped, running = _watch_requeue(cluster, job.job_id, sent)
    fields = e2e.wait_done(cluster, job.job_id)
    if fields["JobState"] != "COMPLETED":
        raise RuntimeError(f"submitit job {job.job_id} ended {fields['JobState']}")
    later = [r for r in rows() if r["attempt"] >= 1]
    resumed = later[0]["step"] - 1
    return Interruption(
        signal_to_requeue_s=to_requeue,
        signal_to_request_s=None,
        signal_to_stopped_s=to_stopped,
        restart_to_first_step_s=later[0]["time"] - running,
        steps_lost=max(0, signalled_at - resumed),
        steps_after_signal=max(0, resumed - signalled_at),
    )


def _line(label: str, values: list[float], unit: str = "s") -> str:
    if not values:
        return f"  {label:34} -"
    return (
        f"  {label:34} median {statistics.median(values):6.2f} {unit}"
        f"   min {min(values):6.2f}   max {max(values):6.2f}   (n={len(values)})"
    )


def report(tool: str, runs: list[Interruption]) -> None:
    """Print one tool's figures."""
    print(tool)
    print(_line("signal -> requeue (Restarts+1)", [r.signal_to_requeue_s for r in runs]))
    own = [r.signal_to_request_s for r in runs if r.signal_to_request_s is not None]
    if own:
        print(_line("signal -> requeue request (ledger)", own))
    print(_line("signal -> attempt stopped (PENDING)", [r.signal_to_stopped_s for r in runs]))
    print(_line("restart -> first training step", [r.restart_to_first_step_s for r in runs]))
    print(_line("steps lost", [float(r.steps_lost) for r in runs], "steps"))
    print(_line("steps run after the signal", [float(r.steps_after_signal) for r in runs], "steps"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="interruptions per tool")
    parser.add_argument("--no-submitit", action="store_true", help="measure hpc-ddp only")
    args = parser.parse_args(argv)
    os.environ.setdefault("SLURM_CONF", DEV_CONF)
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    if "UP" not in ping.stdout:
        print(f"the dev cluster is not up ({ping.stdout.strip() or ping.stderr.strip()}); "
              "start it with `hpc-ddp dev-cluster up`", file=sys.stderr)  # fmt: skip
        return 1
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    cluster = Cluster(Path(DEV_CONF).parent, Path(os.environ["SLURM_CONF"]), env, "")
    tools: dict[str, Callable[[Path], Interruption]] = {
        "hpc-ddp": lambda d: measure_hpc_ddp(cluster, d),
    }
    if not args.no_submitit:
        tools["submitit Checkpointable"] = lambda d: measure_submitit(cluster, d)
    results: dict[str, list[Interruption]] = {tool: [] for tool in tools}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        for i in range(args.repeats):
            # Interleaved, each tool first in turn, so neither always meets a warmer machine.
            order = list(tools.items()) if i % 2 == 0 else list(reversed(tools.items()))
            for tool, measure in order:
                results[tool].append(measure(Path(tmp, f"{tool.split()[0]}-{i}")))
                print(f"{tool} #{i}: {results[tool][-1]}", file=sys.stderr, flush=True)
    for tool, runs in results.items():
        report(tool, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
