"""The doctor from the login side: submit the checks (:mod:`hpc_ddp.doctor.exam` on the tasks)
with a job's resources, wait for them, and judge what the ranks reported
(:mod:`hpc_ddp.doctor.judgement`). ``hpc-ddp doctor`` prints what :func:`finish_doctor`
returns.

The doctor's run directories go to ``RUNS_DIR/doctor/``, out of the way of ``status``. Each
doctor job gets a fresh token in its run directory, which every rank must read back: a node
that does not see the shared run directory is caught.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_ddp.backends.base import Cancel
from hpc_ddp.backends.nodelist import parse_nodelist
from hpc_ddp.backends.registry import Registry, registry_of
from hpc_ddp.config.load import (
    find_site_profile,
    job_config_from_dict,
    job_config_to_dict,
    load_job_config,
    load_job_data,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.units import format_slurm_time
from hpc_ddp.config.values import MAX_NAME_CHARS
from hpc_ddp.doctor.judgement import TOKEN_FILE, Finding, culprits, evaluate, read_reports, summary
from hpc_ddp.durable import write_text_atomic
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.submission.submit import (
    Launched,
    choose_backend,
    launch,
    materialize,
    prepare,
    runs_dir_from,
)

ENTRYPOINT = "hpc_ddp.doctor.exam:main"
DOCTOR_DIR = "doctor"
"""Doctor runs go to ``RUNS_DIR/doctor/``, out of the way of ``status``."""
DOCTOR_TIME_S = 600
"""The doctor job's time limit at most (the job's own when shorter): it needs seconds, and a
short limit lets the scheduler backfill it sooner."""
DEFAULT_TIMEOUT_S = 60
COLUMNS = ["node", "rank", "check", "value", "verdict"]


def doctor_config(cfg: JobConfig, *, nodes: int | None, timeout_s: float) -> JobConfig:
    """``cfg``'s job with the checks for its work: the same resources and environment, at most
    :data:`DOCTOR_TIME_S`, every wait bounded by ``timeout_s``, never requeued. Validated as a
    loaded config is, so the tasks read it back without surprise."""
    slurm = dataclasses.replace(
        cfg.slurm,
        nodes=nodes or cfg.slurm.nodes,
        time=format_slurm_time(min(cfg.slurm.time_s, DOCTOR_TIME_S)),
    )
    doctor = dataclasses.replace(
        cfg,
        name=f"doctor-{cfg.name}"[:MAX_NAME_CHARS],
        command=None,
        entrypoint=ENTRYPOINT,
        slurm=slurm,
        dist=dataclasses.replace(cfg.dist, timeout_s=max(1, round(timeout_s))),
        requeue=dataclasses.replace(cfg.requeue, max_requeues=0, on_crash=False),
    )
    return job_config_from_dict(job_config_to_dict(doctor), "the doctor's job")


def _load(config: str | None, overrides: list[str], site_arg: str | None) -> tuple[JobConfig, Path]:
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)  # `hpc-ddp doctor slurm.partition=gpu`: no config file
        config = None
    site = find_site_profile(site_arg, os.environ, Path.home())
    if config is None:
        data = load_job_data({"name": "job"}, overrides, site, source="hpc-ddp doctor")
        return job_config_from_dict(data, "the defaults"), Path.cwd() / "defaults"
    return load_job_config(Path(config), overrides, site_profile=site), Path(config)


@dataclass(frozen=True)
class DoctorJob:
    """A doctor job this process started: what it checks, and the token its ranks read back."""

    launched: Launched
    cfg: JobConfig
    """The doctor's job (:func:`doctor_config`)."""
    token: str
    backends: Registry


def start_doctor(
    config: str | None,
    overrides: Sequence[str] = (),
    *,
    nodes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    backend: str = "auto",
    site: str | None = None,
    runs_dir: str | None = None,
    backends: Registry | None = None,
    invocation: Sequence[str] = (),
) -> DoctorJob:
    """Submit the checks with ``config``'s resources (None: the defaults and the site
    profile; a first ``KEY=VALUE`` in its place is an override), on ``nodes`` nodes (default
    the config's), each wait bounded by ``timeout_s``; under ``runs_dir``'s ``doctor/``;
    through ``backends`` (None: the real ones)."""
    registry = registry_of(backends)
    cfg, config_path = _load(config, list(overrides), site)
    cfg = doctor_config(cfg, nodes=nodes, timeout_s=timeout_s)
    chosen = choose_backend(backend)
    prepared = prepare(
        cfg,
        backend=registry.backend(chosen),
        config_path=config_path,
        runs_dir=runs_dir_from(runs_dir, os.environ) / DOCTOR_DIR,
        python=sys.executable,
        invocation=list(invocation),
    )
    prepared = materialize(prepared)
    token = secrets.token_hex(16)  # each node must read it back: the run dir is shared
    prepared.paths.doctor.mkdir(parents=True, exist_ok=True)
    write_text_atomic(prepared.paths.doctor / TOKEN_FILE, token + "\n")
    return DoctorJob(launch(prepared), cfg, token, registry)


@dataclass(frozen=True)
class DoctorResult:
    """What the doctor found: ``hpc-ddp doctor``'s table and summary line."""

    job: DoctorJob
    findings: list[Finding]
    summary: str

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(f.passed for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """``hpc-ddp doctor --json`` (schema ``hpc-ddp.doctor/1``)."""
        from hpc_ddp.output import DOCTOR

        launched, findings = self.job.launched, self.findings
        return {
            "schema": DOCTOR,
            "ok": self.ok,
            "summary": self.summary,
            "culprits": {
                node: list(dict.fromkeys(f.check for f in rows))
                for node, rows in culprits(findings).items()
            },
            "backend": launched.prepared.backend,
            "job_id": launched.job_id,
            "run_dir": str(launched.paths.root),
            "findings": [f.to_dict() for f in findings],
        }


def finish_doctor(job: DoctorJob) -> DoctorResult:
    """Wait for the doctor job and judge what its ranks reported (a rank that left none is
    named, with srun's word on it when there is one)."""
    launched, ntasks = job.launched, job.cfg.slurm.ntasks
    missing = _wait(job)
    reports = read_reports(launched.paths.doctor, ntasks)
    findings = evaluate(reports, ntasks, token=job.token, missing=missing)
    shown_nodes = list(dict.fromkeys(r.node for r in sorted(reports, key=lambda r: r.rank)))
    return DoctorResult(job, findings, summary(findings, shown_nodes))


def _wait(job: DoctorJob) -> dict[int, tuple[str, str]]:
    """Wait for the doctor job; for ranks that may have left no report, (node, why)."""
    from hpc_ddp.submission.wait import wait_for_jobs

    launched = job.launched
    backend = launched.prepared.face
    try:
        if launched.local is not None:
            return _wait_local(job)
        wait_for_jobs(job.backends, [launched.job_id])
    except KeyboardInterrupt:
        # A doctor nobody waits for is of no use to anyone: do not leave it queued.
        if launched.local is None:
            paths = launched.paths
            plan = Cancel(paths.root, paths.manifest, (launched.job_id,), "job")
            with contextlib.suppress(HpcDdpError):  # best effort: only adds detail
                backend.cancel(plan)
        raise
    return _slurm_missing(job)


def _wait_local(job: DoctorJob) -> dict[int, tuple[str, str]]:
    """Wait for a doctor job this process holds (a local one): each task's outcome."""
    launched = job.launched
    backend, root = launched.prepared.backend, launched.paths.root
    result = job.backends.held(backend, launched.local, root, launched.job_id).wait()
    host = socket.gethostname()
    return {o.rank: (host, o.detail) for o in result.outcomes if not o.ok}


def _slurm_missing(job: DoctorJob) -> dict[int, tuple[str, str]]:
    """Where each rank ran (the job's nodes, block distribution), and srun's word on the first
    task that failed."""
    launched, cfg = job.launched, job.cfg
    nodes: list[str] = []
    with contextlib.suppress(HpcDdpError):  # best effort: only adds detail
        backend = job.backends.backend("slurm")
        info = backend.states([launched.job_id]).get(launched.job_id)
        if info is not None and info.nodes:
            nodes = parse_nodelist(info.nodes)
    per_node = cfg.slurm.tasks_per_node
    out = {
        rank: (nodes[rank // per_node] if rank // per_node < len(nodes) else "?", "")
        for rank in range(cfg.slurm.ntasks)
    }
    failure = job.backends.postmortem("slurm").failed_rank(launched.paths.logs)
    if failure is not None:
        out[failure.rank] = (failure.node, f"srun: {failure.reason}")
    return out


def findings_text(findings: Sequence[Finding]) -> str:
    """The findings as ``hpc-ddp doctor`` prints them: a table, then each note."""
    from tabulate import tabulate

    rows = [
        [f.node, "" if f.rank is None else f.rank, f.check, f.value, f.verdict] for f in findings
    ]
    lines = [tabulate(rows, headers=COLUMNS, tablefmt="plain", disable_numparse=True)]
    notes = [f for f in findings if f.note]
    if notes:
        lines.append("")
    for f in notes:
        who = f.node if f.rank is None else f"{f.node} rank {f.rank}"
        lines.append(f"{f.verdict:>4}  {who} {f.check}: {f.note}")
    return "\n".join(lines)
