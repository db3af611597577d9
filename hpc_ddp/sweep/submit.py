"""Submitting a sweep: one sweep directory, one job array (or as few as Slurm allows).

Like :mod:`hpc_ddp.slurm.submission`: :func:`plan_arrays` and :func:`prepare_arrays` are pure (the
dry run shows them), :func:`write_sweep_dir` writes the task directories and
:func:`schedule_arrays` is the one place that calls ``sbatch``. The layout is described in
:mod:`hpc_ddp.sweep.results`, which reads it back.

Speed matters here (a 1,000-point sweep should submit as fast as submitit's ``map_array``), so
the configs are dumped through :class:`ConfigTexts` and written without one fsync each.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import operator
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc_ddp.config.load import dump_job_config, load_resolved_config, to_plain
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.yaml_dialect import dump_yaml
from hpc_ddp.durable import fsync_dir, write_text_atomic
from hpc_ddp.errors import SlurmError, SubmissionError
from hpc_ddp.rundir import (
    Manifest,
    RunPaths,
    create_run_dir,
    read_manifest,
    write_manifest,
)
from hpc_ddp.slurm.client import SlurmClient
from hpc_ddp.slurm.render import RenderContext, load_template, render_sbatch
from hpc_ddp.sweep.results import (
    ARRAYS_RECORD,
    SWEEP_RECORD,
    ArrayRecord,
    failed_points,
    format_index_ranges,
    read_arrays,
    read_sweep_record,
)
from hpc_ddp.sweep.spec import SweepSpec
from hpc_ddp.version import __version__

log = logging.getLogger(__name__)

SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default ``MaxArraySize``, assumed by a dry run that cannot ask the cluster."""


def script_name(number: int) -> str:
    """The script of the sweep's ``number``-th array: ``job.sbatch``, then ``job-1.sbatch``..."""
    return "job.sbatch" if number == 0 else f"job-{number}.sbatch"


def sweep_name(spec: SweepSpec) -> str:
    """The base job's name (points are named ``<base name>-<index>``)."""
    return spec.points[0].config.name.rsplit("-", 1)[0]


# --- planning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayPlan:
    """One job array: task id ``t`` runs point ``t + offset``; all its points share a script."""

    points: tuple[int, ...]
    offset: int
    group: int
    """Index of the script variant (points whose slurm/env/requeue sections are equal)."""

    def spec(self, max_parallel: int | None) -> str:
        """The ``--array`` value: task ids as ranges, then the ``%N`` throttle."""
        ids = format_index_ranges(p - self.offset for p in self.points)
        return ids if max_parallel is None else f"{ids}%{max_parallel}"


def plan_arrays(
    points: Sequence[int], groups: Sequence[int], max_array_size: int
) -> list[ArrayPlan]:
    """Split ``points`` (with the script ``groups[i]`` of ``points[i]``) into as few arrays as
    ``MaxArraySize`` allows.

    Task ids must stay below ``max_array_size``. Points below it keep their own index as task
    id (offset 0: ``tasks/$SLURM_ARRAY_TASK_ID``); the rest are covered greedily by windows of
    ``max_array_size`` starting at the first point not yet covered, which for a whole sweep
    ``0..n-1`` gives exactly :func:`hpc_ddp.sweep.spec.chunk_array`'s ranges.
    """
    if max_array_size < 1:
        raise ValueError(f"MaxArraySize must be at least 1, got {max_array_size}")
    by_group: dict[int, list[int]] = {}
    for point, group in sorted(zip(points, groups, strict=True)):
        by_group.setdefault(group, []).append(point)
    plans = []
    for group, members in by_group.items():
        i = 0
        while i < len(members):
            offset = 0 if members[i] < max_array_size else members[i]
            j = i
            while j < len(members) and members[j] < offset + max_array_size:
                j += 1
            plans.append(ArrayPlan(tuple(members[i:j]), offset, group))
            i = j
    return sorted(plans, key=lambda p: (p.points[0], p.group))


def script_groups(configs: Sequence[JobConfig]) -> list[int]:
    """Group index per config: one script serves every point whose rendered sections match."""
    seen: dict[tuple[object, ...], int] = {}
    return [seen.setdefault((c.slurm, c.env, c.requeue), len(seen)) for c in configs]


@dataclass(frozen=True)
class PreparedArray:
    """An array ready to be written and submitted."""

    plan: ArrayPlan
    array: str
    script_name: str
    script: str
    argv: tuple[str, ...]


def prepare_arrays(
    configs: Mapping[int, JobConfig],
    *,
    name: str,
    sweep_dir: Path,
    max_parallel: int | None,
    max_array_size: int,
    template_dir: Path,
    python: str,
    config_source: str,
    invocation: Sequence[str],
    client: SlurmClient,
    first_number: int = 0,
    now: datetime | None = None,
) -> list[PreparedArray]:
    """Plan the arrays for the points in ``configs`` and render each one's script (pure)."""
    now = now or datetime.now(timezone.utc)
    points = sorted(configs)
    groups = script_groups([configs[p] for p in points])
    representative = {g: configs[p] for p, g in zip(points, groups, strict=True)}
    out = []
    for number, plan in enumerate(plan_arrays(points, groups, max_array_size), first_number):
        cfg = dataclasses.replace(representative[plan.group], name=name)
        spec = plan.spec(max_parallel)
        path = sweep_dir / script_name(number)
        argv = tuple(client.submit_command(path))
        ctx = RenderContext(
            run_dir=str(sweep_dir),
            python=python,
            config_source=config_source,
            submit_command=f"{shlex.join(invocation)}  ->  {shlex.join(argv)}",
            generated_at=now.isoformat(timespec="seconds"),
            version=__version__,
            array=spec,
            array_offset=plan.offset,
        )
        script = render_sbatch(cfg, ctx, load_template(cfg, template_dir))
        out.append(PreparedArray(plan, spec, script_name(number), script, argv))
    return out


# --- writing ------------------------------------------------------------------------------------


def sweep_record_text(spec: SweepSpec, name: str, sweep_file: Path) -> str:
    """``sweep.yaml``: a YAML head, then one JSON object per point (JSON is YAML too, and a
    thousand points are written and read back in milliseconds)."""
    keys = list(dict.fromkeys(k for p in spec.points for k, _ in p.overrides))
    head = {
        "name": name,
        "sweep_file": str(sweep_file),
        "base": spec.base_source,
        "metric": {"name": spec.metric, "mode": spec.mode},
        "max_parallel": spec.max_parallel,
        "keys": keys,
    }
    lines = [
        "# Written by hpc-ddp sweep: the expanded points; `hpc-ddp results` reads this file.\n",
        dump_yaml(head),
        "points:\n",
    ]
    for p in spec.points:
        point = {"index": p.index, "name": p.config.name, "overrides": dict(p.overrides)}
        lines.append(f"- {json.dumps(point)}\n")
    return "".join(lines)


def write_sweep_dir(sweep_dir: Path, spec: SweepSpec, record: str) -> None:
    """Write ``sweep.yaml`` and every ``tasks/<i>/`` (``config.yaml`` and ``logs/``).

    Each config is written straight to its final name in a directory this call created, and
    not fsynced one by one: nothing reads it before the array is submitted (after this returns),
    a crash before then leaves a sweep directory with no manifest that nothing will run, and
    visibility on the compute nodes comes from close() on shared filesystems, not from fsync.
    One fsync per file cost 1.8 s for 1,000 points here; the directories are fsynced once.
    ``checkpoints/`` and ``rendezvous/`` are made by the runtime on first use.
    """
    texts = config_texts([p.config for p in spec.points])
    tasks = RunPaths(sweep_dir).tasks
    tasks.mkdir(parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for point, text in zip(spec.points, texts, strict=True):
        root = os.path.join(tasks, str(point.index))
        os.mkdir(root)
        os.mkdir(os.path.join(root, "logs"))
        fd = os.open(os.path.join(root, "config.yaml"), flags, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    for directory in (tasks, sweep_dir):
        fsync_dir(directory)
    write_text_atomic(sweep_dir / SWEEP_RECORD, record)


def config_texts(configs: Sequence[JobConfig]) -> list[str]:
    """``dump_job_config`` of each config, through :class:`ConfigTexts` when it agrees.

    The first config (which has every section) is checked against ``dump_job_config`` so that
    a change of the YAML dialect falls back to the slow path rather than writing other text;
    the tests compare every piece kind on many values.
    """
    try:
        texts = ConfigTexts().dump(configs)
    except TypeError:  # an unhashable value: not from a validated config, but stay correct
        texts = []
    if configs and (len(texts) != len(configs) or texts[0] != dump_job_config(configs[0])):
        log.warning("fast config dump disagrees with dump_job_config; using the slow one")
        texts = [dump_job_config(c) for c in configs]
    return texts


def link_offset_tasks(sweep_dir: Path, plan: ArrayPlan) -> None:
    """``arrays/<offset>/<t>`` -> ``../../tasks/<t + offset>``: where an offset array's logs go
    (Slurm's ``%a`` in a log path cannot add the offset; see ``RenderContext.array_offset``)."""
    if not plan.offset:
        return
    links = sweep_dir / "arrays" / str(plan.offset)
    links.mkdir(parents=True, exist_ok=True)
    for point in plan.points:
        link = links / str(point - plan.offset)
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "tasks", str(point)))


def write_arrays(sweep_dir: Path, records: Sequence[ArrayRecord]) -> None:
    """Write ``arrays.json`` atomically."""
    data = [dataclasses.asdict(r) for r in records]
    write_text_atomic(sweep_dir / ARRAYS_RECORD, json.dumps(data, indent=1) + "\n")


# --- submitting ---------------------------------------------------------------------------------


def schedule_arrays(
    sweep_dir: Path,
    arrays: Sequence[PreparedArray],
    client: SlurmClient,
    *,
    manifest: Manifest,
    previous: Sequence[ArrayRecord] = (),
    reason: str = "sweep",
) -> list[ArrayRecord]:
    """Write the scripts, ``sbatch`` each array, and record them (also when one is refused).

    ``manifest`` is the sweep's manifest so far (``job_id`` None for a new sweep: the first
    array's then fills it); the new array job ids are appended to its ``array_jobs``.
    """
    for prepared in arrays:
        write_text_atomic(sweep_dir / prepared.script_name, prepared.script)
        link_offset_tasks(sweep_dir, prepared.plan)
    submitted: list[ArrayRecord] = []
    try:
        for prepared in arrays:
            result = client.submit(sweep_dir / prepared.script_name)
            submitted.append(
                ArrayRecord(
                    job_id=result.job_id or "",
                    points=format_index_ranges(prepared.plan.points),
                    offset=prepared.plan.offset,
                    array=prepared.array,
                    script=prepared.script_name,
                    submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    reason=reason,
                    command=list(prepared.argv),
                )
            )
    except SlurmError as exc:
        if not submitted:
            raise
        ids = ", ".join(r.job_id for r in submitted)
        raise SubmissionError(
            f"{exc}\nArray job(s) {ids} of this sweep were submitted before that and are "
            f"recorded in {sweep_dir}. HINT: once the cause is fixed, `hpc-ddp sweep "
            f"--resubmit-failed {sweep_dir}` submits the points that were left out"
        ) from None
    finally:
        if submitted:
            write_arrays(sweep_dir, [*previous, *submitted])
            if manifest.job_id is None:
                first = submitted[0]
                manifest = dataclasses.replace(
                    manifest,
                    job_id=first.job_id,
                    submitted_at=first.submitted_at,
                    command=first.command,
                    array=first.array,
                )
            jobs = [*manifest.array_jobs, *(r.job_id for r in submitted)]
            write_manifest(RunPaths(sweep_dir), dataclasses.replace(manifest, array_jobs=jobs))
    return submitted


@dataclass(frozen=True)
class SweepSubmission:
    """A submitted sweep."""

    sweep_dir: Path
    arrays: list[ArrayRecord]


def submit_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    runs_dir: Path,
    python: str,
    invocation: Sequence[str],
    client: SlurmClient,
    now: datetime | None = None,
) -> SweepSubmission:
    """Write a new sweep directory for ``spec`` and submit its array(s)."""
    now = now or datetime.now(timezone.utc)
    name = sweep_name(spec)
    # Claimed by mkdir: a sweep submitted in the same second gets the next suffix, never this
    # directory (whose clean-up below would otherwise delete the other sweep's files).
    sweep_dir = create_run_dir(runs_dir.resolve(), name, now.strftime("%Y%m%d-%H%M%S"))
    record = sweep_record_text(spec, name, sweep_file.resolve())
    try:
        # Ask slurmctld for MaxArraySize while the configs are written: only the scripts need
        # it, and the round trip costs as much as writing hundreds of configs.
        with ThreadPoolExecutor(max_workers=1) as pool:
            limit = pool.submit(client.max_array_size)
            write_sweep_dir(sweep_dir, spec, record)
            max_array_size = limit.result()
        arrays = prepare_sweep(
            spec,
            sweep_file=sweep_file,
            sweep_dir=sweep_dir,
            max_array_size=max_array_size,
            python=python,
            invocation=invocation,
            client=client,
            now=now,
        )
        manifest = Manifest(
            name=name,
            backend="slurm",
            job_id=None,
            submitted_at="",
            command=[],
            config_source=str(sweep_file),
            run_dir=str(sweep_dir),
        )
        records = schedule_arrays(sweep_dir, arrays, client, manifest=manifest)
    except BaseException:
        if not (sweep_dir / "manifest.json").exists():
            shutil.rmtree(sweep_dir, ignore_errors=True)  # nothing submitted: leave no trace
        raise
    return SweepSubmission(sweep_dir, records)


def prepare_sweep(
    spec: SweepSpec,
    *,
    sweep_file: Path,
    sweep_dir: Path,
    max_array_size: int,
    python: str,
    invocation: Sequence[str],
    client: SlurmClient,
    now: datetime | None = None,
) -> list[PreparedArray]:
    """:func:`prepare_arrays` for every point of ``spec`` (what a dry run shows)."""
    base = Path(spec.base_source)
    return prepare_arrays(
        {p.index: p.config for p in spec.points},
        name=sweep_name(spec),
        sweep_dir=sweep_dir,
        max_parallel=spec.max_parallel,
        max_array_size=max_array_size,
        # A relative slurm.template is taken from the base job file's directory.
        template_dir=base.parent if base.is_file() else sweep_file.parent,
        python=python,
        config_source=str(sweep_file),
        invocation=invocation,
        client=client,
        now=now,
    )


@dataclass(frozen=True)
class Resubmission:
    """What ``--resubmit-failed`` found and did (``records`` empty for a dry run)."""

    points: list[int]
    arrays: list[PreparedArray]
    records: list[ArrayRecord]


def resubmit_failed(
    sweep_dir: Path,
    *,
    client: SlurmClient,
    python: str,
    invocation: Sequence[str],
    dry_run: bool = False,
    now: datetime | None = None,
) -> Resubmission:
    """Submit the failed and cancelled tasks of a sweep again, as one new array (or as few as
    ``MaxArraySize`` allows) over exactly those points.

    Their directories are reused as they are: the runtime resumes each from its last
    checkpoint and appends to its ledger, metrics and logs.
    """
    record = read_sweep_record(sweep_dir)
    manifest = read_manifest(sweep_dir)
    previous = read_arrays(sweep_dir)
    job_ids = list(dict.fromkeys(a.job_id for a in previous))
    live = client.job_states(job_ids) if job_ids else {}
    points = failed_points(sweep_dir, live, record)
    if not points:
        return Resubmission([], [], [])
    paths = RunPaths(sweep_dir)
    configs = {i: load_resolved_config(paths.task(i).config) for i in points}
    base = Path(record.base)
    arrays = prepare_arrays(
        configs,
        name=record.name,
        sweep_dir=sweep_dir,
        max_parallel=record.max_parallel,
        max_array_size=client.max_array_size(),
        template_dir=base.parent if base.is_file() else Path(record.sweep_file).parent,
        python=python,
        config_source=record.sweep_file,
        invocation=invocation,
        client=client,
        first_number=len(previous),
        now=now,
    )
    if dry_run:
        return Resubmission(points, arrays, [])
    records = schedule_arrays(
        sweep_dir, arrays, client, manifest=manifest, previous=previous, reason="resubmit-failed"
    )
    return Resubmission(points, arrays, records)


# --- fast config dumps --------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)+")


def _scalar_text(value: Any) -> str | None:
    """What ``dump_yaml`` writes for ``value`` where that is certain (None: ask it).

    Numbers as PyYAML's SafeRepresenter writes them (all match the YAML 1.2 core patterns, so
    they stay plain); strings that start with a letter and contain a ``-`` match no resolver of
    YAML 1.1 or 1.2 and need no quoting (point names ``base-17``). The tests compare this with
    ``dump_yaml`` on many values.
    """
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float and math.isfinite(value):
        text = repr(value).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if type(value) is str and _PLAIN_NAME.fullmatch(value):
        return value
    return None


_Key = tuple[str, str, type, Any]


@dataclass(eq=False)
class _Section:
    """A section's text as pieces; points that share it (by value) share this object."""

    name: str
    keys: list[_Key]
    text: str | None = None


class ConfigTexts:
    """``dump_job_config`` for many configs that share most values, at a fraction of the cost.

    In block YAML without line folding, the text of each top-level key and of each key of a
    section depends on that key and its value alone. So each section starts from the pieces of
    the last section of its name (reused whole when no value differs) and redoes only the keys
    whose values differ, and each distinct (section, key, value) is dumped once: numbers and
    point names directly, the rest in one ``dump_yaml`` call per section. :func:`config_texts`
    checks the result against ``dump_job_config``.
    """

    def __init__(self) -> None:
        self._pieces: dict[_Key, str] = {}
        self._last: dict[str, tuple[type, tuple[Any, ...], _Section]] = {}
        self._getters: dict[type, tuple[list[str], Callable[[Any], tuple[Any, ...]]]] = {}

    def dump(self, configs: Sequence[JobConfig]) -> list[str]:
        """The text of each config, as ``dump_job_config`` writes it."""
        slow: dict[str, dict[_Key, Any]] = {}
        plans: list[list[_Key | _Section]] = []
        for cfg in configs:
            names, values = self._values(cfg)
            parts: list[_Key | _Section] = []
            for name, value in zip(names, values, strict=True):
                if hasattr(value, "__dataclass_fields__"):
                    parts.append(self._section(name, value, slow))
                else:
                    parts.append(self._want("", name, value, slow))
            plans.append(parts)
        for section, missing in slow.items():
            self._dump_missing(section, missing)
        return ["".join(map(self._text, parts)) for parts in plans]

    def _values(self, obj: Any) -> tuple[list[str], tuple[Any, ...]]:
        cls = type(obj)
        if cls not in self._getters:
            names = [f.name for f in dataclasses.fields(obj)]
            get = operator.attrgetter(*names)
            self._getters[cls] = (
                names,
                get if len(names) > 1 else (lambda o: (get(o),)),
            )
        names, getter = self._getters[cls]
        return names, getter(obj)

    def _section(self, name: str, obj: Any, slow: dict[str, dict[_Key, Any]]) -> _Section:
        names, values = self._values(obj)
        last = self._last.get(name)
        if last is not None and last[0] is type(obj) and last[1] == values:
            return last[2]
        if last is None or last[0] is not type(obj):
            keys = [self._want(name, n, v, slow) for n, v in zip(names, values, strict=True)]
        else:
            keys = list(last[2].keys)
            for i, (value, old) in enumerate(zip(values, last[1], strict=True)):
                if value is not old and (type(value) is not type(old) or value != old):
                    keys[i] = self._want(name, names[i], value, slow)
        section = _Section(name, keys)
        self._last[name] = (type(obj), values, section)
        return section

    def _text(self, part: _Key | _Section) -> str:
        if not isinstance(part, _Section):
            return self._pieces[part]
        if part.text is None:
            part.text = f"{part.name}:\n" + "".join(self._pieces[k] for k in part.keys)
        return part.text

    def _want(self, section: str, key: str, value: Any, slow: dict[str, dict[_Key, Any]]) -> _Key:
        ident: _Key = (section, key, type(value), value)
        if ident not in self._pieces:
            text = _scalar_text(value)
            indent = "  " if section else ""
            if text is not None:
                self._pieces[ident] = f"{indent}{key}: {text}\n"
            else:
                dotted = f"{section}.{key}" if section else key
                slow.setdefault(section, {})[ident] = to_plain(value, dotted)
        return ident

    def _dump_missing(self, section: str, missing: Mapping[_Key, Any]) -> None:
        idents = list(missing)
        body = {f"k{i}": missing[ident] for i, ident in enumerate(idents)}
        text = dump_yaml({section: body} if section else body)
        indent = "  " if section else ""
        if section:
            text = text.split("\n", 1)[1]
        chunks = re.split(rf"(?m)^{indent}k(\d+)(?=:)", text)
        # chunks: ["", "0", ": value\n", "1", ": value\n", ...]
        for number, rest in zip(chunks[1::2], chunks[2::2], strict=True):
            ident = idents[int(number)]
            self._pieces[ident] = f"{indent}{ident[1]}{rest}"
