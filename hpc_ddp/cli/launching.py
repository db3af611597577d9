"""Starting a prepared run and telling the user where it went: shared by ``submit`` and
``resume`` so both print, wait and exit the same way."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence

from hpc_ddp.rundir import write_manifest
from hpc_ddp.slurm.submission import Prepared, materialize, record


def submit_local(
    prepared: Prepared, *, wait: bool, as_json: bool, previous_jobs: Sequence[str] = ()
) -> int:
    """Start ``prepared`` as local processes (writing its run dir unless it exists already);
    with ``wait``, follow rank 0's progress and exit 1 unless every rank finished.
    ``previous_jobs``: the run's earlier job ids, kept in its manifest (a resumed run)."""
    from hpc_ddp.local.backend import submit_local as start_local
    from hpc_ddp.local.backend import wait_local
    from hpc_ddp.local.process import unmark_cancelled, was_cancelled

    if not prepared.created:
        prepared = materialize(prepared)
    unmark_cancelled(prepared.paths.root)  # a resumed run's earlier cancel is not this one's
    log = prepared.paths.rank_log(0, "err")
    # Rank 0's progress goes to its stderr (logging), as on Slurm; a resumed run appends to it.
    follow_from = log.stat().st_size if log.exists() else 0
    job = start_local(prepared.cfg, prepared.paths)
    manifest = record(
        prepared, backend="local", job_id=job.job_id, command=["submitit-local", job.job_id]
    )
    if previous_jobs:
        manifest = dataclasses.replace(manifest, previous_jobs=list(previous_jobs))
        write_manifest(prepared.paths, manifest)
    report(prepared, "local", job.job_id, as_json)
    if not wait:
        return 0
    result = wait_local(job, follow=log, follow_from=follow_from)
    cancelled = was_cancelled(prepared.paths.root)
    print(result.describe(cancelled), file=sys.stderr)
    if result.state(cancelled) == "FAILED":
        print(f"  logs: {prepared.paths.logs}/rank-N.err (tracebacks)", file=sys.stderr)
    return 0 if result.state(cancelled) == "COMPLETED" else 1


def report(prepared: Prepared, backend: str, job_id: str | None, as_json: bool) -> None:
    """Print the job id, the run directory and where its logs go (or one JSON object)."""
    logs = prepared.paths.logs
    if as_json:
        print(
            json.dumps(
                {
                    "backend": backend,
                    "job_id": job_id,
                    "run_dir": str(prepared.paths.root),
                    "logs": str(logs),
                }
            )
        )
        return
    print(f"submitted {prepared.cfg.name} as {backend} job {job_id}")
    print(f"  run dir: {prepared.paths.root}")
    print(f"  logs:    {logs}/ (rank-N.out, rank-N.err)")
    print(f"  watch:   hpc-ddp status {prepared.paths.root}")
