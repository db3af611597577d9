"""The Slurm backend's login face (:class:`~hpc_ddp.backends.base.Backend`): a run is a batch
script rendered into its run directory and submitted with ``sbatch``; Slurm's queue and
accounting say what became of it.

Every command goes through the :class:`~hpc_ddp.backends.slurm.client.SlurmClient` given (tests
inject one over :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`), else a real one made on the
first command: a plan (the dry run) asks Slurm nothing and never loads the client.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.backends.base import (
    Cancel,
    Cancelled,
    Grace,
    PlanRequest,
    Started,
    SubmitPlan,
    Word,
)
from hpc_ddp.backends.slurm.render import (
    RenderContext,
    load_template,
    render_sbatch,
    sbatch_command,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.version import __version__

if TYPE_CHECKING:  # a dry run never loads the client, its parsers nor the manifest's reader
    from hpc_ddp.backends.catalog import BackendName
    from hpc_ddp.backends.jobs import AccountingRecord, JobInfo
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.rundir.manifest import Manifest


class SlurmBackend:
    """Runs go to Slurm through ``client`` (None: the real commands, made when first needed)."""

    def __init__(self, client: SlurmClient | None = None) -> None:
        self._client = client

    @property
    def name(self) -> BackendName:
        """``slurm``."""
        return "slurm"

    @property
    def ledger_since_submit(self) -> bool:
        """False: a rank may still write its end a moment after Slurm has called the job
        FAILED (seen on 22.05), so earlier entries are read too."""
        return False

    @property
    def client(self) -> SlurmClient:
        """The client every command goes through."""
        if self._client is None:
            from hpc_ddp.backends.slurm.client import SlurmClient

            self._client = SlurmClient()
        return self._client

    # --- plan and start ---------------------------------------------------------------------

    def plan(self, cfg: JobConfig, paths: RunPaths, request: PlanRequest) -> SubmitPlan:
        """The batch script for ``paths`` and the sbatch command that submits it."""
        template = load_template(cfg, request.config_path.parent)
        return self._render(cfg, paths, request, template)

    def moved(self, plan: SubmitPlan, cfg: JobConfig, paths: RunPaths) -> SubmitPlan:
        """The script rendered again for ``paths``, from the template text read once."""
        return self._render(cfg, paths, plan.request, plan.template)

    @staticmethod
    def _render(
        cfg: JobConfig, paths: RunPaths, request: PlanRequest, template: str | None
    ) -> SubmitPlan:
        argv = tuple(sbatch_command(paths.script))
        ctx = RenderContext(
            run_dir=str(paths.root),
            python=request.python,
            config_source=str(request.config_path),
            submit_command=f"{request.invocation}  ->  {shlex.join(argv)}",
            generated_at=request.generated_at,
            version=__version__,
            exclude=request.exclude,
        )
        script = render_sbatch(cfg, ctx, template_text=template)
        summary = f"# backend: slurm; would run: {' '.join(argv)}"
        return SubmitPlan(script, argv, summary, request, template)

    def check(self, cfg: JobConfig) -> None:
        """Nothing to check here: Slurm's ``sbatch`` says what it refuses."""
        del cfg

    def start(self, cfg: JobConfig, paths: RunPaths) -> Started:
        """``sbatch --parsable`` of the run's script."""
        del cfg
        result = self.client.submit(paths.script)
        return Started(result.job_id or "", result.command)

    def test_only(self, paths: RunPaths) -> str:
        """``sbatch --test-only``: Slurm's word on whether and when the job would start."""
        return self.client.submit(paths.script, test_only=True).message

    # --- what Slurm says ------------------------------------------------------------------

    def job_refs(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """Every Slurm job of a run: its job id, and for a sweep each of its job arrays.

        Each must be a job id (``123``): anything else is a :class:`RunDirError` naming the
        manifest, which is damaged; no Slurm command may ever be run with it.
        """
        from hpc_ddp.backends.slurm.jobstate import check_job_ref

        jobs = [manifest.job_id] if manifest.job_id is not None else []
        source = str(RunPaths(run_dir).manifest)
        return [check_job_ref(j, source) for j in dict.fromkeys([*jobs, *manifest.array_jobs])]

    def states(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """squeue's rows of the jobs it still holds
        (:meth:`~hpc_ddp.backends.slurm.client.SlurmClient.job_states`)."""
        return self.client.job_states(job_ids)

    def partition_nodes(self, partition: str | None) -> tuple[str, list[str]] | None:
        """(the partition, its nodes): ``partition``, else the cluster's default one
        (:class:`~hpc_ddp.errors.SlurmError` when Slurm cannot be asked)."""
        from hpc_ddp.errors import SlurmError

        name = partition or self.client.default_partition()
        if name is None:
            raise SlurmError("sinfo names no default partition")
        return name, self.client.partition_nodes(name)

    def preemption_grace(self, partition: str | None, qos: str | None) -> Grace | None:
        """From a preemption's SIGTERM to its SIGKILL: the partition's ``GraceTime`` (the QOS's
        under ``PreemptType=preempt/qos``) plus ``KillWait``; None where Slurm preempts
        nothing (``preempt/none``) or the partition's ``PreemptMode`` is ``OFF``."""
        from hpc_ddp.backends.slurm.jobstate import parse_seconds
        from hpc_ddp.errors import SlurmError

        config = self.client.config_fields()
        kind = config.get("PreemptType", "preempt/none")
        if kind.endswith("/none"):
            return None
        kill_wait = parse_seconds(config.get("KillWait", "0"))
        if kind.endswith("/qos") and qos:
            return Grace(self.client.qos_grace_s(qos), kill_wait, f"QOS {qos}")
        name = partition or self.client.default_partition()
        if name is None:
            raise SlurmError("sinfo names no default partition")
        fields = self.client.partition_fields(name)
        mode = fields.get("PreemptMode") or config.get("PreemptMode", "OFF")
        if mode.upper().startswith("OFF"):
            return None
        return Grace(parse_seconds(fields.get("GraceTime", "0")), kill_wait, f"partition {name}")

    def max_array_size(self) -> int:
        """The cluster's ``MaxArraySize``: a job array's task ids must stay below it
        (:class:`~hpc_ddp.errors.SlurmError` when Slurm cannot be asked)."""
        return self.client.max_array_size()

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord] | None:
        """sacct's records of the jobs; None without accounting."""
        return self.client.sacct_states(job_ids)

    def cancel_ids(self, run_dir: Path, manifest: Manifest) -> list[str]:
        """:meth:`job_refs`; a run with none was never submitted, and is refused."""
        jobs = self.job_refs(run_dir, manifest)  # raises for an id that is no job id
        if not jobs:
            raise RunDirError(
                f"{run_dir}: the manifest has no job id; nothing to cancel. HINT: the job was "
                "never submitted; check `hpc-ddp status` or submit it again."
            )
        return jobs

    def cancel(self, plan: Cancel, *, kill_wait_s: float | None = None) -> Cancelled:
        """``scancel`` of each live job of ``plan`` that runs a script of the run
        (:func:`~hpc_ddp.backends.slurm.cancel.cancel_jobs`); Slurm's ``KillWait`` does the
        rest."""
        from hpc_ddp.backends.slurm.cancel import cancel_jobs

        del kill_wait_s
        return cancel_jobs(self.client, plan)

    def word(self, run_dir: Path, job_id: str) -> Word | None:
        """None: Slurm's word comes from the queue, asked once for many runs."""
        del run_dir, job_id
        return None

    def settled(self, run_dir: Path, job_id: str) -> bool:
        """True: nothing of the job runs here, and Slurm's ended state says it has ended."""
        del run_dir, job_id
        return True

    def startup_failure(self, run_dir: Path, job_id: str | None) -> str | None:
        """What the logs say (srun's lines, the ranks' and the batch script's errors)."""
        from hpc_ddp.backends.slurm.postmortem import startup_failure

        del job_id
        return startup_failure(RunPaths(run_dir).logs)

    def running(self, run_dir: Path, job_id: str | None, source: str) -> tuple[bool | None, str]:
        """(True, ``job 12 is PENDING``) while squeue holds the job unfinished."""
        from hpc_ddp.backends.slurm.jobstate import check_job_ref

        del run_dir
        ref = check_job_ref(job_id, source)
        info = self.client.job_states([ref]).get(ref)
        if info is None or info.state.finished:
            return False, ""
        return True, f"job {ref} is {info.state.value}"
