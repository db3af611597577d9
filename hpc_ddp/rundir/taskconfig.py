"""A sweep task's ``config.yaml``: packed for every point at submit, written out as each task
starts.

Making ``tasks/<i>/`` and its ``config.yaml`` for each of a thousand points at submit is two
thousand file-system metadata operations, most of a sweep's submit time (on a shared file
system each is a round trip to its metadata server). So submit writes every point's config
text into one file, ``SWEEP_DIR/task_configs.jsonl``
(:attr:`~hpc_ddp.rundir.layout.RunPaths.task_configs`, :func:`pack_task_configs`), one JSON line per
point, ``{"index": 3, "config": "<the YAML text>"}``; and each task, when it starts, writes its
own ``tasks/<i>/config.yaml`` from its line (:func:`materialise_task_config`, called by
:func:`hpc_ddp.job.task.write_task_config` once the task knows it may run, before anything
reads the config): the same bytes submit used to write.

Login-side readers that may meet a point whose task has not started (``--resubmit-failed``,
``logs``) read its config through :func:`task_config_text`: the task's own ``config.yaml`` when
it is there, else its packed line. A sweep directory written before the packed file existed
(every ``config.yaml`` written at submit) reads as it always did.

Point ``i``'s line is line ``i + 1`` (the points are written in order), and it must say
``"index": i`` with no other line saying so: an edited file that breaks this is refused, never
read as another point's config. Reading a point's line reads every line's index from its first
bytes (a thousand points are 1-2 MB: a few milliseconds), and parses only that line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from hpc_ddp.config.model import JobConfig
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths


def pack_task_configs(texts: Iterable[tuple[int, str]]) -> str:
    """The text of ``task_configs.jsonl``: one JSON line per (point index, config text)."""
    return "".join(_line(index, text) for index, text in texts)


def _line(index: int, text: str) -> str:
    # json.dumps's default separators: _CANONICAL matches how every line starts.
    return json.dumps({"index": index, "config": text}) + "\n"


def packed_config_text(sweep_dir: Path, index: int) -> str | None:
    """Point ``index``'s config text from ``sweep_dir``'s ``task_configs.jsonl``; None when
    there is no such file (a sweep written before it existed) or no line for the point.

    A file that cannot be read, or whose line for the point is damaged, misplaced or claimed by
    two lines, is a :class:`RunDirError` naming it: a task never runs another point's config.
    """
    path = RunPaths(sweep_dir).task_configs
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunDirError(
            f"{path}: cannot read the sweep's task configs ({exc.strerror or exc}). HINT: it "
            "must be a readable file written by `hpc-ddp sweep`; check its permissions"
        ) from None
    line = _find_line(data, index, path)
    if line is None:
        return None
    try:
        entry = json.loads(line)
        text = entry["config"]
        if entry["index"] != index or not isinstance(text, str):
            raise ValueError(f"not the config of point {index}")
    except (ValueError, TypeError, KeyError) as exc:
        raise RunDirError(
            f"{path}: the line of point {index} is damaged ({exc}). HINT: it is written by "
            "`hpc-ddp sweep`; restore the file, or sweep again"
        ) from None
    return text


_CANONICAL = re.compile(rb'\{"index": (\d+), ')
"""How every line :func:`pack_task_configs` writes starts: its index is read without parsing."""


def _find_line(data: bytes, index: int, path: Path) -> bytes | None:
    """The line of point ``index``: line ``index + 1``, as :func:`pack_task_configs` writes
    the points in order, and it must say ``"index": <index>``, with no other line saying so.

    An edited file could otherwise run one point's config for another (the first line that
    claimed the index used to win), while ``results`` showed the other point's values.
    """
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    claims = [n for n, line in enumerate(lines) if _index_of(line) == index]
    hint = (
        "HINT: it is written by `hpc-ddp sweep`, one line per point in order; restore it, or "
        "sweep again"
    )
    if len(claims) > 1:
        numbers = ", ".join(str(n + 1) for n in claims)
        raise RunDirError(
            f"{path}: lines {numbers} all say they are point {index}'s config; a task must "
            f"never guess which one is. {hint}"
        )
    if claims and claims[0] != index:
        raise RunDirError(
            f"{path}: line {claims[0] + 1} says it is point {index}'s config, but point "
            f"{index}'s line is line {index + 1}. {hint}"
        )
    if not claims and index < len(lines):
        said = _index_of(lines[index])
        raise RunDirError(
            f"{path}: line {index + 1}, point {index}'s, says "
            f"{'index ' + str(said) if said is not None else 'no index'}. {hint}"
        )
    return lines[index] if claims else None


def _index_of(line: bytes) -> int | None:
    """The ``index`` a line says; None when it says none. A line in another JSON writer's
    spacing or key order is parsed; a damaged one is caught when its point reads it."""
    match = _CANONICAL.match(line)
    if match is not None:
        return int(match.group(1))
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    value = entry.get("index") if isinstance(entry, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def task_config_text(sweep_dir: Path, index: int) -> str | None:
    """Point ``index``'s ``config.yaml`` text: the task's own file when it has been written
    (by its task, or by submit in a sweep directory written before ``task_configs.jsonl``),
    else its line of ``task_configs.jsonl``; None when there is neither."""
    config = RunPaths(sweep_dir).task(index).config
    try:
        return config.read_text(encoding="utf-8")
    except FileNotFoundError:
        return packed_config_text(sweep_dir, index)
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(
            f"{config}: cannot read the task's config ({exc}). HINT: it must be a readable "
            "UTF-8 file; move whatever is in its place aside"
        ) from None


def load_task_config(sweep_dir: Path, index: int) -> JobConfig:
    """Point ``index``'s resolved config (see :func:`task_config_text`), read as
    :func:`~hpc_ddp.config.load.load_resolved_config` reads a run's; a point with none is a
    :class:`RunDirError`, a config that does not validate a :class:`~hpc_ddp.errors.ConfigError`."""
    from hpc_ddp.config.load import job_config_from_dict
    from hpc_ddp.config.yaml_dialect import parse_yaml

    text = task_config_text(sweep_dir, index)
    config = RunPaths(sweep_dir).task(index).config
    if text is None:
        raise RunDirError(
            f"{config}: no config for point {index}, and none in "
            f"{RunPaths(sweep_dir).task_configs.name}. HINT: the sweep directory is "
            "incomplete; sweep again with `hpc-ddp sweep`"
        )
    return job_config_from_dict(parse_yaml(text, str(config)), str(config))


def materialise_task_config(sweep_dir: Path, index: int) -> Path | None:
    """Write ``tasks/<index>/config.yaml`` from ``task_configs.jsonl`` unless it exists, and
    return its path; None when there is neither (no such point).

    Every rank of the task, and its supervisor, may do this at the same moment: each writes
    its own temp file (named for its host and pid, and random: two nodes may share a pid) and
    renames it over ``config.yaml``, so a reader finds no file or a whole one, and every
    writer writes the same bytes.
    """
    config = RunPaths(sweep_dir).task(index).config
    if config.is_file():
        return config
    text = packed_config_text(sweep_dir, index)
    if text is None:
        return None
    config.parent.mkdir(parents=True, exist_ok=True)
    tmp = config.with_name(
        f".{config.name}.{os.uname().nodename}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    )
    write_text_atomic(config, text, tmp=tmp)
    return config
