"""hpc-ddp on GPUs against the loops researchers write by hand: one command, exit 1 on a miss.

Run it on a machine with one or more CUDA GPUs (from a checkout or the installed wheel, torch
2.3 or newer, no network): ``python -m benchmarks.bench_gpu``. It takes about 5 minutes on one
GPU. Without a GPU it says "no CUDA GPU: only the CPU checks ran", runs the same machinery on
the CPU with a tiny model (no targets: the CPU's own targets are ``bench_trainer``'s), and exits
0 when that worked.

Every variant runs in fresh processes (one per GPU, torchrun's environment), interleaved round
by round in a rotated order, so a slow spell of the machine falls on all of them.

(a) The built-in trainer (``run_training`` in a session) against the tutorials' hand-written
    DDP loop (:mod:`benchmarks.handwritten_ddp`): the same resnet18 at 64 px, synthetic data,
    bf16 autocast, batch 256 per GPU, 7 loader workers, SGD with a cosine schedule, steps that
    cross 3 epoch boundaries. Targets: samples/s at least 0.97x the loop's (median of the
    rounds); no 10-step window that holds an epoch's first step below 0.9x the run's steady
    rate (the loader's workers are kept, and prefetch across the boundary).
(b) A loop of your own under ``Session`` (``s.wrap``, ``s.restore``, ``s.loader``, ``s.steps``,
    ``s.log`` every 10 steps) against the same loop without hpc-ddp (DistributedSampler, a
    DataLoader with pinned memory and persistent workers, ``loss.item()`` every 10 steps).
    Target: at least 0.99x.
(c) Launch to the end of the first step, from the parent's ``Popen`` to the rank's first step
    (synchronised), for the trainer and the hand loop. Target: at most the loop's + 1 s. The
    session's own start-up marks (``Session.startup``) say where the trainer's time went.
(d) The GPU checkpoint stall: ``Session.checkpoint()`` (the snapshot of model, optimizer and
    RNG into kept pinned host buffers; the write goes on in the background) against a
    synchronous ``torch.save`` of the same state into a file, fsync'd. Target: at most 0.2x.
(e) Exactness through the real command line, local backend: a ``train.deterministic`` run
    cancelled, resumed, and its rank SIGKILLed (the supervisor restarts it from the newest
    checkpoint), against its uninterrupted twin. Target: the same final step and weights
    digest.

With two or more GPUs (a) and (e) run at that many ranks. ``--diagnose`` adds, one round each,
trainer variants that each change one choice: cuDNN autotuning on, no stop agreement, no progress
logging, no pinned memory, and the hand loop without persistent workers (what the epoch
boundary costs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import Targets

TRAINER_TARGET = 0.97
SESSION_TARGET = 0.99
BOUNDARY_TARGET = 0.9
LAUNCH_EXTRA_S = 1.0
STALL_TARGET = 0.2
WINDOW = 10
"""Steps per rate window (the trainer's ``log_every``)."""


@dataclass(frozen=True)
class Shape:
    """One benchmark's model, data and step counts (per rank)."""

    model: str
    image_size: int
    batch: int
    workers: int
    steps_per_epoch: int
    total: int
    warmup: int
    amp: bool


GPU = Shape("resnet18", 64, 256, 7, 50, 160, 16, amp=True)
CPU = Shape("mlp", 16, 16, 1, 10, 40, 5, amp=False)
"""The CPU smoke run: the same machinery, a model small enough for 2 cores."""

TRAINER = ("hand", "trainer")
SESSION = ("plain", "session")
DIAGNOSE = (
    "trainer/autotune",
    "trainer/no-agree",
    "trainer/no-log",
    "trainer/no-pin",
    "hand/no-persistent",
)


# --- one rank ----------------------------------------------------------------------------------


def _train_config(shape: Shape, world: int, **changes: Any) -> Any:
    from hpc_ddp.config.model import TrainConfig

    return TrainConfig(
        model=shape.model,
        image_size=shape.image_size,
        batch_size=shape.batch,
        synthetic_samples=shape.batch * world * shape.steps_per_epoch,
        max_steps=shape.total,
        epochs=None,
        amp=shape.amp,
        num_workers=shape.workers,
        checkpoint_every=0,
        log_every=WINDOW,
        **changes,
    )


def _device() -> Any:
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def _sync_at(steps: set[int]) -> Any:
    """A step hook that waits for the GPU at ``steps`` (the measured span's ends), so a mark
    there is when the work was done, not when it was queued."""
    import torch

    def hook(step: int) -> None:
        if step in steps and torch.cuda.is_available():
            torch.cuda.synchronize()

    return hook


def _timed_session(run_dir: Path, cfg: Any, port: int, variant: str) -> Any:
    """A timed session whose marks after step 1 and at the measured span's ends wait for the
    GPU first, as the hand loop's do; ``first_wall``: when step 1 was done."""
    from benchmarks.timed_session import TimedSession
    from hpc_ddp.config.model import JobConfig

    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_PORT": str(port)}
    s = TimedSession(run_dir, JobConfig(name="bench", train=cfg), env)
    s.agree = "off" if variant.endswith("/no-agree") else "sync"
    total = cfg.max_steps
    sync = _sync_at({1, total // 10, total})
    base = s._mark

    def synced_mark() -> None:
        done = len(s.marks)  # steps done by now
        sync(done)
        if done == 1:
            s.first_wall = time.time()
        base()

    s._mark = synced_mark  # type: ignore[method-assign]
    return s


def run_variant(shape: Shape, variant: str, run_dir: Path, port: int, world: int) -> dict[str, Any]:
    """One run of ``variant`` on this rank: its step marks and when its first step ended."""
    spawned = float(os.environ["BENCH_T0"])
    device = _device()
    base = variant.split("/", maxsplit=1)[0]
    cfg = _train_config(shape, world)
    total = shape.total
    out: dict[str, Any] = {"variant": variant}
    if base in {"hand", "plain"}:
        from benchmarks.handwritten_ddp import train_handwritten

        first: list[float] = []
        sync = _sync_at({1, total // 10, total})

        def on_step(step: int) -> None:
            sync(step)
            if step == 1:
                first.append(time.time())

        marks = train_handwritten(
            cfg,
            rank=int(os.environ["RANK"]),
            world_size=world,
            init_method=f"tcp://127.0.0.1:{port}",
            total=total,
            device=device if device.type == "cuda" else None,
            on_step=on_step,
            persistent=variant != "hand/no-persistent",
            log_every=WINDOW if base == "plain" else 0,
        )
        out.update(marks=marks, first_step_s=first[0] - spawned)
        return out
    from hpc_ddp.train import loop

    loop.TunedKernels.enabled = variant == "trainer/autotune"
    if variant == "trainer/no-log":
        cfg = replace(cfg, log_every=10**9)
    s = _timed_session(run_dir, cfg, port, variant)
    with s:
        if base == "trainer":
            from hpc_ddp.train.trainer import run_training

            if variant == "trainer/no-pin":
                s.loader = _unpinned(s.loader)
            run_training(s.config, s)
        else:
            _own_loop(s, cfg, device)
    out.update(
        marks=s.marks,
        first_step_s=s.first_wall - spawned,
        startup=[["spawned", 0.0]] + [[name, t - spawned] for name, t in s.startup],
    )
    return out


def _unpinned(loader: Any) -> Any:
    def make(*a: Any, **kw: Any) -> Any:
        kw["pin_memory"] = False
        return loader(*a, **kw)

    return make


def _own_loop(s: Any, cfg: Any, device: Any) -> None:
    """(b): a user's loop under the session, written as the README shows."""
    import torch
    from torch import nn

    from hpc_ddp.train.data import build_dataset
    from hpc_ddp.train.models import build_model

    torch.manual_seed(cfg.seed)
    model = s.wrap(build_model(cfg))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    s.restore(model=model, optimizer=opt)
    data = build_dataset(cfg, train=True)
    batches = s.loader(data, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                       pin_memory=device.type == "cuda").forever()  # fmt: skip
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and cfg.amp)
    for step in s.steps(cfg.max_steps):
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if step % WINDOW == 0:
            s.log(step=step, loss=loss.item())


def checkpoint_stall(shape: Shape, run_dir: Path, port: int, rounds: int) -> dict[str, Any]:
    """(d) on this rank: seconds ``Session.checkpoint()`` blocks, and a synchronous save's."""
    import torch
    from torch import nn

    from benchmarks.timed_session import TimedSession
    from hpc_ddp.config.model import JobConfig
    from hpc_ddp.train.models import build_model

    device = _device()
    cfg = _train_config(shape, 1)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_PORT": str(port)}
    stalls, saves = [], []
    with TimedSession(run_dir, JobConfig(name="bench", train=cfg), env) as s:
        model = s.wrap(build_model(cfg))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        s.restore(model=model, optimizer=opt)
        x = torch.randn(shape.batch, 3, shape.image_size, shape.image_size, device=device)
        y = torch.zeros(shape.batch, dtype=torch.long, device=device)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        for step in s.steps(2 * rounds + 1):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
            if step == 1:
                continue
            sync()
            began = time.perf_counter()
            if step % 2 == 0:
                s.checkpoint()
                stalls.append(time.perf_counter() - began)
                s._ckpt().wait()  # the write, in the background, before the next round
            else:
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                with (run_dir / "sync.pt").open("wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                saves.append(time.perf_counter() - began)
    return {"stall_s": stalls, "sync_save_s": saves}


def worker(spec: dict[str, Any]) -> None:
    shape = Shape(**spec["shape"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if spec["kind"] == "stall":
        row = checkpoint_stall(shape, Path(spec["dir"]), int(spec["port"]), spec["rounds"])
    else:
        row = run_variant(shape, spec["variant"], Path(spec["dir"]), int(spec["port"]), world)
    if rank == 0:
        print(json.dumps(row), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip torch's slow interpreter teardown; everything is flushed


# --- parent ------------------------------------------------------------------------------------


def _run(spec: dict[str, Any], world: int, timeout_s: float) -> dict[str, Any]:
    from benchmarks.ranks import run_ranks
    from hpc_ddp.backends.local.plan import free_port

    spec = {**spec, "port": free_port()}
    argv = ["-m", "benchmarks.bench_gpu", "--worker", json.dumps(spec)]
    extra = {"BENCH_T0": repr(time.time()), "OMP_NUM_THREADS": "4"}
    results = run_ranks(argv, world, extra, timeout_s=timeout_s)
    for rank, (code, _, err) in enumerate(results):
        if code != 0:
            raise SystemExit(f"{spec.get('variant', spec['kind'])}: rank {rank} exited {code}:\n"
                             f"{err[-4000:]}")  # fmt: skip
    rows = [json.loads(line) for line in results[0][1].splitlines() if line.startswith("{")]
    last: dict[str, Any] = rows[-1]
    return last


def rates(marks: list[float], shape: Shape) -> dict[str, Any]:
    """Samples/s per rank over the measured span, and each window's rate against the steady
    rate (the median window) for the windows that hold an epoch's first step."""
    start, end = shape.total // 10, shape.total
    overall = (end - start) * shape.batch / (marks[end] - marks[start])
    windows = {
        w: WINDOW / (marks[w + WINDOW] - marks[w]) for w in range(start, end - WINDOW + 1, WINDOW)
    }
    steady = statistics.median(windows.values())
    firsts = range(shape.steps_per_epoch, end, shape.steps_per_epoch)  # marks index = step
    boundary = [windows[w] / steady for w in windows if any(w <= f < w + WINDOW for f in firsts)]
    return {"samples_per_s": overall, "boundary": boundary}


def compare(
    shape: Shape, variants: tuple[str, ...], rounds: int, world: int, work: Path, timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """Every variant ``rounds`` times, one of each per round, the order rotated each round."""
    out: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(rounds):
        shift = r % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            run_dir = work / f"{variant.replace('/', '-')}-{r}"
            spec = {"kind": "run", "variant": variant, "shape": asdict(shape), "dir": str(run_dir)}
            row = _run(spec, world, timeout)
            row.update(rates(row["marks"], shape))
            out[variant].append(row)
            print(f"  round {r} {variant:22} {row['samples_per_s'] * world:9.0f} samples/s, "
                  f"first step {row['first_step_s']:.2f} s", flush=True)  # fmt: skip
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


# --- (e) exactness through the command line ------------------------------------------------------


EXACT_JOB = """\
name: exact
slurm:
  gpus_per_node: {gpus}
  tasks_per_node: {tasks}
train:
  model: {model}
  image_size: 32
  batch_size: 64
  synthetic_samples: 6400
  max_steps: {total}
  epochs: null
  amp: {amp}
  deterministic: true
  checkpoint_every: 25
  log_every: 5
  num_workers: 2
"""


def _cli(*argv: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hpc_ddp", *argv], **kw)


def _submit(job: Path, runs: Path, name: str, log: Path) -> Path:
    """``hpc-ddp submit`` into ``runs/``; its run directory (found by its JSON line)."""
    with log.open("wb") as out:
        code = _cli("submit", str(job), "--backend", "local", "--runs-dir", str(runs), "--json",
                    f"name={name}", stdout=out, stderr=subprocess.STDOUT).wait(120)  # fmt: skip
    text = log.read_text(errors="replace")
    if code != 0:
        raise SystemExit(f"submit {name} failed ({code}):\n{text[-3000:]}")
    for line in text.splitlines():
        if line.startswith("{"):
            return Path(json.loads(line)["run_dir"])
    raise SystemExit(f"submit {name}: no JSON line:\n{text[-3000:]}")


def _last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line]
    return max(steps, default=0)


def _wait_step(run_dir: Path, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _last_step(run_dir) < step:
        if time.monotonic() > deadline:
            raise SystemExit(f"{run_dir}: step {step} not reached in {timeout_s:.0f} s")
        time.sleep(0.1)


def _rank_pid(run_dir: Path) -> int | None:
    """The pid of rank 0's training process of the run in ``run_dir`` (``hpc_ddp run RUN_DIR``
    with ``RANK=0``; its data-loader workers, forked from it, look the same but for a parent
    that matches too)."""
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"hpc_ddp" not in argv or str(run_dir).encode() not in argv or b"run" not in argv:
                continue
            if b"RANK=0" not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(entry.name)] = int(stat[1])
    roots = [pid for pid, parent in found.items() if parent not in found]
    return min(roots) if roots else None


def _final(run_dir: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "hpc_ddp", "checkpoints", str(run_dir), "--json"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = json.loads(out)
    rows = rows.get("checkpoints", rows) if isinstance(rows, dict) else rows
    last = rows[-1]
    return int(last["step"]), str(last.get("weights_digest"))


def exactness(work: Path, gpus: int, total: int, amp: bool) -> dict[str, Any]:
    """(e): the twin and the interrupted run side by side; their final (step, digest)."""
    work.mkdir(parents=True, exist_ok=True)
    job = work / "exact.yaml"
    model = "resnet18" if gpus else "mlp"  # the CPU smoke: the machinery, not the model
    job.write_text(EXACT_JOB.format(gpus=gpus or "null", tasks=1, total=total, model=model,
                                    amp=str(amp).lower()))  # fmt: skip
    runs = work / "runs"
    twin = _submit(job, runs, "twin", work / "twin.log")
    cut = _submit(job, runs, "cut", work / "cut.log")
    _wait_step(cut, total // 4, 300)
    subprocess.run([sys.executable, "-m", "hpc_ddp", "cancel", str(cut)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    stopped = _last_step(cut)
    time.sleep(1)
    with (work / "resume.log").open("wb") as out:
        resume = _cli("resume", str(cut), "--wait", stdout=out, stderr=subprocess.STDOUT)
        target = max(stopped, total // 4) + total // 3
        if target >= total:  # the kill must land before the end: say so, not wait 300 s
            resume.wait(600)
            raise SystemExit(f"the cancel landed at step {stopped} of {total}: no room to kill")
        _wait_step(cut, target, 300)
        pid = _rank_pid(cut)
        if pid is None:
            raise SystemExit(f"{cut}: no rank 0 process to kill")
        killed_at = _last_step(cut)
        os.kill(pid, signal.SIGKILL)
        code = resume.wait(600)
    if code != 0:
        log = (work / "resume.log").read_text(errors="replace")
        raise SystemExit(f"resume --wait exited {code}:\n{log[-3000:]}")
    deadline = time.monotonic() + 600
    while _last_step(twin) < total or not (twin / "checkpoints").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the twin did not finish")
        time.sleep(0.5)
    time.sleep(2)
    return {"twin": _final(twin), "cut": _final(cut), "cancelled_at": stopped,
            "killed_at": killed_at}  # fmt: skip


# --- report ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant")
    parser.add_argument("--diagnose", action="store_true", help="add the diagnostic variants")
    parser.add_argument("--skip-exact", action="store_true", help="leave (e) out")
    parser.add_argument("--only-a", action="store_true", help="(a) alone (a quick re-check)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    shape = GPU if gpus else CPU
    world = max(1, gpus)
    if gpus:
        name = torch.cuda.get_device_name(0)
        print(f"{gpus} x {name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    else:
        print("no CUDA GPU: only the CPU checks ran (a tiny model; no GPU targets)", flush=True)
    began = time.perf_counter()
    targets = Targets()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-", dir=args.dir) as tmp:
        work = Path(tmp)
        # The runs' save times and lemons stay the benchmark's: a developer's own history
        # (~/.local/state/hpc-ddp) would otherwise size their next real run's auto interval.
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        timeout = 300.0
        print(f"(a) trainer vs hand loop, {world} rank(s): {shape}", flush=True)
        a = compare(shape, TRAINER, args.rounds, world, work / "a", timeout)
        if args.diagnose:  # one round each: what each choice is worth, not a target
            print("(a) diagnostic variants, one round each", flush=True)
            a.update(compare(shape, DIAGNOSE, 1, world, work / "a-diagnose", timeout))
        if args.only_a:
            report_a(shape, world, a, targets if gpus else None)
            return targets.exit_code() if gpus else 0
        print("(b) own loop under Session vs the same loop without it", flush=True)
        b = compare(shape, SESSION, args.rounds, world, work / "b", timeout)
        print("(d) checkpoint stall", flush=True)
        spec = {"kind": "stall", "shape": asdict(shape), "dir": str(work / "d"), "rounds": 5}
        d = _run(spec, 1, timeout)
        e = None
        if not args.skip_exact:
            print("(e) exactness: cancel, resume, SIGKILL vs an uninterrupted twin", flush=True)
            try:
                # A CPU's mlp steps take ~1 ms: a cancel (~1 s) needs a longer run to land in.
                e = exactness(work / "e", gpus, 800 if gpus else 3000, amp=bool(gpus))
            except (SystemExit, Exception) as exc:  # the rest of the report still counts
                print(f"(e) failed: {exc}", flush=True)
                e = {"error": str(exc)}
        report(shape, world, a, b, d, e, targets if gpus else None)
    print(f"benchmark wall time {time.perf_counter() - began:.0f} s")
    if not gpus:
        print("no CUDA GPU: only the CPU checks ran")
        return 0
    return targets.exit_code()


def report_a(
    shape: Shape, world: int, a: dict[str, list[dict[str, Any]]], targets: Targets | None
) -> None:
    """(a) alone: samples/s, the epoch-start window and launch to first step."""
    for variant, runs in a.items():
        ratio = _median(runs, "samples_per_s") / _median(a["hand"], "samples_per_s")
        dips = [x for r in runs for x in r["boundary"]]
        print(f"{variant:22} {_median(runs, 'samples_per_s') * world:8.0f} samples/s "
              f"{ratio:.3f}x, epoch-start window {min(dips):.2f}, first step "
              f"{_median(runs, 'first_step_s'):.2f} s")  # fmt: skip
    if targets is None:
        return
    trainer, hand = a["trainer"], a["hand"]
    ratio = _median(trainer, "samples_per_s") / _median(hand, "samples_per_s")
    targets.check("trainer / hand loop samples per s", ratio, ">=", TRAINER_TARGET)
    extra = _median(trainer, "first_step_s") - _median(hand, "first_step_s")
    targets.check("trainer launch to first step minus the hand loop's", extra, "<=",
                  LAUNCH_EXTRA_S, unit=" s")  # fmt: skip


def report(
    shape: Shape,
    world: int,
    a: dict[str, list[dict[str, Any]]],
    b: dict[str, list[dict[str, Any]]],
    d: dict[str, Any],
    e: dict[str, Any] | None,
    targets: Targets | None,
) -> None:
    from tabulate import tabulate

    rows = []
    for group, ref in ((a, "hand"), (b, "plain")):
        base = _median(group[ref], "samples_per_s")
        for variant, runs in group.items():
            rate = _median(runs, "samples_per_s")
            dips = [x for r in runs for x in r["boundary"]]
            rows.append([variant, f"{rate * world:.0f}", f"{rate / base:.3f}",
                         f"{min(dips):.2f}" if dips else "-",
                         f"{_median(runs, 'first_step_s'):.2f}"])  # fmt: skip
    print(tabulate(rows, headers=["variant", "samples/s", "vs its loop", "epoch-start window",
                                  "launch->first step s"]))  # fmt: skip
    trainer = a["trainer"]
    marks = trainer[0].get("startup", [])
    phases = ", ".join(f"{n} {t1 - t0:.2f} s" for (_, t0), (n, t1) in itertools.pairwise(marks))
    print(f"trainer start-up (first round, from Popen): {phases}")
    stall, save = statistics.median(d["stall_s"]), statistics.median(d["sync_save_s"])
    print(f"(d) checkpoint stall {stall * 1000:.1f} ms vs synchronous torch.save+fsync "
          f"{save * 1000:.1f} ms (medians of {len(d['stall_s'])})")  # fmt: skip
    if e is not None and "error" not in e:
        print(f"(e) twin {e['twin']}, cancelled at {e['cancelled_at']}, killed at "
              f"{e['killed_at']}: {e['cut']}")  # fmt: skip
    if targets is None:
        return
    hand, plain = _median(a["hand"], "samples_per_s"), _median(b["plain"], "samples_per_s")
    targets.check("trainer / hand loop samples per s", _median(trainer, "samples_per_s") / hand,
                  ">=", TRAINER_TARGET)  # fmt: skip
    targets.check("Session loop / plain loop samples per s",
                  _median(b["session"], "samples_per_s") / plain, ">=", SESSION_TARGET)  # fmt: skip
    dips = [x for v in ("trainer",) for r in a[v] for x in r["boundary"]]
    dips += [x for r in b["session"] for x in r["boundary"]]
    targets.check("lowest epoch-start window / steady rate", min(dips), ">=", BOUNDARY_TARGET)
    extra = _median(trainer, "first_step_s") - _median(a["hand"], "first_step_s")
    targets.check("trainer launch to first step minus the hand loop's", extra, "<=",
                  LAUNCH_EXTRA_S, unit=" s")  # fmt: skip
    targets.check("checkpoint stall / synchronous save", stall / save, "<=", STALL_TARGET)
    if e is not None and "error" in e:
        targets.check("interrupted run equals its twin (step, digest)", 0.0, "==", 1.0)
    elif e is not None:
        same = float(e["twin"] == e["cut"])
        targets.check("interrupted run equals its twin (step, digest)", same, "==", 1.0)
        total = e["twin"][0]
        targets.check("the rank was killed before the run's end (step)", e["killed_at"], "<",
                      total, fmt="d")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
