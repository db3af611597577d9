"""``hpc-ddp init [--byo] [DIR]``: write a commented job file (with ``--byo`` also a ``train.py``
that uses the Session) into DIR, ready for ``hpc-ddp submit job.yaml --backend local``.

Nothing is overwritten: when one of the files exists, none is written (exit 2). A DIR that is a
file, lies under a file, or cannot be written is refused the same way, and a file written before
a later one failed is taken back. The templates are plain text here, so the verb imports neither
torch nor the config loader.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import unicodedata
from pathlib import Path

from hpc_ddp.errors import ConfigError

JOB_FILE = "job.yaml"
SCRIPT_FILE = "train.py"

BUILTIN_JOB = """\
# A job for the built-in trainer: a small MLP on synthetic data, two ranks on CPU.
#   hpc-ddp submit job.yaml --backend local --wait     # on this machine, no Slurm
#   hpc-ddp submit job.yaml                            # on a Slurm cluster
#   hpc-ddp submit job.yaml train.lr=0.1 train.epochs=3   # any key, from the command line
# Every key: docs/config-reference.md.
name: "{name}"
slurm:
  nodes: 1
  tasks_per_node: 2        # DDP ranks per node (one per GPU on a GPU node)
  cpus_per_task: 1
  time: "00:10:00"         # the time limit; a warning signal comes requeue.lead_time before it
  # gpus_per_task: 1
  # partition: gpu
train:
  model: mlp               # a torchvision name (resnet18) or your own pkg.mod:fn
  dataset: synthetic       # cifar10 | mnist | imagefolder (with data_root) | pkg.mod:fn
  synthetic_samples: 1024
  batch_size: 32           # per rank
  epochs: 1
  lr: 0.05
  checkpoint_every: 20     # optimizer steps between checkpoints
  keep_last: 2             # newest checkpoints kept on disk
  eval_every: 10           # logs val_loss and val_acc
  keep_best: {{metric: val_loss, mode: min}}   # the best checkpoint, kept beside keep_last
requeue:
  max_requeues: 3          # preempted or at its time limit, the job comes back this often
"""

BYO_JOB = """\
# Your own script (train.py beside this file) run on every rank. Submit from this directory:
#   hpc-ddp submit job.yaml --backend local --wait     # on this machine, no Slurm
#   hpc-ddp submit job.yaml                            # on a Slurm cluster
#   hpc-ddp submit job.yaml params.steps=1000          # any params.NAME, from the command line
#   hpc-ddp sweep job.yaml params.lr=0.1,0.01 --backend local   # a sweep of it
# Every key: docs/config-reference.md.
name: "{name}"
# `python` is the interpreter hpc-ddp runs under; {{params.NAME}} is substituted on each task.
command: [python, train.py, --steps, "{{params.steps}}", --lr, "{{params.lr}}"]
params:
  steps: 200
  lr: 0.01
slurm:
  nodes: 1
  tasks_per_node: 2        # DDP ranks per node (one per GPU on a GPU node)
  cpus_per_task: 1
  time: "00:10:00"         # the time limit; a warning signal comes requeue.lead_time before it
  # gpus_per_task: 1
  # partition: gpu
env:
  vars: {{OMP_NUM_THREADS: "1"}}
train:
  keep_last: 2             # newest checkpoints kept on disk (the session saves them)
  keep_best: {{metric: val_loss, mode: min}}   # ranked by the rows s.log() writes
requeue:
  max_requeues: 3          # preempted or at its time limit, the job comes back this often
"""

BYO_SCRIPT = '''\
"""Your training script, with an hpc-ddp session: it stops, saves and resumes exactly on its
own (preemption, time limits, Ctrl-C). Runs as it is with `python train.py`, under
`torchrun --nproc-per-node 2 train.py`, and through `hpc-ddp submit job.yaml`."""

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hpc_ddp


def build_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x.sum(dim=1) > 0).long())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    loss_fn = nn.functional.cross_entropy
    with hpc_ddp.session() as s:  # process group, device, stop signals
        model = s.wrap(build_model())  # DDP on the right device
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        s.restore(model=model, optimizer=opt)  # newest good checkpoint, RNG, data position
        batches = s.loader(make_data(1024, seed=0), batch_size=32).forever()
        val_set = make_data(256, seed=1)
        for step in s.steps(total=args.steps, checkpoint_every=50):  # stops, saves, requeues
            x, y = (t.to(s.device) for t in next(batches))
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.log(step=step, loss=loss.item())  # RUN_DIR/metrics.jsonl; progress lines
            if step % 50 == 0 or step == args.steps:
                val = s.eval_loader(val_set, batch_size=128)  # every sample once, all ranks
                with torch.no_grad(), s.section("eval"):
                    for x, y in val:
                        out = model(x.to(s.device))
                        val.add(loss=loss_fn(out, y.to(s.device), reduction="sum"), count=len(y))
                totals = val.reduce()
                s.log(step=step, val_loss=float(totals["loss"] / totals["count"]))
    # Leaving the block after the last step saves it unless it is saved already.


if __name__ == "__main__":
    main()
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "directory",
        nargs="?",
        default=".",
        metavar="DIR",
        help="where to write the files (default: the current directory; made if missing)",
    )
    parser.add_argument(
        "--byo",
        action="store_true",
        help=f"also write {SCRIPT_FILE}, your own script with an hpc-ddp session, and a "
        f"{JOB_FILE} that runs it",
    )


def files(name: str, byo: bool) -> dict[str, str]:
    """File name -> text that ``init`` writes for a job called ``name``."""
    if byo:
        return {JOB_FILE: BYO_JOB.format(name=name), SCRIPT_FILE: BYO_SCRIPT}
    return {JOB_FILE: BUILTIN_JOB.format(name=name)}


MAX_JOB_NAME = 128
"""The longest job name ``submit`` takes (``hpc_ddp.config.values.MAX_NAME_CHARS``, not imported:
this verb loads no config module)."""


def job_name(directory: Path) -> str:
    """A job name from the directory's name that ``submit`` takes: ASCII letters and digits,
    ``-`` and ``_`` (an accented letter loses its accent, any other character becomes ``-``),
    starting with a letter or digit, at most :data:`MAX_JOB_NAME` characters."""
    raw = unicodedata.normalize("NFKD", directory.resolve().name)
    plain = "".join(c for c in raw if not unicodedata.combining(c))
    name = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in plain)
    while "--" in name:
        name = name.replace("--", "-")
    name = name.strip("-_")[:MAX_JOB_NAME].rstrip("-_")
    return name or "my-job"


def _refuse_unusable(directory: Path) -> None:
    """A DIR that is a file, or lies under one, refused before anything is made."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(
            f"{directory} is a file, not a directory: nothing was written. HINT: name a new "
            "or existing directory (hpc-ddp init DIR); init makes a missing one"
        )
    for parent in directory.parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise ConfigError(
                    f"{directory} cannot be made: {parent} is a file, not a directory; nothing "
                    "was written. HINT: name a directory that is not under a file "
                    "(hpc-ddp init DIR)"
                )
            return


def _write_error(path: Path, exc: OSError) -> ConfigError:
    """The error for ``path`` (DIR or a file in it) that could not be made or written."""
    why = {
        errno.EROFS: "it is on a read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted: is it immutable?",
        errno.ENOSPC: "no space is left on its file system",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.ENOTDIR: "a part of the path is a file, not a directory",
        errno.EEXIST: "a file of that name appeared meanwhile",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    where = exc.filename if exc.filename is not None else path
    return ConfigError(
        f"{where}: cannot be written ({why}): nothing was written. HINT: init into a "
        "directory you can write (hpc-ddp init DIR), or make this one writable"
    )


def run(args: argparse.Namespace) -> int:
    """Write the files, none of them when any exists already or one cannot be written."""
    directory = Path(args.directory)
    _refuse_unusable(directory)
    todo = files(job_name(directory), args.byo)
    there = [name for name in todo if os.path.lexists(directory / name)]
    if there:
        raise ConfigError(
            f"{', '.join(str(directory / n) for n in there)} "
            f"{'exists' if len(there) == 1 else 'exist'} already: nothing was "
            "written. HINT: init into a new directory (hpc-ddp init DIR), or move the file away"
        )
    written: list[Path] = []
    current = directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in todo.items():
            current = directory / name
            with open(current, "x", encoding="utf-8") as f:  # "x": never overwrite
                written.append(current)
                f.write(text)
    except OSError as exc:
        for path in written:  # all or nothing, as when a file exists already
            with contextlib.suppress(OSError):
                path.unlink()
        raise _write_error(current, exc) from None
    for path in written:
        print(f"wrote {path}")
    where = "" if directory == Path(".") else f"cd {directory} && "
    print(f"next: {where}hpc-ddp submit {JOB_FILE} --backend local --wait")
    return 0
