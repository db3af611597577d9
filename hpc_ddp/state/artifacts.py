"""A run's files as ``status`` judges them without torch: checkpoint files, the last metric.

Two small reads tell a torn or empty checkpoint from a whole one; the weights digest needs
torch (``hpc-ddp checkpoints --verify``, and the runtime on every resume).
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

from hpc_ddp.errors import RunDirError
from hpc_ddp.layout import RunPaths

__all__ = ["checkpoint_steps", "damaged_checkpoint", "last_metric"]

_CKPT_RE = re.compile(r"^step-(\d+)\.pt$")
_ZIP_MAGIC = b"PK\x03\x04"


def checkpoint_steps(paths: RunPaths) -> list[int]:
    """Steps of the checkpoints in a run, ascending, by file name alone (no torch import)."""
    if not paths.checkpoints.is_dir():
        return []
    steps = [int(m.group(1)) for p in paths.checkpoints.iterdir() if (m := _CKPT_RE.match(p.name))]
    return sorted(steps)


def damaged_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be a whole checkpoint, judged without torch; None if it looks whole.

    ``torch.save`` writes a zip archive: it starts with ``PK\\x03\\x04`` and ends with the
    archive's central directory, so an empty, torn (cut short) or overwritten file shows here
    at the cost of two small reads. A file that passes may still fail to load (``hpc-ddp
    checkpoints --verify`` loads each one).
    """
    try:
        with path.open("rb") as f:
            head = f.read(4)
        if not head:
            return "empty file"
        if head != _ZIP_MAGIC:
            return "not a torch zip archive"
        if not zipfile.is_zipfile(path):
            return "truncated: the zip archive has no end"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return None


def last_metric(paths: RunPaths, key: str) -> Any:
    """The last value logged for ``key`` in ``metrics.jsonl`` (None if never logged).

    Lines that are not JSON objects (a torn last line from a killed writer, binary garbage, a
    bare number or list) are skipped. A metrics file that cannot be read at all is a
    :class:`RunDirError`.
    """
    value = None
    try:
        with paths.metrics.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                    continue
                if isinstance(row, dict) and key in row:
                    value = row[key]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunDirError(
            f"{paths.metrics}: unreadable metrics ({exc.strerror or exc}). HINT: check the "
            "file's permissions, or move it aside (training appends a new one)."
        ) from None
    return value
