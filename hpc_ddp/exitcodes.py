"""Every exit status hpc-ddp gives a task, a supervisor or a job on purpose, declared once. Pure.

Slurm records a job by its batch script's exit status (the supervisor's under ``fault:``, else
srun's: the highest of its tasks'), so each outcome that is not a plain success or a Python
crash (1) has its own number, and the supervisor tells a task's own outcome from a fault by it.
128 + N is a death by signal N (the shell's convention), never one of these.
"""

from __future__ import annotations

REQUEUE_EXIT_CODE = 0
"""A stop handled on purpose: the state safely on disk, the job requeued (or Slurm requeueing
it)."""
BUDGET_EXIT_CODE = 3
"""The run's requeue budget ran out: Slurm records the job as FAILED."""
REQUEUE_FAILED_EXIT_CODE = 4
"""An attempt needed a requeue and did not get one: ``scontrol requeue`` failed, or (after a
SIGTERM) Slurm could not be asked whether it is requeueing the job. Slurm records the job FAILED,
unless it requeues or cancels the job itself."""
NOT_CURRENT_EXIT_CODE = 5
"""A task whose job is not its run's current job: it started nothing and wrote nothing (no
ledger entry, metric, checkpoint or rendezvous file), so Slurm records that job FAILED and the
run's own job goes on alone."""
NO_PROGRESS_EXIT_CODE = 6
"""The supervisor stopped a crash loop: ``fault.no_progress_limit`` launches in a row ended by a
fault without a newer checkpoint. The job ends FAILED and is not requeued."""
FAULT_EXIT_CODE = 7
"""A rank whose watchdog declared a fault (a peer stopped beating, its own phase ran past its
deadline) and ended its own process after dumping its stacks."""
PEER_FAULT_EXIT_CODE = 8
"""A rank that ended because another rank or the supervisor declared a fault in this launch."""

OWN_OUTCOMES = frozenset({REQUEUE_EXIT_CODE, BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE})
"""A task's exit statuses that are outcomes it recorded itself, not failures."""
