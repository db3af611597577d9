"""What a checkpoint file says it is, read without torch: a regular file or not, and the step,
run and config its payload names.

Both sides judge checkpoint files: the node (resume) with torch, the login side (``status``,
``resume``'s plan) without it. What they must agree on lives here, once:

* :func:`not_regular`: a FIFO, socket, directory or device named ``step-*.pt`` is never
  opened (``open()`` on a FIFO blocks until a writer comes, which is never); decided with
  ``stat``, which opens nothing.
* :func:`read_label`: the step (``progress.step``), run id and config digest a checkpoint's
  pickle records, read with an unpickler that runs no code and builds no tensor (every class
  the pickle names becomes an inert placeholder), so ``status`` can tell a file named
  ``step-00009999.pt`` that holds step 100, or one copied from another run, without torch;
  :func:`label_problem` says so, in the words the node's full check uses (:func:`misnamed`,
  :func:`stranger`).
* :func:`config_digest`: the digest of the config keys that shape the training state (the
  model, data, optimizer and seed; not where or how long it runs), recorded in each checkpoint
  so that a resume can say when the config changed under it.

Any exception from a damaged file (a bad zip directory, a cut pickle, absurd sizes, bad
strings) is a :class:`LabelError` with a one-line reason, never a crash.
"""

from __future__ import annotations

import os
import pickle
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from hpc_ddp.rundir.layout import parse_checkpoint_name

__all__ = [
    "Label",
    "LabelError",
    "config_digest",
    "label_problem",
    "misnamed",
    "not_regular",
    "read_label",
    "stranger",
]

_PICKLE = "/data.pkl"
"""The record every ``torch.save`` archive holds: the pickle (``<archive>/data.pkl``)."""

_NOT_SHAPING = frozenset(
    {
        "train.max_steps", "train.epochs", "train.checkpoint_every", "train.keep_last",
        "train.keep_best", "train.keep_best.metric", "train.keep_best.mode", "train.eval_every",
        "train.log_every", "train.tensorboard", "train.num_workers", "train.data_root",
    }
)  # fmt: skip
"""Keys of ``train`` that say how long, how often or from where, not what is trained: a run
extended with ``train.max_steps=160`` goes on with the same state."""
_SHAPING_SECTIONS = ("train", "params", "command", "entrypoint")
"""The parts of a job config that make its checkpoints what they are (slurm, env, dist,
requeue and fault say where and how it runs)."""


class LabelError(Exception):
    """Why a checkpoint file's label cannot be read (the message is the reason)."""


@dataclass(frozen=True)
class Label:
    """What a checkpoint records about itself."""

    step: int
    """``progress.step``: what its name (``step-<step>.pt``) must say."""
    run_id: str | None
    """The run that wrote it (None: written before hpc-ddp recorded one)."""
    config_digest: str | None
    """:func:`config_digest` of the config it was written with (None: not recorded)."""


def not_regular(path: Path) -> str | None:
    """Why ``path`` is not a regular file (or a symlink to one), without opening it; None when
    it is one. A FIFO would block ``open()`` for ever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"dangling symlink to {os.readlink(path)}"
        return "missing"
    except OSError as exc:
        return f"unreadable ({type(exc).__name__}: {exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(mode)), "of an unknown kind")
    return f"not a regular file ({kind})"


def misnamed(named: int, step: int) -> str | None:
    """Why a file named ``step-<named>.pt`` that holds ``step`` is damaged; None if they agree.
    A copy under a newer step's name would be taken for that step, skipping the newer files
    (and ``keep_last`` would prune them)."""
    if named == step:
        return None
    return f"named step {named} but holds step {step} (copied or renamed)"


def stranger(theirs: str | None, mine: str | None) -> str | None:
    """Why a file written by run ``theirs`` is not run ``mine``'s; None when it may be (either
    is unknown: a file from before run ids were recorded is accepted, its run unknown)."""
    if theirs is None or mine is None or theirs == mine:
        return None
    return f"written by run {theirs}, not by this run ({mine})"


def label_problem(path: Path, run_id: str | None = None) -> str | None:
    """Why ``path`` is not run ``run_id``'s checkpoint of the step its name says, judged by its
    label alone (not a regular file, no readable label, misnamed, another run's); None when it
    may be (its content is checked when it is loaded)."""
    kind = not_regular(path)
    if kind is not None:
        return kind
    try:
        label = read_label(path)
    except LabelError as exc:
        return f"unreadable checkpoint ({exc})"
    named = parse_checkpoint_name(path.name)
    wrong = None if named is None else misnamed(named, label.step)
    return wrong or stranger(label.run_id, run_id)


def shaping_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The dotted keys of a job config (as a plain dict) that shape the training state."""
    flat: dict[str, Any] = {}
    for section in _SHAPING_SECTIONS:
        _flatten(config.get(section), section, flat)
    return {k: v for k, v in flat.items() if k not in _NOT_SHAPING}


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            _flatten(inner, f"{prefix}.{key}", out)
    else:
        out[prefix] = value


def config_digest(config: Mapping[str, Any]) -> str:
    """xxh3-128 of :func:`shaping_config` (keys sorted; values by their repr, which tells
    ``1`` from ``1.0`` and ``"1"``)."""
    h = xxhash.xxh3_128()
    for key, value in sorted(shaping_config(config).items()):
        h.update(f"{key}={value!r}\n".encode())
    return h.hexdigest()


def read_label(path: Path) -> Label:
    """The label of the checkpoint at ``path``; :class:`LabelError` when it has none that can
    be read (call :func:`not_regular` first: this opens the file)."""
    try:
        data = _load_pickle(path)
    except LabelError:
        raise
    except Exception as exc:  # whatever a damaged archive or pickle makes zipfile/pickle raise
        raise LabelError(_one_line(exc)) from None
    progress = data.get("progress")
    meta = data.get("meta")
    if not isinstance(progress, dict) or not isinstance(meta, dict):
        raise LabelError("no progress or meta: not an hpc-ddp checkpoint")
    step = progress.get("step")
    if type(step) is not int or step < 0:
        raise LabelError(f"progress.step is {str(step)[:40]!r}, not a step")
    run_id, digest = meta.get("run_id"), meta.get("config_digest")
    return Label(
        step,
        run_id if isinstance(run_id, str) else None,
        digest if isinstance(digest, str) else None,
    )


def _load_pickle(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as archive:
        record = next((r for r in archive.infolist() if r.filename.endswith(_PICKLE)), None)
        if record is None:
            raise LabelError("not a torch archive: no data.pkl record")
        # hpc-ddp writes no CRC-32s (torch never checks them; the digests cover the content).
        record.CRC = None  # type: ignore[assignment]
        with archive.open(record) as f:
            data = _InertUnpickler(f).load()
    if not isinstance(data, dict):
        raise LabelError(f"holds a {type(data).__name__}, not an hpc-ddp checkpoint")
    return data


class _Inert(dict):  # type: ignore[type-arg]
    """What every class and function a pickle names becomes: it takes any arguments and any
    state and does nothing (a dict, so that an ``OrderedDict``'s items can be set on it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _InertUnpickler(pickle.Unpickler):
    """Reads a pickle's plain values (dicts, lists, numbers, strings) and nothing else: no
    import, no call of anything the file names; tensors' storages are not read."""

    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return _Inert()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
