"""``hpc-ddp supervise RUN_DIR -- srun ...``: the batch script's supervisor (``fault:``).

The rendered ``job.sbatch`` ``exec``s it with the step's srun command after ``--``; it runs that
command as one launch after another (:class:`~hpc_ddp.fault.supervisor.Supervisor`), each an srun
step of this allocation (the launcher and the job's identity come from the node side's registry,
:func:`~hpc_ddp.backends.node_registry.launcher_for`, over the clients of the registry every
verb is handed, ``args.backends``). Not for people to type."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hpc_ddp.exitcodes import NOT_CURRENT_EXIT_CODE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.add_argument("run_dir", help="the run (or sweep) directory written by submit")
    parser.add_argument(
        "srun_argv", nargs=argparse.REMAINDER, help="-- srun [OPTIONS] PYTHON -m hpc_ddp run ..."
    )


def run(args: argparse.Namespace) -> int:
    """Supervise this attempt of the job; its exit status is the job's."""
    from hpc_ddp.backends.node_registry import launcher_for
    from hpc_ddp.config.load import load_resolved_config
    from hpc_ddp.fault.launch_ledger import Identity
    from hpc_ddp.fault.supervisor import Supervisor
    from hpc_ddp.job.task import not_current_refusal, task_run_dir, write_task_config
    from hpc_ddp.rundir.layout import RunPaths

    env = os.environ
    argv = list(args.srun_argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    run_dir = Path(args.run_dir)
    task_dir = task_run_dir(run_dir, env)
    refusal = not_current_refusal(run_dir, task_dir, env)
    if refusal is not None:
        print(f"hpc-ddp supervise: refused: {refusal}", file=sys.stderr, flush=True)
        return NOT_CURRENT_EXIT_CODE
    write_task_config(run_dir, task_dir)
    logging.getLogger("hpc_ddp").setLevel(logging.INFO)
    cfg = load_resolved_config(RunPaths(task_dir).config)
    allocation, launcher = launcher_for(env, argv, clients=args.backends.client)
    job = allocation.identity()
    me = Identity(job.job_id, job.job_ref, job.restart_count)
    supervisor = Supervisor(RunPaths(task_dir), cfg, launcher, me, env=env)
    supervisor.install_signals()
    return supervisor.run()
