"""``hpc-ddp doctor [CONFIG] [KEY=VALUE ...] [--nodes N]``: check an allocation before training.

A short job on the resources a job would get (its partition, account, GPUs, tasks per node,
modules, setup lines and container: from CONFIG, your site profile and the overrides, else the
built-in defaults) in which every task reports what it would really run with and the nodes
test each other: the master port, the clock, the run directory's file system and the
all-reduce bandwidth (:mod:`hpc_ddp.doctor.exam` on the tasks, :mod:`hpc_ddp.doctor.judgement`
judging). It prints one table (node, rank, check, value, verdict), the notes behind each verdict
and a line that names the slow or broken node.

The doctor job is CONFIG's job with its training replaced by the checks, a time limit of at
most :data:`DOCTOR_TIME_S` and no requeue, launched like ``submit`` launches (prepare, launch,
wait) into ``RUNS_DIR/doctor/doctor-<name>-<stamp>`` (``status`` does not list it; its logs stay
there). Without Slurm the same checks run in N local processes.

Exit codes: 0 every check passed, 1 a check failed or was slow (or the job did not finish),
2 a usage or config error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hpc_ddp.backends.slurm.client import SlurmClient
from hpc_ddp.cli.options import add_backend_option, add_site_option
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
from hpc_ddp.errors import ConfigError, HpcDdpError
from hpc_ddp.rundir.layout import RUNS_DIR_ENV
from hpc_ddp.submission.submit import (
    Launched,
    choose_backend,
    launch,
    materialize,
    prepare,
    runs_dir_from,
)
from hpc_ddp.submission.wait import wait_for_jobs

ENTRYPOINT = "hpc_ddp.doctor.exam:main"
DOCTOR_DIR = "doctor"
"""Doctor runs go to ``RUNS_DIR/doctor/``, out of the way of ``status``."""
DOCTOR_TIME_S = 600
"""The doctor job's time limit at most (the job's own when shorter): it needs seconds, and a
short limit lets the scheduler backfill it sooner."""
DEFAULT_TIMEOUT_S = 60
COLUMNS = ["node", "rank", "check", "value", "verdict"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument(
        "config",
        nargs="?",
        help="job config whose resources to check (default: the built-in defaults and your "
        "site profile)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="e.g. slurm.partition=gpu"
    )
    parser.add_argument("--nodes", type=int, help="nodes to check (default: the config's)")
    add_backend_option(parser)
    add_site_option(parser)
    parser.add_argument(
        "--runs-dir", help=f"runs directory; the doctor writes under its doctor/ (${RUNS_DIR_ENV})"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds any one check may wait for the other ranks (default {DEFAULT_TIMEOUT_S})",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")


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


def _load(args: argparse.Namespace) -> tuple[JobConfig, Path]:
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)  # `hpc-ddp doctor slurm.partition=gpu`: no config file
        config = None
    site = find_site_profile(args.site, os.environ, Path.home())
    if config is None:
        data = load_job_data({"name": "job"}, overrides, site, source="hpc-ddp doctor")
        return job_config_from_dict(data, "the defaults"), Path.cwd() / "defaults"
    return load_job_config(Path(config), overrides, site_profile=site), Path(config)


def run(args: argparse.Namespace) -> int:
    """Run the doctor job, print its findings; 0 when every check passed."""
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes} is not a node count. HINT: use 1 or more.")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout:g} is not positive. HINT: e.g. --timeout 60.")
    cfg, config_path = _load(args)
    cfg = doctor_config(cfg, nodes=args.nodes, timeout_s=args.timeout)
    sbatch = shutil.which("sbatch") if args.backend == "auto" else None
    backend = choose_backend(args.backend, sbatch)
    client: SlurmClient = args.slurm
    prepared = prepare(
        cfg,
        backend=backend,
        config_path=config_path,
        runs_dir=runs_dir_from(args.runs_dir, os.environ) / DOCTOR_DIR,
        python=sys.executable,
        invocation=["hpc-ddp", "doctor", *sys.argv[2:]],
    )
    prepared = materialize(prepared)
    token = secrets.token_hex(16)  # each node must read it back: the run dir is shared
    prepared.paths.doctor.mkdir(parents=True, exist_ok=True)
    write_text_atomic(prepared.paths.doctor / TOKEN_FILE, token + "\n")
    launched = launch(prepared, client)
    ntasks, nodes = cfg.slurm.ntasks, cfg.slurm.nodes
    print(
        f"doctor: {backend} job {launched.job_id}, {ntasks} rank(s) on {nodes} node(s); "
        f"run dir {launched.paths.root}",
        file=sys.stderr,
    )
    missing = _wait(launched, client, cfg)
    reports = read_reports(launched.paths.doctor, ntasks)
    findings = evaluate(reports, ntasks, token=token, missing=missing)
    shown_nodes = list(dict.fromkeys(r.node for r in sorted(reports, key=lambda r: r.rank)))
    line = summary(findings, shown_nodes)
    if args.json:
        print(json.dumps(_as_json(launched, findings, line)))
    else:
        _print_table(findings)
        print(line)
    return 0 if all(f.passed for f in findings) else 1


def _wait(launched: Launched, client: SlurmClient, cfg: JobConfig) -> dict[int, tuple[str, str]]:
    """Wait for the doctor job; for ranks that may have left no report, (node, why)."""
    try:
        if launched.local is not None:
            return _wait_local(launched)
        wait_for_jobs(client, [launched.job_id])
    except KeyboardInterrupt:
        # A doctor nobody waits for is of no use to anyone: do not leave it queued.
        if launched.local is None:
            with contextlib.suppress(HpcDdpError):  # best effort: only adds detail
                client.cancel(launched.job_id)
        raise
    return _slurm_missing(launched, client, cfg)


def _wait_local(launched: Launched) -> dict[int, tuple[str, str]]:
    from hpc_ddp.backends.local.backend import wait_local

    result = wait_local(launched.local)
    host = socket.gethostname()
    return {o.rank: (host, o.detail) for o in result.outcomes if not o.ok}


def _slurm_missing(
    launched: Launched, client: SlurmClient, cfg: JobConfig
) -> dict[int, tuple[str, str]]:
    """Where each rank ran (the job's nodes, block distribution), and srun's word on the first
    task that failed."""
    from hpc_ddp.backends.slurm.nodelist import parse_nodelist
    from hpc_ddp.backends.slurm.postmortem import failed_rank

    nodes: list[str] = []
    with contextlib.suppress(HpcDdpError):  # best effort: only adds detail
        info = client.job_states([launched.job_id]).get(launched.job_id)
        if info is not None and info.nodes:
            nodes = parse_nodelist(info.nodes)
    per_node = cfg.slurm.tasks_per_node
    out = {
        rank: (nodes[rank // per_node] if rank // per_node < len(nodes) else "?", "")
        for rank in range(cfg.slurm.ntasks)
    }
    failure = failed_rank(launched.paths.logs)
    if failure is not None:
        out[failure.rank] = (failure.node, f"srun: {failure.reason}")
    return out


def _print_table(findings: list[Finding]) -> None:
    rows = [
        [f.node, "" if f.rank is None else f.rank, f.check, f.value, f.verdict] for f in findings
    ]
    print(tabulate(rows, headers=COLUMNS, tablefmt="plain", disable_numparse=True))
    notes = [f for f in findings if f.note]
    if notes:
        print()
    for f in notes:
        who = f.node if f.rank is None else f"{f.node} rank {f.rank}"
        print(f"{f.verdict:>4}  {who} {f.check}: {f.note}")


def _as_json(launched: Launched, findings: list[Finding], line: str) -> dict[str, Any]:
    from hpc_ddp.output import DOCTOR

    return {
        "schema": DOCTOR,
        "ok": all(f.passed for f in findings),
        "summary": line,
        "culprits": {
            node: list(dict.fromkeys(f.check for f in rows))
            for node, rows in culprits(findings).items()
        },
        "backend": launched.prepared.backend,
        "job_id": launched.job_id,
        "run_dir": str(launched.paths.root),
        "findings": [f.to_dict() for f in findings],
    }
