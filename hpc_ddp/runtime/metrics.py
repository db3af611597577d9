"""Metrics and logs: ``RUN_DIR/metrics.jsonl`` (rank 0), progress lines, rank-tagged logging.

One JSON object per line, appended and flushed line by line, so a requeued attempt continues
the same file and a reader (``hpc-ddp status``, ``results``) sees whole lines, at worst a torn
last one. Formatting is pure; only :class:`MetricsWriter` touches the file.

With a ``tensorboard_dir`` the writer also sends every row's numbers to TensorBoard
(``torch.utils.tensorboard``, imported only then), global step = the row's ``step``. A requeued
attempt opens a new event file in the same directory and, through :meth:`MetricsWriter.resume_at`,
tells TensorBoard to drop what the previous attempt logged after the checkpoint it resumes
from: those steps are trained and logged again, and would otherwise show twice.

``metrics.jsonl`` is only ever appended to, so it drops them the way TensorBoard's event files
do, with a marker (:mod:`hpc_ddp.rundir.metrics`, where the file's lines and the rule that reads
them back live).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from hpc_ddp.errors import ConfigError, HpcDdpError
from hpc_ddp.rundir.live_progress import format_duration
from hpc_ddp.rundir.metrics import NOT_METRICS, last_logged_step, metrics_line, resume_marker

TENSORBOARD_HINT = "pip install 'hpc-ddp[tensorboard]'"


def format_progress(
    *,
    step: int,
    total: int,
    epoch: int,
    loss: float | None,
    samples_per_s: float | None,
    eta_s: float | None,
) -> str:
    """``step 120/600 | epoch 1 | loss 0.4321 | 2345 samples/s | ETA 0:01:23``."""
    parts = [f"step {step}/{total}", f"epoch {epoch}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if samples_per_s is not None:
        parts.append(f"{samples_per_s:.0f} samples/s")
    if eta_s is not None:
        parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


class Throughput:
    """Samples per second and ETA over the window since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._steps = 0
        self._samples = 0

    def add(self, steps: int, samples: int) -> None:
        self._steps += steps
        self._samples += samples

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (evaluation, a checkpoint) out of the window."""
        self._start += seconds

    def rate(self) -> tuple[float | None, float | None]:
        """(samples per second, seconds per step) of the window, None when it is empty."""
        elapsed = time.perf_counter() - self._start
        if self._steps == 0 or elapsed <= 0:
            return None, None
        return self._samples / elapsed, elapsed / self._steps


def metric_row(metrics: Mapping[str, Any], *, convert: bool = True) -> dict[str, Any]:
    """``metrics`` as plain Python values, checked: what :meth:`Session.log` passes on.

    A tensor or numpy value (a 0-d one, a one-element one, a numpy scalar) becomes its
    Python number (``item()``), in nested dicts and lists too; one of any other number of
    elements is refused with an :class:`~hpc_ddp.errors.HpcDdpError` naming its key, before
    anything is written: a metric is one number, and which one of many to keep is the
    caller's choice. Non-finite numbers stay (``metrics.jsonl`` writes them as null,
    TensorBoard plots them). ``convert=False`` only checks (ranks that write nothing need no
    ``item()``, which waits for the GPU) and returns the values as given.
    """
    return {key: _metric_value(value, key, convert) for key, value in metrics.items()}


def _metric_value(value: Any, where: str, convert: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _metric_value(v, f"{where}.{k}", convert) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_metric_value(v, f"{where}[{i}]", convert) for i, v in enumerate(value)]
    shape = getattr(value, "shape", None)
    item = getattr(value, "item", None)
    if shape is None or not callable(item):
        return value
    try:
        elements = math.prod(int(n) for n in shape)
    except (TypeError, ValueError):
        return value  # not an array's shape: written as it is (or as text)
    if elements != 1:
        kind = type(value).__name__
        raise HpcDdpError(
            f"s.log: {where!r} is a {kind} of {elements} elements (shape {tuple(shape)}), not "
            "one number; nothing of this row was logged. HINT: log one number per key (e.g. "
            "x.mean().item()), or one key per element."
        )
    return item() if convert else value


def json_safe(value: Any) -> Any:
    """``value`` (a :func:`metric_row`'s) with every non-finite float, nested ones included,
    as None: JSON has no NaN or infinity, and a reader takes null for "no number"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def summary_writer_class() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``; without tensorboard a ConfigError + HINT."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(
            f"train.tensorboard is true but TensorBoard cannot be imported ({exc}). "
            f"HINT: {TENSORBOARD_HINT} in the environment the job runs in, or set "
            "train.tensorboard=false."
        ) from None
    return SummaryWriter


def tensorboard_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers to plot: every int, float or 0-d tensor but ``step`` and ``time``.

    Booleans and text are left out; non-finite values stay (a NaN loss is worth seeing).
    """
    scalars: dict[str, float] = {}
    for key, value in row.items():
        if key in NOT_METRICS or isinstance(value, bool):
            continue
        item = getattr(value, "item", None)
        number = item() if callable(item) and getattr(value, "ndim", 0) == 0 else value
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            scalars[key] = float(number)
    return scalars


EVENT_FILE_PREFIX = "events.out.tfevents."


def wait_for_a_later_second(tensorboard_dir: Path) -> None:
    """Return once an event file opened now sorts after every one in ``tensorboard_dir``.

    TensorBoard reads a directory's event files in name order, and a name is
    ``events.out.tfevents.<second>.<host>.<pid>.<n>``, ``n`` counting the writers of the
    process: within one second, writer 10 sorts before writer 9, and an attempt's reopened
    file (its purge, its rows) would be read before the file it follows. Waits (under a
    second) only while a file of this very second exists."""
    seconds = []
    for path in tensorboard_dir.glob(EVENT_FILE_PREFIX + "*"):
        field = path.name[len(EVENT_FILE_PREFIX) :].split(".", 1)[0]
        if field.isdigit():
            seconds.append(int(field))
    newest = max(seconds, default=None)
    while newest is not None and int(time.time()) <= newest:
        time.sleep(0.02)


class MetricsWriter:
    """Appends rows to ``metrics.jsonl`` (and TensorBoard, if asked); write on rank 0 only.

    ``tensorboard_dir``: also write each row's numbers there as scalars at global step
    ``row["step"]`` (rows without an integer step go to the JSON lines only). TensorBoard is
    imported here, so a missing package fails at startup, on every rank, not mid-training;
    the event file itself is only created by the first :meth:`write`, so other ranks write none.
    """

    def __init__(self, path: Path, *, tensorboard_dir: Path | None = None) -> None:
        self.path = path
        self.tensorboard_dir = tensorboard_dir
        self._file: IO[str] | None = None
        self._writer_class: Any = None if tensorboard_dir is None else summary_writer_class()
        self._tb: Any = None
        self._purge_step: int | None = None
        self._resumed_at: int | None = None

    def resume_at(self, step: int) -> None:
        """This attempt goes on after ``step`` (the restored checkpoint's; 0: from scratch).

        TensorBoard events that earlier attempts logged at later steps are dropped (``purge_step``):
        they are about to be logged again. Step ``step`` itself was logged before its
        checkpoint was saved, so it stays, except on a start from scratch, where all goes.
        ``metrics.jsonl`` gets a resume marker before this attempt's first row when earlier
        attempts logged steps after ``step`` (:func:`drop_replayed`).
        """
        self._purge_step = step + 1 if step > 0 else 0
        self._resumed_at = step
        if self._tb is not None:  # opened already: reopen so the purge marker is written
            self._tb.close()
            self._tb = None

    def write(self, row: Mapping[str, Any]) -> None:
        """Append ``row`` as one JSON line (flushed), and its numbers to TensorBoard.

        Its values go through :func:`metric_row` first (a non-scalar is refused before anything
        is written) and non-finite numbers are written as null (:func:`json_safe`).
        """
        row = metric_row(row)
        line = metrics_line(json_safe(row))
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", buffering=1)
        if self._resumed_at is not None:
            # Only when an earlier attempt logged a later step than this one goes on after (a
            # crash after the last checkpoint): after a clean stop there is nothing to drop.
            last = last_logged_step(self.path) if self._file.tell() > 0 else 0
            if last is None or last > self._resumed_at:
                self._file.write(metrics_line(resume_marker(self._resumed_at, time.time())))
            self._resumed_at = None
        self._file.write(line)
        self._file.flush()
        if self._writer_class is not None:
            self._write_tensorboard(row)

    def _write_tensorboard(self, row: dict[str, Any]) -> None:
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        if self._tb is None:
            if self.tensorboard_dir is not None:
                wait_for_a_later_second(self.tensorboard_dir)
            self._tb = self._writer_class(
                log_dir=str(self.tensorboard_dir), purge_step=self._purge_step
            )
            # Once per attempt: a reopen (after close) must not drop this attempt's own steps.
            self._purge_step = None
        wall = row.get("time")
        wall_time = float(wall) if isinstance(wall, (int, float)) else None
        for tag, value in tensorboard_scalars(row).items():
            self._tb.add_scalar(tag, value, global_step=step, walltime=wall_time)
        # As metrics.jsonl does per line: a killed attempt loses no logged row.
        self._tb.flush()

    def close(self) -> None:
        """Close the files (a later :meth:`write` opens them again)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_rank_logging(
    logger: logging.Logger, rank: int, *, every_rank: bool = False
) -> logging.Handler | None:
    """Rank-tagged lines on stderr from ``logger``: INFO on rank 0, warnings elsewhere.

    ``every_rank`` gives INFO on all ranks: right when each rank writes its own log file
    (srun ``--output=rank-%t.out``), wrong on a shared terminal where lines would repeat.
    Does nothing (returns None) when the application has configured logging itself.
    """
    if logger.handlers or logging.getLogger().handlers:
        return None
    handler = logging.StreamHandler()
    handler.addFilter(_RankFilter(rank))
    handler.setFormatter(logging.Formatter("%(asctime)s [rank %(rank)s] %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 or every_rank else logging.WARNING)
    return handler
