"""Tests of the sbatch renderer: golden scripts, and proof with the real parsers that no value can
escape its quoting.

- Golden files in ``tests/golden/<case>.sbatch`` pin the rendered script of each case in
  ``CASES``. After an intended change, regenerate them with ``UPDATE_GOLDEN=1 pytest
  tests/backends/slurm/test_render.py`` and review the diff.
- Bash proof: the script runs under real ``bash`` with ``srun``, ``module`` and ``apptainer``
  replaced by stub executables on PATH that write their argv (NUL-separated) and environment to
  files; the test asserts the argv arrived exactly as configured and that no sentinel file from
  a hostile value was created.
- sbatch proof: real ``sbatch -vvv --test-only`` (skipped where sbatch is not installed) parses the
  script's #SBATCH lines against a slurm.conf whose controller is a closed port on loopback, so
  nothing is submitted; the test compares the arguments sbatch reports it found.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_ddp.backends.slurm.render import (
    RenderContext,
    default_template_text,
    format_sbatch_line,
    launcher_argv,
    load_template,
    render_sbatch,
    sbatch_flags,
    srun_args,
    task_python,
)
from hpc_ddp.config.model import (
    ContainerConfig,
    EnvConfig,
    FaultConfig,
    JobConfig,
    RequeueConfig,
    SlurmConfig,
)
from hpc_ddp.errors import ConfigError, RenderError
from tests.backends.slurm.stubs import apptainer_stub

GOLDEN_DIR = Path(__file__).parents[2] / "golden"
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")

CTX = RenderContext(
    run_dir="/scratch/alice/runs/demo-20260101-120000",
    python="/home/alice/.venvs/ddp/bin/python",
    config_source="jobs/demo.yaml",
    submit_command="hpc-ddp submit jobs/demo.yaml",
    generated_at="2026-01-01T12:00:00+00:00",
    version="0.1.0",
)

CASES: dict[str, tuple[JobConfig, RenderContext]] = {
    "cpu_one_node": (JobConfig(name="quickstart", slurm=SlurmConfig(time="30")), CTX),
    # fault.enabled: false: one srun step that ends itself when a task fails, no supervisor.
    "unsupervised": (
        JobConfig(name="plain", slurm=SlurmConfig(time="30"), fault=FaultConfig(enabled=False)),
        CTX,
    ),
    # Three nodes allocated, the steps use two: a restart after a fault has a node to spare.
    "spare_node": (
        JobConfig(name="spare", slurm=SlurmConfig(nodes=2, spare_nodes=1, time="30")),
        CTX,
    ),
    "gpu_two_nodes": (
        JobConfig(
            name="resnet18-cifar10",
            slurm=SlurmConfig(
                nodes=2, tasks_per_node=4, cpus_per_task=8, gpus_per_task=1, mem="64G",
                time="2-00:00:00",
            ),
            env=EnvConfig(vars=(("NCCL_DEBUG", "WARN"), ("OMP_NUM_THREADS", "8"))),
            requeue=RequeueConfig(signal="USR1", lead_time=300),
        ),
        CTX,
    ),
    "apptainer": (
        JobConfig(
            name="in-a-container",
            slurm=SlurmConfig(nodes=2, gpus_per_node=4, tasks_per_node=4, time="04:00:00"),
            env=EnvConfig(
                container=ContainerConfig(
                    runtime="apptainer", image="/images/pytorch-24.01.sif",
                    binds=("/data:/data:ro", "/scratch"), options=("--cleanenv",),
                    python="/opt/conda/bin/python",
                ),
            ),
        ),
        CTX,  # its login-node python is not in the image: the container's python runs
    ),
    "pyxis": (
        JobConfig(
            name="pyxis",
            slurm=SlurmConfig(nodes=1, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12),
            env=EnvConfig(
                container=ContainerConfig(
                    runtime="pyxis", image="nvcr.io#nvidia/pytorch:24.01-py3",
                    binds=("/data:/data", "/scratch:/scratch"),
                    options=("--container-writable", "--no-container-mount-home"),
                    python="python3.11",
                ),
            ),
        ),
        CTX,
    ),
    "charliecloud": (
        JobConfig(
            name="ch-run",
            slurm=SlurmConfig(nodes=2, tasks_per_node=2, gpus_per_node=2, time="08:00:00"),
            env=EnvConfig(
                container=ContainerConfig(
                    runtime="charliecloud", image="/scratch/alice/images/pytorch-24.01",
                    binds=("/scratch", "/data/imagenet:/data"),
                    options=("--set-env=NCCL_DEBUG=WARN",), python="/opt/venv/bin/python",
                ),
            ),
        ),
        CTX,  # the run dir is under /scratch, bound at the same path
    ),
    "array": (
        JobConfig(name="lr-sweep", slurm=SlurmConfig(nodes=2, cpus_per_task=2, time="90")),
        dataclasses.replace(
            CTX,
            run_dir="/scratch/alice/sweeps/lr-sweep-20260101-120000",
            array="0-5%2",
            submit_command="hpc-ddp sweep jobs/demo.yaml sweeps/lr.yaml",
        ),
    ),
    "site_profile": (
        JobConfig(
            name="site-job",
            slurm=SlurmConfig(
                nodes=4, tasks_per_node=4, cpus_per_task=16, gpus_per_node=4, mem="480G",
                time="1-12:00:00", partition="gpu-a100", account="proj-1234", qos="high",
                constraint="a100&ib", exclusive=True,
                extra=(("mail-type", "END,FAIL"), ("comment", "lr sweep #3, take 2"),
                       ("spread-job", None)),
                srun_args=("--mpi=none", "--distribution=block:block", "--comment=lr sweep #3"),
            ),
            env=EnvConfig(
                modules=("gcc/12.2.0", "cuda/12.1", "openmpi/4.1.5"),
                setup=('source "$HOME/venvs/ddp/bin/activate"', "conda activate ddp"),
                vars=(("NCCL_IB_DISABLE", "0"), ("NCCL_SOCKET_IFNAME", "ib0,^lo")),
            ),
        ),
        CTX,
    ),
}  # fmt: skip


# --- golden files -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    cfg, ctx = CASES[case]
    script = render_sbatch(cfg, ctx)
    golden = GOLDEN_DIR / f"{case}.sbatch"
    if UPDATE_GOLDEN:
        golden.write_text(script, encoding="utf-8")
    assert golden.exists(), f"missing {golden}; create it with UPDATE_GOLDEN=1"
    assert script == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_runs_srun_with_the_intended_argv(case: str, tmp_path: Path) -> None:
    cfg, ctx = CASES[case]
    calls = run_with_stubs(render_sbatch(cfg, ctx), tmp_path, {"SLURM_ARRAY_TASK_ID": "4"})
    python = task_python(cfg, ctx)
    launcher = launcher_argv(cfg, workdir=str(tmp_path))  # the job's working directory
    expected = [*srun_args(cfg, ctx), *launcher, python, "-m", "hpc_ddp", "run"]
    assert calls.argv("srun") == [*expected, ctx.run_dir]
    assert calls.returncode == 0
    if cfg.fault.enabled:
        # The batch shell execs the supervisor, which runs the srun line given after `--`.
        supervise = ["-m", "hpc_ddp", "supervise", ctx.run_dir, "--", "srun"]
        assert calls.argv("python") == [*supervise, *expected, ctx.run_dir]
        assert f"exec {shlex.quote(ctx.python)} -m hpc_ddp supervise" in render_sbatch(cfg, ctx)
        assert "--kill-on-bad-exit=1" not in calls.argv("srun")  # the supervisor ends steps
    else:
        assert not (tmp_path / "calls" / "python.argv").exists()
        assert calls.argv("srun")[0] == "--kill-on-bad-exit=1"
    if cfg.env.modules:
        assert calls.argv("module") == ["load", *cfg.env.modules]
    if cfg.env.setup:
        assert calls.argv("conda") == ["activate", "ddp"]
        assert calls.env("srun")["VIRTUAL_ENV"] == f"{tmp_path}/venvs/ddp"
    env = calls.env("srun")
    assert env["PYTHONUNBUFFERED"] == "1"
    assert all(env[k] == v for k, v in cfg.env.vars)
    if cfg.env.container and cfg.env.container.runtime == "charliecloud":
        assert env["USER"]  # ch-run will not start without it; the stubs' environment has none
    else:
        assert "USER" not in env
    if ctx.array:
        assert env["HPC_DDP_RUN_DIR"] == f"{ctx.run_dir}/tasks/4"
        assert "HPC_DDP_SWEEP_DIR" not in env  # written once, never read: dropped
        # Submit made no task logs/ (sweeps submit faster): the script makes it before srun.
        assert calls.argv("mkdir") == ["-p", f"{ctx.run_dir}/tasks/4/logs"]
    else:
        assert env["HPC_DDP_RUN_DIR"] == ctx.run_dir
        assert not (tmp_path / "calls" / "mkdir.argv").exists()


@pytest.mark.usefixtures("slurm_commands")
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_sbatch_reads_exactly_our_flags(case: str, tmp_path: Path) -> None:
    cfg, ctx = CASES[case]
    found = sbatch_parse(render_sbatch(cfg, ctx), tmp_path)
    assert found == expected_sbatch_args(cfg, ctx)


# --- flags --------------------------------------------------------------------------------------


def test_flags_are_sorted_and_always_requeue_append_and_signal_the_tasks() -> None:
    cfg, ctx = CASES["site_profile"]
    flags = sbatch_flags(cfg, ctx)
    assert [name for name, _ in flags] == sorted(name for name, _ in flags)
    as_dict = dict(flags)
    assert as_dict["requeue"] is None
    assert as_dict["open-mode"] == "append"
    # No `B:`: the signal must reach the step's tasks, which set the stop flag.
    assert as_dict["signal"] == "USR2@120"
    assert as_dict["exclusive"] is None
    assert as_dict["spread-job"] is None
    assert as_dict["time"] == "1-12:00:00"


@pytest.mark.parametrize(
    ("given", "rendered"),
    [("30", "00:30:00"), ("90", "01:30:00"), ("1-0", "1-00:00:00"), ("36:00:00", "1-12:00:00")],
)
def test_time_is_rendered_in_canonical_form(given: str, rendered: str) -> None:
    cfg = JobConfig(name="t", slurm=SlurmConfig(time=given))
    assert dict(sbatch_flags(cfg, CTX))["time"] == rendered


def test_invalid_time_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        sbatch_flags(JobConfig(name="t", slurm=SlurmConfig(time="1:75:00")), CTX)


def test_log_paths_for_runs_and_arrays_and_percent_in_run_dir() -> None:
    cfg = JobConfig(name="t")
    single = dict(sbatch_flags(cfg, dataclasses.replace(CTX, run_dir="/r/100%")))
    assert single["output"] == "/r/100%%/logs/batch-%j.out"
    assert single["error"] == "/r/100%%/logs/batch-%j.err"
    array = dict(sbatch_flags(cfg, dataclasses.replace(CTX, run_dir="/s", array="0-3")))
    # An array's batch logs go to the sweep's logs/ (which submit makes once), the task's
    # rank logs to its own logs/ (which the script makes).
    assert array["output"] == "/s/logs/batch-%A_%a.out"
    assert array["error"] == "/s/logs/batch-%A_%a.err"
    offset = dataclasses.replace(CTX, run_dir="/s%", array="0-3", array_offset=2000)
    assert dict(sbatch_flags(cfg, offset))["output"] == "/s%%/logs/batch-%A_%a.out"
    assert "--output=/s%%/arrays/2000/%a/logs/rank-%t.out" in srun_args(cfg, offset)
    assert array["array"] == "0-3"
    assert "--output=/s/tasks/%a/logs/rank-%t.out" in srun_args(
        cfg, dataclasses.replace(CTX, run_dir="/s", array="0-3")
    )


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("partition", "slurm.partition"),
        ("signal", "requeue.signal"),
        ("open-mode", "truncate"),
        ("output", "RUN_DIR/logs"),
        ("no-requeue", "preemption"),
        ("ntasks", "tasks_per_node"),
        ("--mail-type", "long sbatch option"),
        ("N", "long sbatch option"),
        ("mail_type", "long sbatch option"),
    ],
)
def test_extra_cannot_override_or_misname_flags(name: str, match: str) -> None:
    cfg = JobConfig(name="t", slurm=SlurmConfig(extra=((name, "x"),)))
    with pytest.raises(RenderError, match=match) as info:
        render_sbatch(cfg, CTX)
    assert "HINT:" in str(info.value)


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("gpu", "#SBATCH --partition=gpu"),
        ("a100&ib|v100", '#SBATCH --partition="a100&ib|v100"'),
        ("two words", '#SBATCH --partition="two words"'),
        ("it's #1", '#SBATCH --partition="it\'s #1"'),
    ],
)
def test_format_sbatch_line(value: str, line: str) -> None:
    assert format_sbatch_line("partition", value) == line


@pytest.mark.parametrize("value", ['say "hi"', "back\\slash"])
def test_sbatch_values_with_double_quote_or_backslash_are_refused(value: str) -> None:
    cfg = JobConfig(name="t", slurm=SlurmConfig(account=value))
    with pytest.raises(RenderError, match=r"--account.*HINT:"):
        render_sbatch(cfg, CTX)


# --- refusals -----------------------------------------------------------------------------------


def _with(field: str, value: str) -> tuple[JobConfig, RenderContext]:
    cfg, ctx = JobConfig(name="t"), CTX
    container = ContainerConfig(runtime="apptainer", image="i.sif")
    changes = {
        "name": lambda: (dataclasses.replace(cfg, name=value), ctx),
        "slurm.partition": lambda: (JobConfig("t", slurm=SlurmConfig(partition=value)), ctx),
        "slurm.extra": lambda: (JobConfig("t", slurm=SlurmConfig(extra=(("x-y", value),))), ctx),
        "env.modules": lambda: (JobConfig("t", env=EnvConfig(modules=(value,))), ctx),
        "env.setup": lambda: (JobConfig("t", env=EnvConfig(setup=(value,))), ctx),
        "env.vars": lambda: (JobConfig("t", env=EnvConfig(vars=(("K", value),))), ctx),
        "image": lambda: (
            JobConfig("t", env=EnvConfig(container=dataclasses.replace(container, image=value))),
            ctx,
        ),
        "binds": lambda: (
            JobConfig("t", env=EnvConfig(container=dataclasses.replace(container, binds=(value,)))),
            ctx,
        ),
        "container.python": lambda: (
            JobConfig("t", env=EnvConfig(container=dataclasses.replace(container, python=value))),
            ctx,
        ),
        "slurm.srun_args": lambda: (JobConfig("t", slurm=SlurmConfig(srun_args=(value,))), ctx),
        "run_dir": lambda: (cfg, dataclasses.replace(ctx, run_dir=value)),
        "python": lambda: (cfg, dataclasses.replace(ctx, python=value)),
        "submit_command": lambda: (cfg, dataclasses.replace(ctx, submit_command=value)),
        "config_source": lambda: (cfg, dataclasses.replace(ctx, config_source=value)),
    }
    return changes[field]()


@pytest.mark.parametrize("breaker", ["\n", "\r", "\0"])
@pytest.mark.parametrize(
    "field",
    ["name", "slurm.partition", "slurm.extra", "env.modules", "env.setup", "env.vars", "image",
     "binds", "container.python", "slurm.srun_args", "run_dir", "python", "submit_command",
     "config_source"],
)  # fmt: skip
def test_line_breaks_and_nul_are_refused_everywhere(field: str, breaker: str) -> None:
    cfg, ctx = _with(field, f"-ok{breaker}touch /tmp/pwned")
    with pytest.raises(RenderError, match=r"line break or NUL.*HINT:"):
        render_sbatch(cfg, ctx)


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "", "$(x)"])
def test_env_var_names_must_be_shell_names(name: str) -> None:
    with pytest.raises(RenderError, match=r"env\.vars name"):
        render_sbatch(JobConfig("t", env=EnvConfig(vars=((name, "v"),))), CTX)


def test_charliecloud_bind_with_options_is_refused() -> None:
    container = ContainerConfig(runtime="charliecloud", image="/img", binds=("/data:/data:ro",))
    with pytest.raises(RenderError, match=r"'/data:/data:ro' has options.*HINT: write SRC or"):
        render_sbatch(JobConfig("t", env=EnvConfig(container=container)), CTX)


@pytest.mark.parametrize(
    ("run_dir", "binds", "options", "visible"),
    [
        ("/scratch/alice/runs/x", ("/scratch",), (), True),
        ("/scratch/alice/runs/x", ("/scratch/",), (), True),
        ("/scratch/alice/runs/x", ("/scratch/alice/runs/x",), (), True),
        ("/scratch/alice/runs/x", ("/scratch:/scratch",), (), True),
        ("/tmp/runs/x", (), (), True),  # ch-run binds the host's /tmp itself
        ("/scratch/alice/runs/x", (), (), False),
        ("/scratch/alice/runs/x", ("/scratch:/mnt",), (), False),  # elsewhere inside
        ("/scratch/alice/runs/x", ("/scratch/alice/runs/x2",), (), False),
        ("/scratchpad/runs/x", ("/scratch",), (), False),
        ("/tmp/runs/x", (), ("--private-tmp",), False),
        ("/tmp/runs/x", (), ("-t",), False),
        ("/home/alice/runs/x", (), ("--home",), True),  # the options bind: ch-run will tell
        ("/home/alice/runs/x", (), ("-b", "/home"), True),
    ],
)  # fmt: skip
def test_charliecloud_run_dir_must_be_visible_at_its_path(
    run_dir: str, binds: tuple[str, ...], options: tuple[str, ...], visible: bool
) -> None:
    container = ContainerConfig(runtime="charliecloud", image="/i", binds=binds, options=options)
    cfg = JobConfig("t", env=EnvConfig(container=container))
    ctx = dataclasses.replace(CTX, run_dir=run_dir)
    if visible:
        assert f" /i -- \\\n  python3 -m hpc_ddp run {run_dir}\n" in render_sbatch(cfg, ctx)
    else:
        with pytest.raises(RenderError, match=r"not visible inside the charliecloud.*HINT: add"):
            render_sbatch(cfg, ctx)


def test_charliecloud_runs_each_task_under_ch_run_with_user_set() -> None:
    cfg, ctx = CASES["charliecloud"]
    assert launcher_argv(cfg) == [
        "ch-run", "--cd=$PWD", "-b", "/scratch", "-b", "/data/imagenet:/data",
        "--unset-env=PYTHONPATH", "--unset-env=PYTHONHOME", "--unset-env=VIRTUAL_ENV",
        "--set-env=NCCL_DEBUG=WARN", "/scratch/alice/images/pytorch-24.01", "--",
    ]  # fmt: skip
    assert [a for a in srun_args(cfg, ctx) if "container" in a] == []  # no pyxis flags
    script = render_sbatch(cfg, ctx)
    # Each task starts where a job without a container would: the job's working directory.
    assert '\n  ch-run --cd="$PWD" -b /scratch -b /data/imagenet:/data --unset-env' in script
    user = 'export USER="${USER:-$(id -un)}"\n'
    assert user in script
    assert user not in render_sbatch(*CASES["apptainer"])


def test_a_user_template_without_ch_run_is_refused_for_charliecloud() -> None:
    """Its tasks would run outside the container: ``launcher`` is empty for ch-run."""
    cfg, ctx = CASES["charliecloud"]
    old = "#!/bin/bash\n{{ sbatch_lines | join('\\n') }}\nsrun {{ launcher | join(' ') }} x\n"
    with pytest.raises(RenderError, match=r"never uses `ch_run`.*HINT: copy"):
        render_sbatch(cfg, ctx, old)
    assert render_sbatch(CASES["apptainer"][0], ctx, old).endswith(
        "srun apptainer exec --nv "
        "--bind /data:/data:ro --bind /scratch --cleanenv /images/pytorch-24.01.sif x\n"
    )


def test_pyxis_bind_with_comma_is_refused() -> None:
    container = ContainerConfig(runtime="pyxis", image="img", binds=("/a,b:/c",))
    with pytest.raises(RenderError, match="comma"):
        render_sbatch(JobConfig("t", env=EnvConfig(container=container)), CTX)


def test_signal_must_be_a_signal_name() -> None:
    with pytest.raises(RenderError, match=r"requeue.signal 'B:USR2'"):
        render_sbatch(JobConfig("t", requeue=RequeueConfig(signal="B:USR2")), CTX)


# --- container python, srun_args, memory, CPU binding -------------------------------------------


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_container_python_runs_instead_of_the_login_nodes(runtime: str) -> None:
    assert task_python(JobConfig("t"), CTX) == CTX.python  # no container: the submitter's
    container = ContainerConfig(runtime=runtime, image="img")  # type: ignore[arg-type]
    cfg = JobConfig("t", env=EnvConfig(container=container))
    assert task_python(cfg, CTX) == "python3"  # the default inside an image
    script = render_sbatch(cfg, CTX)
    # The supervisor runs on the batch host with the submitting interpreter; the tasks not.
    assert CTX.python not in script.split(" -- \\\n", 1)[1]
    assert script.rstrip().endswith(f"\n  python3 -m hpc_ddp run {CTX.run_dir}")
    custom = dataclasses.replace(container, python="/opt/conda/bin/python")
    script = render_sbatch(JobConfig("t", env=EnvConfig(container=custom)), CTX)
    assert script.rstrip().endswith(f"\n  /opt/conda/bin/python -m hpc_ddp run {CTX.run_dir}")


def test_malicious_container_python_is_one_quoted_word(tmp_path: Path) -> None:
    # The config loader refuses such a value (tests/config/test_load.py); the renderer quotes it
    # regardless, for a config built in Python.
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    python = f"python3; touch {sentinels}/semi $(touch {sentinels}/dollar)"
    container = ContainerConfig(runtime="apptainer", image="i.sif", python=python)
    script = render_sbatch(JobConfig("t", env=EnvConfig(container=container)), CTX)
    assert f"  'python3; touch {sentinels}/semi $(touch {sentinels}/dollar)' -m hpc_ddp" in script
    calls = run_with_stubs(script, tmp_path)
    assert calls.returncode == 0, calls.stderr
    assert os.listdir(sentinels) == []
    assert calls.argv("srun")[-5:] == [python, "-m", "hpc_ddp", "run", CTX.run_dir]


def test_srun_args_come_last_among_srun_options_one_quoted_word_each() -> None:
    extra = ("--mpi=pmix", "--comment=a b; touch /tmp/x", "-l")
    container = ContainerConfig(runtime="pyxis", image="img")
    cfg = JobConfig("t", slurm=SlurmConfig(srun_args=extra), env=EnvConfig(container=container))
    args = srun_args(cfg, CTX)
    assert args[-3:] == list(extra)
    assert args.index("--container-image=img") < args.index("--mpi=pmix")
    script = render_sbatch(cfg, CTX)
    assert "  --mpi=pmix \\\n  '--comment=a b; touch /tmp/x' \\\n  -l \\\n  python3 -m" in script


def test_srun_args_that_are_not_options_are_refused_when_rendering() -> None:
    cfg = JobConfig("t", slurm=SlurmConfig(srun_args=("--mpi=pmix", "pmix")))
    with pytest.raises(RenderError, match=r"slurm\.srun_args entry 'pmix' is not an srun .*HINT:"):
        render_sbatch(cfg, CTX)


@pytest.mark.usefixtures("slurm_commands")
def test_mem_zero_renders_all_of_the_nodes_memory(tmp_path: Path) -> None:
    from hpc_ddp.config.load import job_config_from_dict

    cfg = job_config_from_dict({"name": "t", "slurm": {"mem": 0}}, "x")
    script = render_sbatch(cfg, CTX)
    assert "\n#SBATCH --mem=0\n" in script
    assert "--mem=0" in sbatch_parse(script, tmp_path)


@pytest.mark.parametrize("supervised", [True, False])
def test_a_node_range_asks_for_cpus_per_node_and_leaves_the_tasks_to_srun(
    supervised: bool, tmp_path: Path
) -> None:
    """``slurm.min_nodes``: ``--nodes=MIN-MAX`` (spares on both ends) and ``--mincpus`` for a
    node's ranks, never ``--ntasks-per-node`` (Slurm 22.05 then caps the range's top at MIN x
    tasks per node); srun sets the tasks per node, the supervisor's steps or the plain line."""
    from hpc_ddp.config.load import job_config_from_dict

    slurm = {"nodes": 4, "min_nodes": 2, "tasks_per_node": 2, "cpus_per_task": 3}
    if supervised:
        slurm["spare_nodes"] = 1
    cfg = job_config_from_dict(
        {"name": "t", "slurm": slurm, "fault": {"enabled": supervised}, "train": {"grad_accum": 3}},
        "x",
    )
    flags = dict(sbatch_flags(cfg, CTX))
    assert flags["nodes"] == ("3-5" if supervised else "2-4")
    assert flags["mincpus"] == "6"
    assert "ntasks-per-node" not in flags
    assert "cpus-per-task" not in flags
    args = srun_args(cfg, CTX)
    assert "--cpus-per-task=3" in args
    assert ("--ntasks-per-node=2" in args) is not supervised
    found = sbatch_parse(render_sbatch(cfg, CTX), tmp_path)
    assert found == expected_sbatch_args(cfg, CTX)
    fixed = dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, min_nodes=None))
    assert dict(sbatch_flags(fixed, CTX))["ntasks-per-node"] == "2"
    assert "mincpus" not in dict(sbatch_flags(fixed, CTX))


def test_cpu_binding_is_left_to_slurm_unless_srun_args_ask() -> None:
    """hpc-ddp asks for no ``--cpu-bind``: Slurm binds each task to its cpus_per_task CPUs (or
    applies the site's default); a user's own ``--cpu-bind`` in slurm.srun_args reaches srun."""
    cfg, ctx = CASES["site_profile"]
    script = render_sbatch(cfg, ctx)
    assert [a for a in srun_args(cfg, ctx) if a.startswith("--cpu-bind")] == []
    assert "--cpu-bind" not in script
    bound = dataclasses.replace(
        cfg, slurm=dataclasses.replace(cfg.slurm, srun_args=("--cpu-bind=cores",))
    )
    assert [a for a in srun_args(bound, ctx) if a.startswith("--cpu-bind")] == ["--cpu-bind=cores"]
    assert srun_args(bound, ctx)[-1] == "--cpu-bind=cores"  # last: nothing of ours overrides it
    assert "  --cpu-bind=cores \\\n" in render_sbatch(bound, ctx)


_EXEC_SRUN = """#!/bin/sh
printf '%s\\0' "$@" > "$STUB_OUT/srun.argv"
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
exec "$@"
"""
_IMAGE_PYTHON = """#!/bin/sh
printf '%s\\0' "$0" "$@" > "$STUB_OUT/python.argv"
"""


def test_container_python_end_to_end_through_stub_srun_and_apptainer(tmp_path: Path) -> None:
    """srun and apptainer stubs record their argv and exec the rest (srun drops its options,
    apptainer ``exec``, its options and the image), down to the image's python, a stub too:
    the configured interpreter is what finally runs, and the login node's is never tried."""
    bin_dir, out, image_bin = tmp_path / "stubs", tmp_path / "calls", tmp_path / "image" / "bin"
    for d in (bin_dir, out, image_bin):
        d.mkdir(parents=True)
    python = image_bin / "python3"
    apptainer = apptainer_stub('"$STUB_OUT/apptainer.argv"')
    for path, text in ((bin_dir / "srun", _EXEC_SRUN), (bin_dir / "apptainer", apptainer),
                       (python, _IMAGE_PYTHON)):  # fmt: skip
        path.write_text(text)
        path.chmod(0o755)
    container = ContainerConfig(
        runtime="apptainer", image="/images/x.sif", binds=("/data",), options=("--cleanenv",),
        python=str(python),
    )  # fmt: skip
    cfg = JobConfig(
        "t",
        slurm=SlurmConfig(gpus_per_node=1, srun_args=("--mpi=none",)),
        env=EnvConfig(container=container),
        fault=FaultConfig(enabled=False),  # with it, the supervisor runs the submitter's python
    )
    ctx = dataclasses.replace(CTX, python="/login/node/only/python")  # absent: must not run
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(cfg, ctx), encoding="utf-8")
    proc = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "HOME": str(tmp_path)},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = StubCalls(out, proc.returncode, proc.stderr)
    tail = ["exec", "--nv", "--bind", "/data", "--cleanenv", "/images/x.sif",
            str(python), "-m", "hpc_ddp", "run", ctx.run_dir]  # fmt: skip
    assert calls.argv("srun")[-len(tail) - 2 :] == ["--mpi=none", "apptainer", *tail]
    assert calls.argv("apptainer") == tail
    assert calls.argv("python") == [str(python), "-m", "hpc_ddp", "run", ctx.run_dir]


# --- templates ----------------------------------------------------------------------------------


def test_load_template_default_and_relative_user_template(tmp_path: Path) -> None:
    assert load_template(JobConfig("t"), tmp_path) is None  # written without reading it
    assert default_template_text().startswith("{#-")
    (tmp_path / "mine.j2").write_text("#!/bin/bash\n{{ sbatch_lines | join('\\n') }}\necho hi\n")
    cfg = JobConfig("t", slurm=SlurmConfig(template="mine.j2"))
    script = render_sbatch(cfg, CTX, load_template(cfg, tmp_path))
    assert script.startswith("#!/bin/bash\n#SBATCH --error=")
    assert script.endswith("\necho hi\n")


def test_load_template_missing_file(tmp_path: Path) -> None:
    cfg = JobConfig("t", slurm=SlurmConfig(template="nope.j2"))
    with pytest.raises(RenderError, match=r"nope\.j2.*does not exist.*HINT:"):
        load_template(cfg, tmp_path)


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("#!/bin/bash\n{{ no_such_value }}\n", "unknown value.*HINT: use only"),
        ("#!/bin/bash\n{% if %}\n", "line 2"),
        ("echo hi\n{{ sbatch_lines | join('\\n') }}\n", "'#!'"),
        ("#!/bin/bash\necho hi\n{{ sbatch_lines | join('\\n') }}\n", "after the first command"),
    ],
)
def test_bad_user_templates(template: str, match: str) -> None:
    with pytest.raises(RenderError, match=match):
        render_sbatch(JobConfig("t"), CTX, template)


# --- hostile values through real bash and real sbatch ------------------------------------------


def hostile_values(sentinels: Path) -> list[str]:
    """Values that would run a command (and touch a sentinel) if any quoting failed."""
    s = sentinels
    return [
        f"a'; touch {s}/quote #",
        f"$(touch {s}/dollar)",
        f"`touch {s}/backtick`",
        f"; rm -rf {s}/nothing; touch {s}/semicolon",
        f"x && touch {s}/and || touch {s}/or",
        f"> {s}/redirect",
        "two  spaces\tand a tab",
        "ünïcödé ☃ 日本",
        "${HOME:?unset}",
        "*",
        "-n",
        "",
        f'"dq" \\backslash \\"; touch {s}/dq',
    ]


@pytest.mark.usefixtures("slurm_commands")
def test_hostile_values_reach_their_commands_verbatim_and_run_nothing(tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    values = hostile_values(sentinels)
    # No `"` or `\` in #SBATCH values (refused, tested above); any other character goes.
    sbatch_safe = [v for v in values if '"' not in v and "\\" not in v and v]
    run_dir = str(tmp_path / f"run'dir $(touch {sentinels}/rundir) `x` ☃ 100%")
    cfg = JobConfig(
        name=sbatch_safe[0],
        slurm=SlurmConfig(
            partition=sbatch_safe[1], account=sbatch_safe[2], qos=sbatch_safe[3],
            constraint=sbatch_safe[4], mem=sbatch_safe[5], gpus_per_node=1,
            extra=tuple((f"x-{i}", v) for i, v in enumerate(sbatch_safe)),
            srun_args=tuple(f"--x{i}={v}" for i, v in enumerate(values)),
        ),
        env=EnvConfig(
            modules=tuple(values),
            setup=("export FROM_SETUP=ran",),
            vars=tuple((f"HOSTILE_{i}", v) for i, v in enumerate(values)),
            container=ContainerConfig(
                runtime="apptainer", image=values[0], binds=tuple(values[1:4]),
                options=tuple(values[4:]), python=f"py thon'$(touch {sentinels}/python)`x`",
            ),
        ),
        command=tuple(values),
    )  # fmt: skip
    ctx = RenderContext(
        run_dir=run_dir,
        python=str(tmp_path / "py thon'$(touch x)" / "bin" / "python"),
        config_source=values[0],
        submit_command=" ".join(values),
        generated_at=values[1],
        version="0.1.0",
    )
    script = render_sbatch(cfg, ctx)
    calls = run_with_stubs(script, tmp_path)

    assert calls.returncode == 0, calls.stderr
    assert sorted(os.listdir(sentinels)) == []
    assert calls.argv("module") == ["load", *values]
    # The supervisor gets the run directory as one word, and srun's command after `--`.
    assert calls.argv("python")[:5] == ["-m", "hpc_ddp", "supervise", run_dir, "--"]
    logs = run_dir.replace("%", "%%") + "/logs"
    assert calls.argv("srun") == [
        f"--output={logs}/rank-%t.out",
        f"--error={logs}/rank-%t.err",
        "--open-mode=append",
        *(f"--x{i}={v}" for i, v in enumerate(values)),
        "apptainer", "exec", "--nv",
        "--bind", values[1], "--bind", values[2], "--bind", values[3],
        *values[4:],
        values[0],
        f"py thon'$(touch {sentinels}/python)`x`", "-m", "hpc_ddp", "run", run_dir,
    ]  # fmt: skip
    env = calls.env("srun")
    assert [env[f"HOSTILE_{i}"] for i in range(len(values))] == values
    assert env["HPC_DDP_RUN_DIR"] == run_dir
    assert env["FROM_SETUP"] == "ran"

    # sbatch itself reads every #SBATCH value back exactly.
    found = sbatch_parse(script, tmp_path)
    assert found == expected_sbatch_args(cfg, ctx)


def test_hostile_pyxis_values(tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    values = [v for v in hostile_values(sentinels) if "," not in v]
    container = ContainerConfig(
        runtime="pyxis", image=values[0], binds=tuple(values[1:3]), options=tuple(values[3:])
    )
    cfg = JobConfig("t", slurm=SlurmConfig(cpus_per_task=3), env=EnvConfig(container=container))
    calls = run_with_stubs(render_sbatch(cfg, CTX), tmp_path)
    assert sorted(os.listdir(sentinels)) == []
    argv = calls.argv("srun")
    assert argv[3:] == [
        "--cpus-per-task=3",
        f"--container-image={values[0]}",
        f"--container-mounts={values[1]},{values[2]}",
        *values[3:],
        "python3", "-m", "hpc_ddp", "run", CTX.run_dir,  # the container's default python
    ]  # fmt: skip


def test_hostile_charliecloud_values(tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    values = [v for v in hostile_values(sentinels) if v.count(":") < 2]
    run_dir = f"/tmp/run'dir $(touch {sentinels}/rundir) `x` ☃"
    container = ContainerConfig(
        runtime="charliecloud", image=values[0], binds=tuple(values[1:4]),
        options=tuple(values[4:]), python=f"py thon'$(touch {sentinels}/python)`x`",
    )  # fmt: skip
    cfg = JobConfig("t", env=EnvConfig(container=container))
    ctx = dataclasses.replace(CTX, run_dir=run_dir)
    calls = run_with_stubs(render_sbatch(cfg, ctx), tmp_path, {"USER": "a'b $(touch x)"})
    assert calls.returncode == 0, calls.stderr
    assert sorted(os.listdir(sentinels)) == []
    assert calls.argv("srun")[3:] == [
        "ch-run", f"--cd={tmp_path}", "-b", values[1], "-b", values[2], "-b", values[3],
        "--unset-env=PYTHONPATH", "--unset-env=PYTHONHOME", "--unset-env=VIRTUAL_ENV",
        *values[4:], values[0], "--",
        f"py thon'$(touch {sentinels}/python)`x`", "-m", "hpc_ddp", "run", run_dir,
    ]  # fmt: skip
    assert calls.env("srun")["USER"] == "a'b $(touch x)"  # a user's own $USER is kept as is


@pytest.mark.parametrize("case", ["unsupervised", "cpu_one_node"])
def test_job_exit_status_is_srun_status(case: str, tmp_path: Path) -> None:
    cfg, ctx = CASES[case]  # supervised: the supervisor's, here a stub that becomes srun
    calls = run_with_stubs(render_sbatch(cfg, ctx), tmp_path, {"STUB_SRUN_EXIT": "7"})
    assert calls.returncode == 7


@pytest.mark.parametrize("sig", ["USR1", "USR2"])
def test_a_stray_user_signal_cannot_end_the_supervisor_as_it_starts(
    sig: str, tmp_path: Path
) -> None:
    """The batch shell ignores USR1/USR2 before it execs the supervisor: an ignored signal
    stays ignored across exec, so one that arrives while the supervisor starts (before it
    catches them itself) is harmless. The stub supervisor signals itself to show it."""
    cfg, ctx = CASES["cpu_one_node"]
    script = render_sbatch(cfg, ctx)
    calls = run_with_stubs(script, tmp_path, {"STUB_SUPERVISOR_SIGNAL": sig})
    assert calls.returncode == 0, calls.stderr
    unguarded = script.replace("trap '' USR1 USR2\n", "")
    assert unguarded != script
    killed = run_with_stubs(unguarded, tmp_path / "unguarded", {"STUB_SUPERVISOR_SIGNAL": sig})
    assert killed.returncode == -getattr(signal, f"SIG{sig}")


@pytest.mark.parametrize("sig", ["USR1", "USR2"])
def test_batch_shell_survives_a_stray_user_signal(sig: str, tmp_path: Path) -> None:
    cfg, ctx = CASES["unsupervised"]  # supervised, the batch shell is the supervisor
    script = render_sbatch(cfg, ctx)
    # The stub srun signals its parent, the batch shell, as `scancel --full` would.
    calls = run_with_stubs(script, tmp_path, {"STUB_SRUN_SIGNAL": sig})
    assert calls.returncode == 0, calls.stderr
    # Without the trap the same signal kills the shell: the harness can see the difference.
    untrapped = script.replace("trap : USR1 USR2\n", "")
    assert untrapped != script
    killed = run_with_stubs(untrapped, tmp_path / "untrapped", {"STUB_SRUN_SIGNAL": sig})
    assert killed.returncode == -getattr(signal, f"SIG{sig}")


def test_login_node_modules_do_not_import_torch() -> None:
    code = (
        "import sys, hpc_ddp.backends.slurm.render, hpc_ddp.backends.slurm.client; "
        "print(sorted({'torch', 'torchvision', 'submitit'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- harness ------------------------------------------------------------------------------------

_STUB = r"""#!/bin/sh
out="$STUB_OUT/$(basename "$0")"
printf '%s\0' "$@" > "$out.argv"
env -0 > "$out.env"
if [ "$(basename "$0")" = python ] && [ "$3" = supervise ]; then
    if [ -n "${STUB_SUPERVISOR_SIGNAL:-}" ]; then kill -s "$STUB_SUPERVISOR_SIGNAL" $$; fi
    shift 5  # -m hpc_ddp supervise RUN_DIR --
    exec "$@"
fi
if [ "$(basename "$0")" = srun ]; then
    if [ -n "${STUB_SRUN_SIGNAL:-}" ]; then kill -s "$STUB_SRUN_SIGNAL" "$PPID"; sleep 0.2; fi
    exit "${STUB_SRUN_EXIT:-0}"
fi
"""


@dataclasses.dataclass
class StubCalls:
    out: Path
    returncode: int
    stderr: str

    def argv(self, name: str) -> list[str]:
        data = (self.out / f"{name}.argv").read_bytes()
        return [a.decode("utf-8") for a in data.split(b"\0")[:-1]]

    def env(self, name: str) -> dict[str, str]:
        data = (self.out / f"{name}.env").read_bytes()
        pairs = (item.decode("utf-8").partition("=") for item in data.split(b"\0") if item)
        return {k: v for k, _, v in pairs}


def run_with_stubs(script: str, tmp_path: Path, env: dict[str, str] | None = None) -> StubCalls:
    """Run ``script`` under bash with srun, module, apptainer and conda stubbed on PATH."""
    bin_dir, out = tmp_path / "stubs", tmp_path / "calls"
    bin_dir.mkdir(parents=True)
    out.mkdir()
    # mkdir too: an array task's script makes its logs/ (under the golden's /scratch path).
    for name in ("srun", "module", "apptainer", "conda", "python", "mkdir"):
        (bin_dir / name).write_text(_STUB)
        (bin_dir / name).chmod(0o755)
    activate = tmp_path / "venvs" / "ddp" / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text('export VIRTUAL_ENV="$HOME/venvs/ddp"\n')
    # The supervisor's interpreter (the submitting one, absent here) becomes the stub python,
    # which records its argv and runs the srun command given after `--`.
    lines = script.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("exec ") and " -m hpc_ddp supervise " in line:
            rest = line.split(" -m hpc_ddp supervise ", 1)[1]
            lines[i] = f"exec {bin_dir}/python -m hpc_ddp supervise {rest}"
    script = "".join(lines)
    path = tmp_path / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    proc = subprocess.run(
        ["bash", str(path)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "HOME": str(tmp_path),
             "SLURM_ARRAY_TASK_ID": "0", **(env or {})},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return StubCalls(out, proc.returncode, proc.stderr)


_SBATCH_CONF = """ClusterName=parse-only
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=1
AuthType=auth/none
CredType=cred/none
MessageTimeout=1
TCPTimeout=1
NodeName=x CPUs=1
PartitionName=p Nodes=x Default=YES
"""
_FOUND = re.compile(r'^sbatch: debug2: Found in script, argument "(.*)"$', re.MULTILINE)


def sbatch_parse(script: str, tmp_path: Path) -> list[str]:
    """The arguments real sbatch finds in ``script``'s #SBATCH lines; submits nothing."""
    sbatch = shutil.which("sbatch")
    assert sbatch is not None, "the slurm_commands fixture installs it"
    conf, path = tmp_path / "parse-only.conf", tmp_path / "parse.sbatch"
    conf.write_text(_SBATCH_CONF)
    path.write_text(script, encoding="utf-8")
    # Controller on a closed port, and --test-only besides: nothing can be submitted.
    proc = subprocess.run(
        [sbatch, "-vvv", "--test-only", str(path)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(conf)},
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    stderr = proc.stderr.decode("utf-8", errors="replace")
    assert proc.returncode != 0, "sbatch unexpectedly reached a controller"
    return _FOUND.findall(stderr)


def expected_sbatch_args(cfg: JobConfig, ctx: RenderContext) -> list[str]:
    return [f"--{n}" if v is None else f"--{n}={v}" for n, v in sbatch_flags(cfg, ctx)]
