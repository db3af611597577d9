"""The default script written without Jinja2 is byte for byte what ``default.sbatch.j2`` renders.

``render_sbatch(cfg, ctx)`` (no template) goes through
:func:`hpc_ddp.backends.slurm.default_script.render_default_script`; passing the default template's
text makes it render through Jinja2, as a user's ``slurm.template`` is. Both must agree for every
golden case and for a few hundred random configs; a change to the template that is not made to
the renderer too (or the reverse) fails here.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

import pytest

from hpc_ddp.backends.slurm.render import RenderContext, default_template_text, render_sbatch
from hpc_ddp.config.model import (
    ContainerConfig,
    EnvConfig,
    FaultConfig,
    JobConfig,
    RequeueConfig,
    SlurmConfig,
)
from tests.backends.slurm.test_render import CASES, CTX

# Words a config may hold that the shell must take literally: quotes, expansions, globs,
# separators, non-ASCII, a leading dash.
HOSTILE = (
    "plain", "with space", "it's", 'say "hi"', "$HOME", "${X:-y}", "$(id)", "`id`", "a;b",
    "a&&b", "*.py", "~user", "x|y", "-n", "#comment", "ünï", "tab\there", "100%", "a\\b", "",
)  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_golden_case_renders_the_same_without_jinja(case: str) -> None:
    cfg, ctx = CASES[case]
    assert render_sbatch(cfg, ctx) == render_sbatch(cfg, ctx, default_template_text())


def _words(rng: random.Random, most: int) -> tuple[str, ...]:
    return tuple(rng.choice(HOSTILE) for _ in range(rng.randint(0, most)))


def _container(rng: random.Random) -> ContainerConfig | None:
    runtime: Literal["apptainer", "pyxis", "charliecloud"] | None = rng.choice(
        [None, "apptainer", "pyxis", "charliecloud"]
    )
    if runtime is None:
        return None
    binds = tuple(rng.sample(["/scratch", "/data:/data", "/tmp/x", "/a b:/c"], rng.randint(0, 3)))
    if runtime == "apptainer":
        binds = tuple(b + ":ro" if ":" in b else b for b in binds)
    return ContainerConfig(
        runtime=runtime, image=rng.choice(["/img/pt.sif", "nvcr.io#nvidia/pytorch:24.01", "/i j"]),
        binds=binds, options=tuple(f"--opt={w}" for w in _words(rng, 2)),
        python=rng.choice(["python3", "/opt/venv/bin/python", "/o p/python"]),
    )  # fmt: skip


def _config(rng: random.Random) -> JobConfig:
    nodes = rng.randint(1, 4)
    gpus = rng.choice([None, 1, 2, 4])
    slurm = SlurmConfig(
        nodes=nodes,
        min_nodes=rng.choice([None, 1]) if nodes > 1 else None,
        spare_nodes=rng.choice([0, 0, 1, 2]),
        tasks_per_node=gpus or rng.randint(1, 4),
        cpus_per_task=rng.choice([None, 2, 8]),
        gpus_per_node=gpus,
        mem=rng.choice([None, "0", "64G"]),
        time=rng.choice(["30", "2-00:00:00", "01:30:00"]),
        partition=rng.choice([None, "gpu", "debug"]),
        account=rng.choice([None, "proj-1"]),
        qos=rng.choice([None, "high"]),
        constraint=rng.choice([None, "a100&ib"]),
        exclusive=rng.random() < 0.3,
        extra=tuple(rng.sample([("mail-type", "END,FAIL"), ("comment", "lr sweep #3"),
                                ("spread-job", None)], rng.randint(0, 3))),
        srun_args=tuple(f"--comment={w}" for w in _words(rng, 2)),
    )  # fmt: skip
    env = EnvConfig(
        modules=_words(rng, 3),
        setup=tuple(rng.sample(['source "$HOME/venv/bin/activate"', "conda activate ddp",
                                "echo 'set up'"], rng.randint(0, 3))),
        vars=tuple((f"VAR_{i}", w) for i, w in enumerate(_words(rng, 4))),
        container=_container(rng),
    )  # fmt: skip
    return JobConfig(
        name=rng.choice(["job", "lr-sweep", "a.b_c"]),
        slurm=slurm,
        env=env,
        requeue=RequeueConfig(signal=rng.choice(["USR1", "USR2", "SIGUSR1"]),
                              lead_time=rng.choice([60, 300])),
        fault=FaultConfig(enabled=rng.random() < 0.5),
    )  # fmt: skip


def _context(rng: random.Random) -> RenderContext:
    array = rng.choice([None, None, "0-999%8", "0-5", "3,7"])
    return dataclasses.replace(
        CTX,
        # Under /tmp: ch-run shows the host's /tmp, so a charliecloud job may run there.
        run_dir=rng.choice(["/tmp/runs/a-1", "/tmp/runs/x y", "/tmp/r/100%", "/tmp/r/it's"]),
        python=rng.choice(["/venv/bin/python", "/v w/bin/python"]),
        config_source=rng.choice(["jobs/x.yaml", "/a b/job.yaml"]),
        submit_command=rng.choice(["hpc-ddp submit jobs/x.yaml", "hpc-ddp sweep 'a b.yaml'"]),
        array=array,
        array_offset=rng.choice([0, 0, 1000, 4]) if array else 0,
    )


@pytest.mark.parametrize("seed", range(300))
def test_random_configs_render_the_same_without_jinja(seed: int) -> None:
    rng = random.Random(seed)
    cfg, ctx = _config(rng), _context(rng)
    fast = render_sbatch(cfg, ctx)
    assert fast == render_sbatch(cfg, ctx, default_template_text())


def test_the_random_configs_reach_every_branch_of_the_template() -> None:
    """The 300 configs above cover each optional block in both states (else a block's
    rendering could differ unnoticed)."""
    seen: dict[str, set[bool]] = {}
    markers = {
        "module": "\nmodule load ", "setup": "\nconda activate", "vars": "\nexport VAR_0=",
        "offset": "HPC_DDP_ARRAY_OFFSET", "ch_run": "ch-run --cd", "mkdir": "\nmkdir -p",
        "supervisor": "\nexec ", "apptainer": "apptainer exec", "pyxis": "--container-image",
        "range": "--mincpus", "srun_args": "--comment=",
    }  # fmt: skip
    for seed in range(300):
        rng = random.Random(seed)
        cfg, ctx = _config(rng), _context(rng)
        script = render_sbatch(cfg, ctx)
        for name, marker in markers.items():
            seen.setdefault(name, set()).add(marker in script)
        seen.setdefault("spare", set()).add(cfg.slurm.spare_nodes > 0)
    assert {name: states for name, states in seen.items() if states != {True, False}} == {}
