"""The checkpoint file: its format, building a payload, and reading and checking one.

Layout of ``RUN_DIR/checkpoints/`` (names in :mod:`hpc_ddp.rundir.layout`): ``step-00000120.pt`` per
save, plus a ``latest`` text file naming the newest one. ``latest`` is a hint for people and
tools; loading scans the ``step-*.pt`` files newest first and takes the first that loads, so a
stale, missing or dangling pointer never matters. Temporary files (``.tmp-*``) of a writer that
was killed mid-save never match ``step-*.pt`` and are never read (the listing, without torch:
:mod:`hpc_ddp.rundir.checkpoints`; the writing: :mod:`hpc_ddp.checkpoint.writer`).

Format version 2 is a plain dict that ``torch.load(..., weights_only=True)`` accepts::

    format: "hpc-ddp-checkpoint"   version: 2
    model:      state dict of the unwrapped module (no ``module.`` prefix)
    optimizer, scheduler, scaler: their state dicts, or None
    objects:    {name: state dict} of any more objects ``Session.restore`` was given by name
                (an EMA model, a second optimizer); absent when there are none
    progress:   {step, epoch, batch_in_epoch, samples_in_epoch}   (see
                :class:`~hpc_ddp.runtime.progress.Progress`; ``samples_in_epoch`` since the
                elastic resume, absent before)
    extra:      the user's own small values
    rng:        one entry per global rank (python, numpy, torch CPU, CUDA states)
    config:     the resolved job config as a plain dict, or None
    meta:       {time, world_size, grad_accum (since the elastic resume), torch_version,
                 hpc_ddp_version, run_id, config_digest (both since checkpoint identity),
                 digest: "xxh3-128",
                 digests: {model, optimizer, scheduler, scaler, progress, extra, rng, config,
                           objects.NAME (one per named object), meta: hex digest}}

``meta.digests`` holds one digest for each section above and one for ``meta`` itself (less the
digests): everything a resume restores is covered, so a changed byte in the optimizer state, an
RNG state or the data position is caught as surely as one in the weights, and the error names the
section. Each is a :func:`~hpc_ddp.checkpoint.digest.canonical_digest` (xxh3-128, independent
of devices and memory layout: :mod:`hpc_ddp.checkpoint.digest`), so the ``model`` digest of a
checkpoint equals :func:`~hpc_ddp.checkpoint.digest.weights_digest` of the live model it was
saved from.

Format version 1 (hpc-ddp before the digests of everything) has ``meta.weights_digest``, a
sha256 of the model tensors, and nothing else digested. Such files still load, so that a run
survives an upgrade of hpc-ddp between two of its attempts; only their weights are verified,
and resume and ``hpc-ddp checkpoints`` say so (:data:`V1_UNVERIFIED`).

What bit-identical resume needs, and why it is all here: weights, optimizer and scheduler state
fix the arithmetic; ``progress`` fixes the data position (the sampler's permutation is a pure
function of seed and epoch, so ``epoch`` and ``samples_in_epoch`` place it exactly at any world
size, see :mod:`hpc_ddp.runtime.sampler`); per-rank RNG states fix everything random inside a
step (dropout, user code), which differs per rank because each rank seeds its training stream
with its rank. ``meta.world_size`` and ``meta.grad_accum`` say how a step was made, which an
elastic resume at another world size rescales (:mod:`hpc_ddp.config.elastic`). DataLoader
workers get seeds derived from (seed, epoch, rank), not from the global RNG.

A file counts as a checkpoint only if it passes every check of :func:`load_checkpoint`: a
regular torch zip file, loadable with ``weights_only=True`` (always to the CPU: the caller's
``load_state_dict`` places each tensor where its parameter lives), holding this format, whose
sections still hash to their recorded digests, and whose name says the step it holds. Anything
else is ``damaged`` (ours but unreadable, torn, malformed, misnamed, or changed on disk; any
exception reading it raises makes it so, never a crash) or ``foreign`` (readable, but not
written by a format version this code reads); resume skips both and takes the next older file.

Identity: ``meta.run_id`` is the run that wrote the file (``RUN_DIR/run_id``), and
``meta.config_digest`` the digest of the config keys that shape its state
(:func:`~hpc_ddp.rundir.checkpoint_label.config_digest`). A file of another run is a
``stranger``: resume and ``hpc-ddp checkpoints --verify`` refuse it, naming both runs, and
resume takes the next older file. A file without a run id (written by an hpc-ddp before the
identity was recorded) is of unknown identity and still loads, as format 1 does: refusing it
would strand every run across the upgrade, and its digests still prove it whole. The resume
log says when the config that shapes the state changed since the file was written (an elastic
resume's accumulation, a forced resume's overrides).

Writing a payload (:mod:`hpc_ddp.checkpoint.snapshot`, then
:mod:`hpc_ddp.checkpoint.writer`): on the training thread only a copy of the state into host
buffers; the digests and a durable write on a background thread. The collective side (which
rank reads, writes and tells the others) is :mod:`hpc_ddp.checkpoint.checkpointer`.
"""

from __future__ import annotations

import enum
import logging
import random
import re
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None  # type: ignore[assignment]

from hpc_ddp.checkpoint.digest import DIGEST_ALGORITHM, canonical_digest, sha256_weights
from hpc_ddp.checkpoint.snapshot import snapshot
from hpc_ddp.config.model import KeepBestConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.checkpoint_label import config_digest, misnamed, not_regular, stranger
from hpc_ddp.rundir.checkpoints import checkpoint_files
from hpc_ddp.rundir.layout import parse_checkpoint_name
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.version import __version__

log = logging.getLogger(__name__)

FORMAT = "hpc-ddp-checkpoint"
FORMAT_VERSION = 2
"""The version this code writes; it reads this one and version 1."""
SECTIONS = ("model", "optimizer", "scheduler", "scaler", "progress", "extra", "rng", "config")
"""The parts of a payload that a resume restores, each with its own digest (and ``meta``)."""
V1_UNVERIFIED = ("optimizer", "scheduler", "scaler", "progress", "extra", "rng", "config")
"""What a format-1 file restores without a digest to check it against (only ``model`` has one)."""
OBJECTS = "objects"
"""The optional section of named objects; each has its own digest, ``objects.NAME``."""
_READABLE = (1, FORMAT_VERSION)
_REQUIRED = ("model", "progress", "rng", "meta")
_DIGEST_HEX = 32

_WHAT = {
    "model": "weights (model)",
    "optimizer": "optimizer state",
    "scheduler": "scheduler state",
    "scaler": "grad scaler state",
    "progress": "progress (step, epoch, batch)",
    "extra": "extra values",
    "rng": "RNG states",
    "config": "config",
    "meta": "meta (world size, time, versions)",
}
"""How a reason names each section."""


def _what(section: str) -> str:
    """How a reason names a section or a named object."""
    if section.startswith(f"{OBJECTS}."):
        return f"state of {section.removeprefix(OBJECTS + '.')!r}"
    return _WHAT[section]


class CheckpointState(str, enum.Enum):
    """What one ``step-*.pt`` file is, as resume and ``hpc-ddp checkpoints`` judge it."""

    OK = "ok"
    DAMAGED = "damaged"
    """Meant to be ours but unusable: unreadable, torn, empty, malformed, changed on disk."""
    FOREIGN = "foreign"
    """Readable, but not an hpc-ddp checkpoint of a format version this code reads."""
    STRANGER = "stranger"
    """A whole hpc-ddp checkpoint, but of another run (its ``meta.run_id`` says which)."""


_HINTS = {
    CheckpointState.DAMAGED: "resume skips it and takes the newest older checkpoint that "
    "loads; move the file aside to keep it for inspection.",
    CheckpointState.FOREIGN: "keep only checkpoints written by this hpc-ddp (format versions "
    f"{', '.join(map(str, _READABLE))}) in checkpoints/; move or rename this file.",
    CheckpointState.STRANGER: "resume never loads another run's state: it takes the newest "
    "older checkpoint of this run; move the file back to its own run directory (or, if this "
    "run's run_id file was deleted and made anew, write the id the file names back into it).",
}


class Rejected(Exception):
    """Why a file is not a usable checkpoint (never leaves the checkpoint modules: callers get a
    :class:`CheckpointError` or a :class:`~hpc_ddp.checkpoint.format.CheckpointInfo` with the
    reason)."""

    def __init__(self, state: CheckpointState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


# --- the digest of each section --------------------------------------------------------------


def state_digests(payload: Mapping[str, Any]) -> dict[str, str]:
    """One digest per section of a format-2 payload, one per named object
    (``objects.NAME``), and one of ``meta`` less its digests."""
    out = {key: canonical_digest(payload.get(key)) for key in SECTIONS}
    for name, state in _named(payload).items():
        out[f"{OBJECTS}.{name}"] = canonical_digest(state)
    meta = payload.get("meta")
    if isinstance(meta, Mapping):
        out["meta"] = canonical_digest({k: v for k, v in meta.items() if k != "digests"})
    return out


def _named(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The payload's named objects (none in a file written without any)."""
    objects = payload.get(OBJECTS)
    return objects if isinstance(objects, Mapping) else {}


# --- the payload and its structure ------------------------------------------------------------


def build_payload(
    *,
    model: Mapping[str, Any],
    progress: Progress,
    rng: list[dict[str, Any]],
    optimizer: Mapping[str, Any] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    scaler: Mapping[str, Any] | None = None,
    objects: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    grad_accum: int | None = None,
    run_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The checkpoint dict (format version 2); ``rng`` has one entry per global rank,
    ``grad_accum`` the micro-batches each accumulated per step (None: not known), ``run_id``
    the run it belongs to (its ``config_digest`` is taken from ``config``).

    Tensors are taken as they are: pass snapshots. The digests are filled in by
    :func:`write_checkpoint`, off the training thread. ``objects``: the named objects' state
    dicts (None or empty: no ``objects`` section).
    """
    named = {OBJECTS: dict(objects)} if objects else {}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": dict(model),
        "optimizer": None if optimizer is None else dict(optimizer),
        "scheduler": None if scheduler is None else dict(scheduler),
        "scaler": None if scaler is None else dict(scaler),
        **named,
        "progress": progress.to_dict(),
        "extra": snapshot(dict(progress.extra), "progress.extra"),
        "rng": rng,
        "config": None if config is None else snapshot(dict(config), "config"),
        "meta": {
            "time": time.time() if now is None else now,
            "world_size": len(rng),
            **({} if grad_accum is None else {"grad_accum": grad_accum}),
            "run_id": run_id,
            "config_digest": None if config is None else config_digest(config),
            "torch_version": str(torch.__version__),
            "hpc_ddp_version": __version__,
            "digest": DIGEST_ALGORITHM,
            "digests": None,
        },
    }


def recorded_weights_digest(data: Mapping[str, Any]) -> str:
    """The weights digest a checked payload records (format 2: its ``model`` digest; format 1:
    its sha256 ``weights_digest``, comparable only with other format-1 files)."""
    meta = data["meta"]
    return str(meta["digests"]["model"] if data["version"] >= 2 else meta["weights_digest"])


def unverified_sections(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The sections of a checked payload that no digest covers (format 1: all but the
    weights; format 2: none)."""
    return V1_UNVERIFIED if data["version"] == 1 else ()


def check_payload(obj: Any, source: str) -> dict[str, Any]:
    """``obj`` if it is a checkpoint this version can read, else a :class:`CheckpointError`."""
    try:
        return check_structure(obj)
    except Rejected as r:
        raise rejection_error(source, r) from None


def check_structure(obj: Any) -> dict[str, Any]:
    """``obj`` if it has the layout of a readable format version, with every value
    :meth:`Session.restore` reads of the right type, else :class:`Rejected` saying which and
    why."""
    data = _check_marker(obj)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise Rejected(CheckpointState.DAMAGED, f"checkpoint lacks {', '.join(missing)}")
    for where, value, ok, expected in _value_checks(data):
        if not ok:
            shown = _describe(value)
            raise Rejected(CheckpointState.DAMAGED, f"{where} is {shown}, expected {expected}")
    return data


def _check_marker(obj: Any) -> dict[str, Any]:
    """``obj``, or :class:`Rejected` as foreign unless it is a dict marked as a format version
    this code reads."""
    foreign = CheckpointState.FOREIGN
    if not isinstance(obj, dict):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise Rejected(foreign, f"holds a {kind}, not an hpc-ddp checkpoint")
    if obj.get("format") != FORMAT:
        keys = sorted(map(str, obj))
        shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
        reason = f"a dict of {{{shown}}} with no hpc-ddp format marker: not an hpc-ddp checkpoint"
        raise Rejected(foreign, reason)
    version = obj.get("version")
    if type(version) is not int or version not in _READABLE:
        raise Rejected(
            foreign,
            f"checkpoint format version {version!r}, this hpc-ddp reads "
            f"{' and '.join(map(str, _READABLE))} (resume with the hpc-ddp version that wrote it)",
        )
    return obj


_Check = tuple[str, Any, bool, str]
"""(where, the value found, whether it is right, what was expected)."""


def _value_checks(obj: dict[str, Any]) -> list[_Check]:
    """Every value check of a payload holding all of ``_REQUIRED``, in the order reported."""
    progress, meta = obj["progress"], obj["meta"]
    checks: list[_Check] = [
        ("model", obj["model"], _is_str_dict(obj["model"]), "a state dict"),
        ("rng", obj["rng"], _is_rng_list(obj["rng"]), "per-rank RNG state dicts"),
        ("progress", progress, isinstance(progress, dict), "a dict"),
        ("meta", meta, isinstance(meta, dict), "a dict"),
    ]
    for key in ("optimizer", "scheduler", "scaler", "extra", "config"):
        value = obj.get(key)
        checks.append((key, value, value is None or isinstance(value, dict), "a dict or None"))
    objects = obj.get(OBJECTS)
    ok = objects is None or (_is_str_dict(objects) and all(map(_is_str_dict, objects.values())))
    checks.append((OBJECTS, objects, ok, "a dict of state dicts by name, or absent"))
    if isinstance(progress, dict):
        checks += _progress_checks(progress)
    if isinstance(meta, dict):
        names = tuple(objects) if ok and objects is not None else ()
        checks += _meta_checks(meta, obj["rng"], obj["version"], names)
    return checks


def _progress_checks(progress: dict[str, Any]) -> list[_Check]:
    checks = []
    for key in ("step", "epoch", "batch_in_epoch"):
        value = progress.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        checks.append((f"progress.{key}", value, ok, "an int >= 0"))
    value = progress.get("samples_in_epoch")
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    checks.append(("progress.samples_in_epoch", value, ok, "an int >= 0 or absent"))
    return checks


def _meta_checks(
    meta: dict[str, Any], rng: Any, version: int, names: tuple[str, ...] = ()
) -> list[_Check]:
    value = meta.get("time")
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    checks: list[_Check] = [("meta.time", value, ok, "a number")]
    value = meta.get("world_size")
    ok = isinstance(value, int) and isinstance(rng, list) and value == len(rng)
    checks.append(("meta.world_size", value, ok, "the number of rng entries"))
    value = meta.get("grad_accum")
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    checks.append(("meta.grad_accum", value, ok, "an int >= 1 or absent"))
    for key, expected in (("run_id", "a run id"), ("config_digest", "a hex digest")):
        value = meta.get(key)
        checks.append((f"meta.{key}", value, value is None or isinstance(value, str), expected))
    if version == 1:
        value = meta.get("weights_digest")
        ok = isinstance(value, str) and len(value) == 64
        checks.append(("meta.weights_digest", value, ok, "a sha256 hex digest"))
        return checks
    value = meta.get("digest")
    checks.append(("meta.digest", value, value == DIGEST_ALGORITHM, repr(DIGEST_ALGORITHM)))
    value = meta.get("digests")
    keys = (*SECTIONS, *(f"{OBJECTS}.{n}" for n in names), "meta")
    ok = isinstance(value, dict) and all(
        isinstance(value.get(k), str) and len(value[k]) == _DIGEST_HEX for k in keys
    )
    checks.append(("meta.digests", value, ok, "a hex digest for every section and meta"))
    return checks


def _describe(value: Any) -> str:
    """A short description of a value for a reason string (never the repr of a big object)."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)[:40]
    if isinstance(value, list | tuple | dict):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _is_rng_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(e, dict) and isinstance(e.get("torch"), torch.Tensor) and "python" in e
        for e in value
    )


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def rejection_error(source: str | Path, r: Rejected) -> CheckpointError:
    """The error a caller sees for a rejected file: where, what state, why and what to do."""
    message = f"{source}: {r.state.value} checkpoint: {r.reason}. HINT: {_HINTS[r.state]}"
    return CheckpointError(message)


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states in weights-only-loadable form (lists, ints, tensors)."""
    version, words, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": None,
    }
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, words, gauss = state["python"]
    random.setstate((int(version), tuple(int(w) for w in words), gauss))
    torch.set_rng_state(state["torch"].to("cpu"))
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].to("cpu"), device)
    if state.get("numpy") is not None and np is not None:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


@dataclass(frozen=True)
class Best:
    """The best checkpoint so far under ``train.keep_best`` (as ``meta.best`` records it)."""

    metric: str
    mode: str
    step: int
    value: float

    def beaten_by(self, value: float) -> bool:
        """Whether ``value`` is strictly better (a tie keeps the older checkpoint)."""
        return value < self.value if self.mode == "min" else value > self.value

    @classmethod
    def recorded(cls, payload: Mapping[str, Any], keep: KeepBestConfig) -> Best | None:
        """The best ``payload`` records for ``keep``'s metric and mode (None: none, or one
        ranked by another metric or the other way)."""
        best = payload["meta"].get("best")
        if not isinstance(best, Mapping):
            return None
        if (best.get("metric"), best.get("mode")) != (keep.metric, keep.mode):
            return None
        return cls(keep.metric, keep.mode, int(best["step"]), float(best["value"]))


def best_step(payload: Mapping[str, Any]) -> int | None:
    """The step of the best checkpoint that ``payload``'s run has written so far, as it
    records it (``meta.best``, set under ``train.keep_best``); None when it records none."""
    best = payload["meta"].get("best")
    return None if not isinstance(best, Mapping) else int(best["step"])


# --- reading and checking a file ----------------------------------------------------------------

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive (since torch 1.6)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint file as ``hpc-ddp checkpoints`` lists it."""

    path: Path
    step: int
    epoch: int | None
    time: float | None
    size: int
    weights_digest: str | None
    error: str | None = None
    """Why the file is not usable (None for a good checkpoint)."""
    state: CheckpointState = CheckpointState.OK
    version: int | None = None
    """The format version (None when the file is not readable as a checkpoint)."""
    unverified: tuple[str, ...] = ()
    """Sections this file restores without a digest to check them (format 1: all but the
    weights)."""
    run_id: str | None = None
    """The run that wrote it (None: unreadable, or written before runs were recorded)."""


def _first_sentence(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip()
    text = text.splitlines()[0] if text else ""
    text = text.split(". ")[0].rstrip(".")
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _check_file(path: Path) -> None:
    """Reject what is not worth handing to ``torch.load``: no file, an empty file, a file
    that is not a zip archive (a text file, a raw pickle, torch's pre-1.6 format) or one whose
    end is missing (torn: ``torch.load`` would say only "Invalid argument" when mmapped)."""
    damaged = CheckpointState.DAMAGED
    kind = not_regular(path)  # before any open(): a FIFO would block it for ever
    if kind is not None:
        raise Rejected(damaged, kind)
    try:
        with path.open("rb") as f:
            head = f.read(len(_ZIP_MAGIC))
            whole = head == _ZIP_MAGIC and zipfile.is_zipfile(f)  # reads only the end
    except OSError as exc:
        raise Rejected(damaged, f"unreadable ({_first_sentence(exc)})") from exc
    except Exception as exc:  # is_zipfile lets BadZipFile out of a damaged zip64 locator
        raise Rejected(damaged, f"damaged zip archive ({_first_sentence(exc)})") from exc
    if not head:
        raise Rejected(damaged, "empty file (0 bytes)")
    if head.strip(b"\0") == b"":
        raise Rejected(damaged, "starts with zero bytes, not data (lost writes?)")
    if head != _ZIP_MAGIC:
        reason = f"not a torch zip file (starts with {head!r}): not an hpc-ddp checkpoint"
        raise Rejected(CheckpointState.FOREIGN, reason)
    if not whole:
        reason = "torn: the zip archive has no end (a write or copy that stopped early)"
        raise Rejected(damaged, reason)


def _torch_load(path: Path, *, mmap: bool) -> Any:
    """``torch.load`` to the CPU, weights only (no code from the file runs)."""
    try:
        with warnings.catch_warnings():
            # A foreign pickle with a newer protocol makes torch warn before it refuses.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError..
        unsupported = _UNSUPPORTED_GLOBAL.search(_ANSI.sub("", str(exc)))
        if unsupported:  # pickled objects of someone's classes: loading would run their code
            reason = (
                f"holds a {unsupported.group(1)}, which only a load that runs code could "
                "read: not an hpc-ddp checkpoint"
            )
            raise Rejected(CheckpointState.FOREIGN, reason) from exc
        raise Rejected(CheckpointState.DAMAGED, f"unreadable ({_first_sentence(exc)})") from exc


def _check_digests(data: dict[str, Any]) -> None:
    """:class:`Rejected`, naming every section that changed, unless each still hashes to its
    recorded digest (format 1: the weights only)."""
    try:
        if data["version"] == 1:
            recorded = {"model": data["meta"]["weights_digest"]}
            actual = {"model": sha256_weights(data["model"])}
        else:
            recorded = data["meta"]["digests"]
            actual = state_digests(data)
    except Exception as exc:  # meta or sparse tensors: nothing a writer of ours saves
        reason = f"its tensors cannot be hashed ({_first_sentence(exc)})"
        raise Rejected(CheckpointState.DAMAGED, reason) from exc
    changed = [k for k in actual if k in recorded and actual[k] != recorded[k]]
    if changed:
        what = ", ".join(_what(k) for k in changed)
        verb = "does not match its" if len(changed) == 1 else "do not match their"
        raise Rejected(
            CheckpointState.DAMAGED,
            f"{what} {verb} recorded digest: the file changed after it was written",
        )


def _check_name(path: Path, data: dict[str, Any]) -> None:
    """:class:`Rejected` unless the file's name says the step it holds: a copy under another
    step's name would be taken for that step (skipping newer ones, and pruning them)."""
    named = parse_checkpoint_name(path.name)
    wrong = None if named is None else misnamed(named, data["progress"]["step"])
    if wrong is not None:
        raise Rejected(CheckpointState.DAMAGED, wrong)


def _check_identity(data: dict[str, Any], run_id: str | None) -> None:
    """:class:`Rejected` as a stranger when the file names a run and it is not ``run_id``
    (None, or a file that names none: unknown, accepted; see the module docstring)."""
    why = stranger(data["meta"].get("run_id"), run_id)
    if why is not None:
        raise Rejected(CheckpointState.STRANGER, why)


def _read(
    path: Path, *, verify: bool, mmap: bool = False, run_id: str | None = None
) -> dict[str, Any]:
    """Every check a checkpoint must pass, in order of cost; :class:`Rejected` on the first
    that fails. Whatever a damaged file makes a check raise is a :class:`Rejected` too: no
    exception of a reader (zipfile, pickle, torch, struct, a MemoryError of an absurd size)
    gets out."""
    try:
        _check_file(path)
        data = check_structure(_torch_load(path, mmap=mmap))
        _check_name(path, data)
        if verify:
            _check_digests(data)
    except Rejected:
        raise
    except Exception as exc:
        reason = f"unreadable ({_first_sentence(exc)})"
        raise Rejected(CheckpointState.DAMAGED, reason) from exc
    _check_identity(data, run_id)
    return data


def load_checkpoint(
    path: Path, *, verify: bool = True, run_id: str | None = None
) -> dict[str, Any]:
    """Load and check one checkpoint file, to the CPU (weights only: no code runs from the file).

    The caller's ``load_state_dict`` then puts each tensor where its parameter lives, as torch
    intends: an optimizer's ``step`` counters stay on the CPU, as in a fresh run, and the device
    never holds a second copy of the state. ``verify`` recomputes every section's digest and
    rejects a file whose content changed since it was written (bit rot, a bad copy); a format-1
    file has only its weights checked (see :func:`unverified_sections`). ``run_id``: the run
    loading it (another run's file is refused; None: any run's).
    """
    try:
        return _read(path, verify=verify, run_id=run_id)
    except Rejected as r:
        raise rejection_error(path, r) from None


def find_latest(
    directory: Path, *, run_id: str | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of run ``run_id`` (None: of any run) that passes every check,
    loaded to the CPU, or None when there is none at all.

    A newer file that fails (damaged, misnamed, foreign, another run's, any section's digest
    included) is logged as a warning naming it and why, and the one before it is tried.
    Files exist but none loads: :class:`CheckpointError`, since silently starting over would
    throw the run away.
    """
    files = checkpoint_files(directory)
    errors = []
    for _, path in files:
        try:
            return path, _read(path, verify=True, run_id=run_id)
        except Rejected as r:
            log.warning(
                "skipping checkpoint %s (%s: %s); trying the one before it",
                path,
                r.state.value,
                r.reason,
            )
            errors.append(f"{path.name}: {r.state.value}: {r.reason}")
    if errors:
        raise CheckpointError(
            f"{directory}: none of {len(errors)} checkpoints loads (newest: {errors[0]}). "
            "HINT: move the checkpoints directory aside to start the run from scratch."
        )
    return None


def list_checkpoints(
    directory: Path, *, verify: bool = False, run_id: str | None = None
) -> list[CheckpointInfo]:
    """Every checkpoint file in a run directory (or its ``checkpoints/``), oldest first.

    Never raises for a bad file: damaged, foreign and (given ``run_id``) another run's files
    are listed with their :class:`CheckpointState` and reason. Reads each file memory-mapped,
    so listing is cheap; ``verify=True`` also recomputes every digest from the content, the
    check resume makes.
    """
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    out = []
    for step, path in reversed(checkpoint_files(directory)):
        if not path.exists() and not path.is_symlink():
            continue  # pruned by the writer of a live run while we listed
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # a dangling symlink: _read says so
        try:
            data = _read(path, verify=verify, mmap=True, run_id=run_id)
        except Rejected as r:
            out.append(CheckpointInfo(path, step, None, None, size, None, r.reason, r.state))
            continue
        out.append(
            CheckpointInfo(
                path,
                step,
                int(data["progress"]["epoch"]),
                float(data["meta"]["time"]),
                size,
                recorded_weights_digest(data),
                version=int(data["version"]),
                unverified=unverified_sections(data),
                run_id=data["meta"].get("run_id"),
            )
        )
    return out
