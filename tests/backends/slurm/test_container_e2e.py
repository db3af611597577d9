"""``env.container`` (apptainer) on the real two-node dev cluster, through a stub ``apptainer``.

No container runtime can be installed here (Debian 12 ships no apptainer), so the job puts a
stub first on its PATH (``env.setup``): it records its argv, drops ``exec``, the options and the
image exactly as ``apptainer exec`` would consume them, and runs the rest. The rest is the
configured image python (a stub too, running this venv's interpreter), so the job really
trains through the wrapper under real sbatch and srun. The same job asks for ``slurm.mem: 0``
(all of each node's memory) and passes ``--label`` through ``slurm.srun_args``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.backends.slurm.stubs import apptainer_stub
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 12

_IMAGE_PYTHON = """#!/bin/sh
exec {python} "$@"
"""


def _write_stub(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _calls(out: Path) -> list[list[str]]:
    return [p.read_bytes().decode().split("\0")[:-1] for p in sorted(out.glob("apptainer.*"))]


def test_an_apptainer_job_trains_through_the_wrapper(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "calls"
    out.mkdir()
    stubs = tmp_path / "stubs"
    _write_stub(stubs / "apptainer", apptainer_stub(f'"{out}/apptainer.$$.argv"'))
    image_python = _write_stub(
        tmp_path / "image" / "bin" / "python3", _IMAGE_PYTHON.format(python=sys.executable)
    )
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"not really an image")
    binds = [f"{tmp_path}:{tmp_path}", "/etc/hosts:/etc/hosts:ro"]
    config = tmp_path / "container.yaml"
    config.write_text(
        "name: in-a-container\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, mem: 0, srun_args: [--label],"
        " time: '00:05:00'}\n"
        f"env:\n  setup: ['export PATH={stubs}:$PATH']\n"
        '  vars: {OMP_NUM_THREADS: "1"}\n'
        f"  container: {{runtime: apptainer, image: {image}, python: {image_python},"
        f" binds: [{', '.join(binds)}]}}\n"
        f"train: {{epochs: null, max_steps: {STEPS}, synthetic_samples: 256, batch_size: 16,"
        " checkpoint_every: 6, log_every: 1}\n"
    )
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(config))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields

    # Through the wrapper, once per task, with the image's python running hpc-ddp.
    tail = ["-m", "hpc_ddp", "run", str(job.run_dir)]
    expected = ["exec", "--bind", binds[0], "--bind", binds[1], str(image), str(image_python)]
    assert _calls(out) == [[*expected, *tail]] * 2
    [attempt] = e2e.ledger(job.run_dir)
    assert (attempt.cause, attempt.steps_done, attempt.world_size) == (EndCause.FINISHED, STEPS, 2)
    assert e2e.final_digest(slurm_cluster, job.run_dir)[0] == STEPS

    # srun --label: every line a task wrote starts with its task number.
    for rank in (0, 1):
        lines = (job.run_dir / "logs" / f"rank-{rank}.err").read_text().splitlines()
        assert lines, f"rank {rank} logged nothing"
        assert all(line.startswith(f"{rank}: ") for line in lines), lines[:5]

    # mem: 0 is all of each node's memory. Slurm 22.05 accepts it and shows it as
    # MinMemoryNode=0 (a real amount reads e.g. MinMemoryNode=100M). On this CR_CPU cluster,
    # where memory is not a consumable resource, a job without --mem shows 0 too: the script
    # line is what makes the request.
    assert "\n#SBATCH --mem=0\n" in (job.run_dir / "job.sbatch").read_text()
    assert fields["MinMemoryNode"] == "0"
