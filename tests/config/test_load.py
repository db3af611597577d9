"""Loading job configs: strict schema, every refusal with its key and hint, layering, round trip."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_ddp.config.load import (
    apply_overrides,
    dump_job_config,
    find_site_profile,
    job_config_from_dict,
    job_config_to_dict,
    load_job_config,
    load_resolved_config,
)
from hpc_ddp.config.model import ContainerConfig, JobConfig, SlurmConfig
from hpc_ddp.config.yaml_dialect import parse_yaml
from hpc_ddp.errors import ConfigError, OverrideError, RunDirError

DATA = Path(__file__).parents[1] / "data" / "config"


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at ``dotted`` (a test helper independent of the code)."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(data))
    node = out
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


def _error(data: Any, source: str = "jobs/x.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        job_config_from_dict(data, source)
    return str(info.value)


# --- the full fixture ---------------------------------------------------------------------------


def test_full_fixture_loads_every_section() -> None:
    cfg = load_job_config(DATA / "full.yaml")
    assert cfg.name == "full-job"
    assert cfg.entrypoint == "mypkg.train:main"
    assert cfg.slurm.ntasks == 8
    assert cfg.slurm.time == "1-00:00:00"
    assert cfg.slurm.mem == "64G"
    assert cfg.slurm.extra == (
        ("gres", "gpu:a100:4"),
        ("mail-type", "END"),
        ("nice", "10"),  # integers become strings
        ("hold", None),  # null is a bare flag
    )
    assert cfg.env.modules == ("cuda/12.4", "gcc/12")
    assert cfg.env.vars == (("OMP_NUM_THREADS", "8"), ("NCCL_DEBUG", "WARN"))
    assert cfg.env.container == ContainerConfig(
        runtime="apptainer", image="/images/torch.sif", binds=("/scratch:/scratch",),
        options=("--nv",),
    )  # fmt: skip
    assert cfg.dist.port == 29500
    assert cfg.train.lr == pytest.approx(3e-4)  # 1.2-style float without a dot
    assert cfg.train.max_steps == 1000
    assert cfg.train.epochs is None
    assert cfg.train.checkpoint_every == 0
    assert cfg.requeue.signal == "USR1"
    assert cfg.requeue.on_crash is True


def test_minimal_job_gets_the_dataclass_defaults() -> None:
    assert job_config_from_dict({"name": "a"}, "x") == JobConfig(name="a")


@pytest.mark.parametrize(
    ("value", "canonical"),
    [(30, "00:30:00"), ("30", "00:30:00"), ("90:00", "01:30:00"), ("1-12", "1-12:00:00"),
     ("36:00:00", "1-12:00:00")],
)  # fmt: skip
def test_time_is_canonicalised_and_bare_integers_are_minutes(value: Any, canonical: str) -> None:
    cfg = job_config_from_dict({"name": "a", "slurm": {"time": value}}, "x")
    assert cfg.slurm.time == canonical


def test_yaml_dialect_keeps_clock_times_and_yes_as_strings() -> None:
    # PyYAML's YAML 1.1 would read 12:00:00 as 43200 (then 43200 minutes) and yes as True.
    data = parse_yaml("name: a\nslurm: {time: 12:00:00}\ncommand: [x, yes, 007, 2024-01-01]\n", "t")
    cfg = job_config_from_dict(data, "t")
    assert cfg.slurm.time == "12:00:00"
    assert cfg.command == ("x", "yes", "007", "2024-01-01")


DIALECT_DOCS = [
    "name: a\nslurm: {time: 12:00:00}\ncommand: [x, yes, 007, 2024-01-01, 1e-3, .inf, ~, 08]\n",
    "a: &x {b: [1, 2.5, -3, +4, true, FALSE, null, '', \"q\"]}\nc: *x\nd: {<<: *x, e: 1}\n",
    "- !!str 5\n- 0x1F\n- 0o17\n- 1_000\n- |\n  block\n  text\n- >\n  folded\n  text\n",
    "", "# only a comment\n", "plain", "[1, [2, [3, {a: b}]]]", "k: 'it''s'\nj: \"\\u00fc\"\n",
]  # fmt: skip


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
@pytest.mark.parametrize("text", DIALECT_DOCS)
def test_libyaml_and_pure_python_loaders_read_the_same(text: str) -> None:
    """A job file is read by libyaml when PyYAML has it (faster on a login node): every
    value comes out as the pure-Python loader of the dialect reads it, types included."""
    from hpc_ddp.config import yaml_dialect

    fast = yaml_dialect._load_fast(text)
    slow = yaml.load(text, Loader=yaml_dialect._Loader)
    assert fast == slow
    assert repr(fast) == repr(slow)  # 1 and True, 1.0 and 1 are equal but not the same


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
@pytest.mark.parametrize(
    "text",
    ["a: 1\na: 2\n", "a: [\n", "a: " + "x" * 9000 + "\n", "a: " + "9" * 25 + "\n",
     "a: &l [1, 2]\nb: *nope\n", "&a [*a]\n"],
)  # fmt: skip
def test_libyaml_leaves_errors_and_limits_to_the_pure_python_loader(text: str) -> None:
    """Errors and limits are reported by the pure-Python loader, with its exact words."""
    from hpc_ddp.config import yaml_dialect

    with pytest.raises(yaml_dialect._Fallback):
        yaml_dialect._load_fast(text)


# --- every refusal names the key and hints -------------------------------------------------------

BASE: dict[str, Any] = {"name": "job"}

ERRORS: list[tuple[str, Any, str, str]] = [
    # (dotted key, value, key named in the message, fragment)
    ("slurm.tasks_per_nod", 2, "slurm.tasks_per_nod", "did you mean 'slurm.tasks_per_node'?"),
    ("slurm.gpus_per_nod", 2, "slurm.gpus_per_nod", "did you mean 'slurm.gpus_per_node'?"),
    ("trian.lr", 0.1, "trian", "did you mean 'train'?"),
    ("lr", 0.1, "lr", "did you mean 'train.lr'?"),
    ("slurm.lr", 0.1, "slurm.lr", "did you mean 'train.lr'?"),
    ("slurm.zzzzzz", 1, "slurm.zzzzzz", "valid keys under 'slurm': nodes"),
    ("name", "bad name", "name", "not a valid job name"),
    ("name", "-lead", "name", "not a valid job name"),
    ("name", 5, "name", "expected a string, got integer 5. HINT: quote it"),
    ("slurm.nodes", 0, "slurm.nodes", "must be between 1 and 100000"),
    # Past any cluster: refused before it is rendered into #SBATCH --nodes.
    ("slurm.nodes", 12345678901234567890, "slurm.nodes", "HINT: use 1 to 100,000 (no cluster"),
    ("slurm.tasks_per_node", 99999, "slurm.tasks_per_node", "HINT: use 1 to 10,000 (no node"),
    ("slurm.spare_nodes", 10**6, "slurm.spare_nodes", "must be between 0 and 100000"),
    ("train.max_steps", 10**11, "train.max_steps", "must be at most 2,147,483,647, got 10"),
    # `nan` and `1_000` are strings to YAML 1.2 without any quotes: no "remove the quotes".
    ("train.lr", "nan", "train.lr", "must be a finite number, got 'nan'. HINT: write a number"),
    ("train.lr", "-inf", "train.lr", "must be a finite number, got '-inf'"),
    (
        "train.lr",
        "1_000",
        "train.lr",
        "expected a number, got string '1_000'. HINT: write it as a plain number: 1000.0",
    ),
    ("train.lr", "0.1", "train.lr", "HINT: remove the quotes: 0.1"),
    ("slurm.nodes", True, "slurm.nodes", "expected an integer, got boolean True"),
    ("slurm.nodes", "2", "slurm.nodes", "remove the quotes"),
    ("slurm.nodes", 2.0, "slurm.nodes", "without a decimal point: 2"),
    ("slurm.tasks_per_node", 0, "slurm.tasks_per_node", "must be between 1 and 10000"),
    ("slurm.cpus_per_task", 0, "slurm.cpus_per_task", "must be between 1 and 10000"),
    ("slurm.gpus_per_node", 0, "slurm.gpus_per_node", "(null) for no GPUs"),
    ("slurm.time", "01:75:00", "slurm.time", "minutes field is 75"),
    ("slurm.time", "UNLIMITED", "slurm.time", "finite limit"),
    ("slurm.time", 1.5, "slurm.time", "expected a string"),
    ("slurm.mem", "16GB", "slurm.mem", "write '16G'"),
    ("slurm.mem", "1.5G", "slurm.mem", "write '1536M'"),
    ("slurm.srun_args", "--mpi=pmix", "slurm.srun_args", "write [--mpi=pmix]"),
    ("slurm.srun_args", ["pmix"], "slurm.srun_args[0]", "not an srun option"),
    ("slurm.srun_args", ["--mpi", "pmix"], "slurm.srun_args[1]", "write '--mpi=pmix'"),
    ("slurm.srun_args", ["-"], "slurm.srun_args[0]", "not an srun option"),
    ("slurm.srun_args", [3], "slurm.srun_args[0]", "expected a string"),
    ("slurm.srun_args", ["--output=x"], "slurm.srun_args[0]", "log files"),
    ("slurm.srun_args", ["--err=x"], "slurm.srun_args[0]", "log files"),
    ("slurm.srun_args", ["-ox"], "slurm.srun_args[0]", "log files"),
    ("slurm.srun_args", ["--x\n"], "slurm.srun_args[0]", "line break"),
    ("slurm.srun_arg", ["--mpi=pmix"], "slurm.srun_arg", "did you mean 'slurm.srun_args'?"),
    ("srun_args", ["--mpi=pmix"], "srun_args", "did you mean 'slurm.srun_args'?"),
    ("slurm.exclusive", "yes", "slurm.exclusive", "expected true or false"),
    ("slurm.exclusive", "no", "slurm.exclusive", "YAML 1.2, where 'no' is a string"),
    ("slurm.partition", "", "slurm.partition", "empty string"),
    ("slurm.extra", ["gres=gpu:1"], "slurm.extra", "expected a mapping"),
    ("slurm.extra", {"--gres": "gpu:1"}, "slurm.extra.--gres", "without leading dashes: 'gres'"),
    ("slurm.extra", {"Gres": "gpu:1"}, "slurm.extra.Gres", "long option name in lower case"),
    ("slurm.extra", {"output": "x"}, "slurm.extra.output", "logs always go to RUN_DIR/logs/"),
    ("slurm.extra", {"error": "x"}, "slurm.extra.error", "RUN_DIR/logs/"),
    ("slurm.extra", {"signal": "x"}, "slurm.extra.signal", "use requeue.signal"),
    ("slurm.extra", {"requeue": None}, "slurm.extra.requeue", "requeue.max_requeues"),
    ("slurm.extra", {"open-mode": "a"}, "slurm.extra.open-mode", "appended"),
    ("slurm.extra", {"nodes": 2}, "slurm.extra.nodes", "use slurm.nodes"),
    ("slurm.extra", {"ntasks-per-node": 2}, "slurm.extra.ntasks-per-node", "tasks_per_node"),
    ("slurm.extra", {"array": "0-3"}, "slurm.extra.array", "sweep"),
    ("slurm.extra", {"job-name": "x"}, "slurm.extra.job-name", "use name"),
    ("slurm.extra", {"time": "10"}, "slurm.extra.time", "use slurm.time"),
    ("slurm.extra", {"outp": "x"}, "slurm.extra.outp", "'outp' abbreviates --output"),
    ("slurm.extra", {"clusters": "x"}, "slurm.extra.clusters", "multi-cluster is not supp"),
    ("slurm.extra", {"cluster": "x"}, "slurm.extra.cluster", "login node of that cluster"),
    ("slurm.extra", {"M": "x"}, "slurm.extra.M", "long option name in lower case"),
    ("slurm.extra", {"-M": "x"}, "slurm.extra.-M", "without leading dashes"),
    ("slurm.extra", {"gres": True}, "slurm.extra.gres", "null for a bare flag"),
    ("slurm.extra", {"gres": "a\nb"}, "slurm.extra.gres", "line break"),
    ("env.modules", "cuda", "env.modules", "write [cuda]"),
    ("env.modules", [5], "env.modules[0]", "expected a string"),
    ("env.setup", ["source a\nrm -rf /"], "env.setup[0]", "line break"),
    ("env.vars", {"1BAD": "x"}, "env.vars.1BAD", "not a valid environment variable name"),
    ("env.vars", {"A-B": "x"}, "env.vars.A-B", "not a valid environment variable name"),
    ("env.vars", {"MASTER_PORT": "1"}, "env.vars.MASTER_PORT", "use dist.port"),
    ("env.vars", {"A": None}, "env.vars.A", "quote it"),
    ("env.vars", {"A": 1.5}, "env.vars.A", "quote it"),
    ("env.vars", {"A": "x\x00y"}, "env.vars.A", "NUL"),
    ("env.container", {"image": "x"}, "env.container.runtime", "apptainer, pyxis or charlie"),
    ("env.container", {"runtime": "docker", "image": "x"}, "env.container.runtime", "pyxis"),
    ("env.container", {"runtime": "charliecloud"}, "env.container.image", "image file or name"),
    (
        "env.container",
        {"runtime": "charlicloud", "image": "x"},
        "env.container.runtime",
        "did you mean 'charliecloud'?",
    ),
    ("env.container", "x.sif", "env.container", "expected a mapping"),
    *(
        (
            "env.container",
            {"runtime": "apptainer", "image": "x", "python": bad},
            "env.container.python",
            fragment,
        )
        for bad, fragment in [
            ("python3; touch /tmp/pwned", "not an executable name or path"),
            ("$(touch /tmp/pwned)", "not an executable name or path"),
            ("`id`", "not an executable name or path"),
            ("python3 -u", "no spaces"),
            ("'python3'", "not an executable name or path"),
            ("-c", "not an executable name or path"),
            ("/opt/bin/", "not an executable name or path"),
            ("", "empty string"),
            (3, "expected a string"),
        ]
    ),
    (
        "env.container",
        {"runtime": "apptainer", "image": "x", "pyton": "python3"},
        "env.container.pyton",
        "did you mean 'env.container.python'?",
    ),
    ("python", "python3", "python", "did you mean 'env.container.python'?"),
    ("dist.backend", "ncll", "dist.backend", "did you mean 'nccl'?"),
    ("dist.init_method", "ssh", "dist.init_method", "not one of: env, tcp, file"),
    ("dist.port", 80, "dist.port", "between 1024 and 65535"),
    ("dist.port", 70000, "dist.port", "between 1024 and 65535"),
    ("dist.timeout_s", 0, "dist.timeout_s", "at least 1"),
    ("train.lr", 0, "train.lr", "greater than 0"),
    ("train.lr", -0.1, "train.lr", "greater than 0"),
    ("train.lr", "1e-3", "train.lr", "remove the quotes"),
    ("train.lr", float("nan"), "train.lr", "finite"),
    ("train.lr", True, "train.lr", "expected a number, got boolean"),
    ("train.batch_size", 0, "train.batch_size", "per rank"),
    ("train.grad_accum", 0, "train.grad_accum", "no accumulation"),
    ("train.keep_last", 0, "train.keep_last", "newest checkpoint"),
    ("train.keep_best", {"metric": "x", "mode": "lowest"}, "train.keep_best.mode", "min, max"),
    ("train.keep_best", {"mode": "min"}, "train.keep_best.metric", "metric: val_loss"),
    ("train.keep_best", {"metric": "step"}, "train.keep_best.metric", "a number your rows log"),
    ("train.keep_best", {"metric": "val loss"}, "train.keep_best.metric", "val_loss"),
    ("train.keep_best", "val_loss", "train.keep_best", "expected a mapping"),
    ("train.checkpoint_every", -1, "train.checkpoint_every", "0 saves only on stop"),
    ("train.max_steps", 0, "train.max_steps", "at least 1"),
    ("train.epochs", 0, "train.epochs", "at least 1"),
    ("train.seed", -1, "train.seed", "between 0 and"),
    ("train.optimizer", "adam", "train.optimizer", "did you mean 'adamw'?"),
    ("train.lr_schedule", "linear", "train.lr_schedule", "not one of: constant, cosine, step"),
    ("train.model", "pkg.mod:", "train.model", "package.module:function"),
    ("train.amp", 1, "train.amp", "expected true or false"),
    ("train.strategy", "fsdp2", "train.strategy", "did you mean 'fsdp'?"),
    ("train.strategy", "zero", "train.strategy", "not one of: ddp, fsdp"),
    ("requeue.signal", "KILL", "requeue.signal", "USR1, USR2, TERM, INT, HUP, ALRM"),
    ("requeue.signal", "SIGUSR2", "requeue.signal", "write 'USR2'"),
    ("requeue.signal", "usr2", "requeue.signal", "write 'USR2'"),
    ("requeue.lead_time", 0, "requeue.lead_time", "between 1 and 65535"),
    ("requeue.lead_time", 70000, "requeue.lead_time", "between 1 and 65535"),
    ("requeue.max_requeues", -1, "requeue.max_requeues", "at least 0"),
    ("command", "python train.py --lr 0.1", "command", '["python", "train.py", "--lr", "0.1"]'),
    ("command", [], "command", "non-empty argv list"),
    ("command", ["python", 3], "command[1]", "quote it"),
    ("command", ["python", "a\rb"], "command[1]", "line break"),
    ("entrypoint", "mypkg.train", "entrypoint", "package.module:function"),
    ("entrypoint", "my-pkg.train:main", "entrypoint", "package.module:function"),
    ("slurm", 5, "slurm", "expected a mapping"),
]


@pytest.mark.parametrize(("dotted", "value", "key", "fragment"), ERRORS)
def test_invalid_value_names_file_key_and_hint(
    dotted: str, value: Any, key: str, fragment: str
) -> None:
    message = _error(_set(BASE, dotted, value))
    assert message.startswith(f"jobs/x.yaml: {key}: ")
    assert "HINT:" in message
    assert fragment in message


COMBINATIONS: list[tuple[dict[str, Any], str, str]] = [
    (
        {"slurm": {"gpus_per_task": 1, "gpus_per_node": 4}},
        "slurm.gpus_per_task",
        "set only one",
    ),
    (
        {"slurm": {"gpus_per_node": 4, "tasks_per_node": 8}},
        "slurm.tasks_per_node",
        "more tasks than slurm.gpus_per_node (4)",
    ),
    ({"slurm": {"time": "00:02:00"}, "requeue": {"lead_time": 120}}, "requeue.lead_time", "120 s"),
    ({"slurm": {"time": "10"}, "requeue": {"lead_time": 900}}, "requeue.lead_time", "lengthen"),
    ({"train": {"max_steps": None, "epochs": None}}, "train.max_steps", "set one of them"),
    ({"command": ["python", "t.py"], "entrypoint": "a.b:c"}, "command", "keep one"),
    ({"slurm": {"mem": "4G", "extra": {"mem-per-cpu": "1G"}}}, "slurm.extra.mem-per-cpu", "both"),
    # The built-in trainer computes on one GPU per rank: more would stay idle.
    ({"slurm": {"gpus_per_task": 2}}, "slurm.gpus_per_task", "each rank's other 1 would stay"),
    (
        {"slurm": {"gpus_per_node": 8, "tasks_per_node": 4}},
        "slurm.gpus_per_node",
        "is 8 for 4 task(s) per node (slurm.tasks_per_node), but the built-in trainer",
    ),
]


def test_a_flag_that_merely_starts_like_clusters_is_passed_to_sbatch() -> None:
    extra = {"cluster-constraint": "x"}
    cfg = job_config_from_dict(_set(BASE, "slurm.extra", extra), "jobs/x.yaml")
    assert cfg.slurm.extra == (("cluster-constraint", "x"),)


@pytest.mark.parametrize("own", [{"command": ["python", "t.py"]}, {"entrypoint": "a.b:c"}])
def test_a_program_of_its_own_may_use_several_gpus_per_rank(own: dict[str, Any]) -> None:
    """Model parallelism inside a rank is the program's business, not the trainer's."""
    for slurm in ({"gpus_per_task": 2}, {"gpus_per_node": 8, "tasks_per_node": 4}):
        cfg = job_config_from_dict({"name": "j", "slurm": slurm, **own}, "x")
        assert cfg.slurm.gpus_per_task in (2, None)


def test_data_loader_workers_default_to_auto_and_take_a_count() -> None:
    assert job_config_from_dict({"name": "j"}, "x").train.num_workers == "auto"
    for value in (0, 6, "auto"):
        cfg = job_config_from_dict({"name": "j", "train": {"num_workers": value}}, "x")
        assert cfg.train.num_workers == value
    message = _error({"name": "j", "train": {"num_workers": "many"}})
    assert "train.num_workers: 'many' is neither a number nor auto. HINT: write auto" in message
    assert "must be at least 0" in _error({"name": "j", "train": {"num_workers": -1}})


@pytest.mark.parametrize(("extra", "key", "fragment"), COMBINATIONS)
def test_impossible_combinations_are_refused(
    extra: dict[str, Any], key: str, fragment: str
) -> None:
    message = _error({"name": "job", **extra})
    assert message.startswith(f"jobs/x.yaml: {key}: ")
    assert "HINT:" in message
    assert fragment in message


def test_new_keys_defaults_and_accepted_values() -> None:
    cfg = job_config_from_dict({"name": "j"}, "x")
    assert cfg.slurm.srun_args == ()
    cfg = job_config_from_dict(
        {
            "name": "j",
            "slurm": {"mem": 0, "srun_args": ["--mpi=pmix", "-l", "--comment=a b; c"]},
            "env": {"container": {"runtime": "pyxis", "image": "img"}},
        },
        "x",
    )
    assert cfg.slurm.mem == "0"  # all of the node's memory
    assert cfg.slurm.srun_args == ("--mpi=pmix", "-l", "--comment=a b; c")
    assert cfg.env.container is not None
    assert cfg.env.container.python == "python3"  # not the login node's sys.executable
    for python in ("python3.11", "/opt/conda/bin/python", "/usr/local/bin/python3", "py+x_y-z"):
        data = {"name": "j", "env": {"container": {"runtime": "apptainer", "image": "i",
                                                   "python": python}}}  # fmt: skip
        container = job_config_from_dict(data, "x").env.container
        assert container is not None
        assert container.python == python


@pytest.mark.parametrize("mem", [0, "0", "0G", " 0M "])
def test_mem_zero_is_all_of_the_nodes_memory(mem: Any) -> None:
    assert job_config_from_dict({"name": "j", "slurm": {"mem": mem}}, "x").slurm.mem == "0"


JOBS = Path(__file__).parents[2] / "jobs"
SWEEP_FILES = {"sweep-lr.yaml"}


@pytest.mark.parametrize(
    "job", sorted(p.name for p in JOBS.glob("*.yaml") if p.name not in SWEEP_FILES)
)
def test_shipped_job_files_load_and_validate(job: str) -> None:
    cfg = load_job_config(JOBS / job)
    assert cfg.name
    assert job_config_from_dict(job_config_to_dict(cfg), "x") == cfg


def test_loading_and_checking_a_plain_job_loads_only_what_it_uses() -> None:
    """Every submit loads, validates and preflights its job: what a plain job does not use is
    imported where it is used (issue 40 item 6): JSON (for an argv's error only), elastic (a
    node range), the Charliecloud image checks, the import system's lookup (a module off the
    search path) and difflib (a typo's hint)."""
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "before = set(sys.modules)\n"
        "from hpc_ddp.config.load import load_job_config\n"
        "from hpc_ddp.config.preflight import preflight_job\n"
        "preflight_job(load_job_config(Path(sys.argv[1])), 'job')\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(JOBS / "quickstart.yaml")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    loaded = set(out.strip().strip("[]").replace("'", "").split(", "))
    assert "hpc_ddp.config.schema" in loaded
    unused = {
        "json",
        "hpc_ddp.config.elastic",
        "hpc_ddp.config.images",
        "importlib.util",
        "difflib",
    }
    assert not unused & loaded


def test_shipped_gpu_example_runs_one_task_per_gpu_with_gpus_per_node() -> None:
    slurm = load_job_config(JOBS / "resnet18-cifar10.yaml").slurm
    assert slurm.gpus_per_task is None  # per-task isolation can cut NCCL P2P/NVLink
    assert slurm.gpus_per_node is not None
    assert slurm.tasks_per_node == slurm.gpus_per_node


def test_name_is_required_and_top_level_must_be_a_mapping() -> None:
    assert "name: required key missing. HINT: start the file with 'name: my-job'" in _error({})
    assert "expected a mapping" in _error(["name", "x"])


def test_accepted_edge_values() -> None:
    cfg = job_config_from_dict(
        {
            "name": "a.b_c-1",
            "slurm": {"gpus_per_node": 4, "extra": {"gpus": "4", "exclude": "n1"}},
            "train": {"lr": 1, "model": "pkg.models:build", "max_steps": 5, "epochs": None},
            "dist": {"port": 1024},
            "command": ["python", ""],
        },
        "x",
    )
    assert cfg.train.lr == 1.0
    assert isinstance(cfg.train.lr, float)  # ints are accepted for floats
    assert cfg.slurm.extra == (("gpus", "4"), ("exclude", "n1"))  # 'gpus' is a real flag


# --- files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: a\nslurm:\n  nodes: 2\n   tasks_per_node: 1\n", "job.yaml:4:"),
        (
            "name: a\nslurm:\n  nodes: 2\n  nodes: 3\n",
            "job.yaml:4:3: invalid YAML: found duplicate",
        ),
        ("name: [a\n", "job.yaml:2:"),
        ("- a\n- b\n", "expected a mapping"),
        ("", "the job file is empty"),
        ("name: a\n1: 2\n", "key 1 is not a string"),
    ],
)
def test_bad_files_are_config_errors_with_location(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_job_config(path)
    assert str(info.value).startswith(str(path))
    assert fragment in str(info.value)
    assert "HINT:" in str(info.value)


def test_missing_job_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such job file\. HINT"):
        load_job_config(tmp_path / "nope.yaml")


def test_unknown_key_in_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: a\nslurm:\n  tasks_per_nod: 2\n")
    with pytest.raises(ConfigError) as info:
        load_job_config(path)
    assert str(info.value) == (
        f"{path}: slurm.tasks_per_nod: unknown key. HINT: did you mean 'slurm.tasks_per_node'?"
    )


# --- layering ------------------------------------------------------------------------------------


def test_layering_defaults_site_job_overrides() -> None:
    site = DATA / "site.yaml"
    job = DATA / "layered.yaml"
    cfg = load_job_config(job, site_profile=site)
    assert cfg.train.batch_size == 32  # default, set by no layer
    assert cfg.train.momentum == 0.8  # site, not overridden
    assert cfg.slurm.partition == "site-part"  # site
    assert cfg.train.lr == 0.3  # job beats site
    assert cfg.env.modules == ("job/module",)  # lists are replaced, not merged
    assert dict(cfg.env.vars) == {"SITE_VAR": "site", "SHARED": "from-job"}  # mappings merge
    assert dict(cfg.slurm.extra) == {"mail-type": "END", "comment": "site"}

    cfg = load_job_config(job, ["train.lr=0.4", "slurm.partition=cli"], site_profile=site)
    assert cfg.train.lr == 0.4  # override beats job
    assert cfg.slurm.partition == "cli"  # override beats site
    assert cfg.slurm.account == "site-acct"

    assert load_job_config(job).slurm.partition is None  # without the site profile


def test_site_profile_errors_name_the_site_file(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("slurm:\n  partion: gpu\n")
    with pytest.raises(ConfigError) as info:
        load_job_config(DATA / "layered.yaml", site_profile=site)
    assert str(info.value).startswith(f"{site}: slurm.partion: unknown key")
    assert "did you mean 'slurm.partition'?" in str(info.value)


def test_empty_site_profile_is_allowed(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("# nothing yet\n")
    assert load_job_config(DATA / "layered.yaml", site_profile=site).name == "layered"


def test_find_site_profile_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    explicit = tmp_path / "explicit.yaml"
    from_env = tmp_path / "env.yaml"
    for path in (explicit, from_env):
        path.write_text("{}\n")
    env = {"HPC_DDP_SITE": str(from_env)}
    assert find_site_profile(None, {}, home) is None  # nothing anywhere
    default = home / ".config" / "hpc-ddp" / "site.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("{}\n")
    assert find_site_profile(None, {}, home) == default
    assert find_site_profile(None, env, home) == from_env
    assert find_site_profile(str(explicit), env, home) == explicit
    assert find_site_profile("~/.config/hpc-ddp/site.yaml", {}, home) == default


@pytest.mark.parametrize(("explicit", "env", "origin"), [
    ("missing.yaml", {}, "--site"),
    (None, {"HPC_DDP_SITE": "missing.yaml"}, "$HPC_DDP_SITE"),
])  # fmt: skip
def test_find_site_profile_named_but_missing(
    tmp_path: Path, explicit: str | None, env: dict[str, str], origin: str
) -> None:
    with pytest.raises(ConfigError) as info:
        find_site_profile(explicit and str(tmp_path / explicit), env, tmp_path)
    assert str(info.value).startswith(f"{origin}: site profile")
    assert "HINT:" in str(info.value)


# --- overrides -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "dotted", "expected"),
    [
        ("train.lr=0.05", "train.lr", 0.05),
        ("slurm.exclusive=true", "slurm.exclusive", True),
        ("slurm.nodes=4", "slurm.nodes", 4),
        ("env.modules=[a, b]", "env.modules", ["a", "b"]),
        ("slurm.time=12:00:00", "slurm.time", "12:00:00"),
        ("slurm.partition=", "slurm.partition", None),
        ("env.vars.FOO=bar", "env.vars", {"A": "1", "FOO": "bar"}),
        ("slurm.extra.gres=gpu:2", "slurm.extra", {"gres": "gpu:2"}),
        ("slurm.extra.comment=a=b", "slurm.extra", {"comment": "a=b"}),
        ("env.vars={B: 2}", "env.vars", {"A": "1", "B": 2}),  # mappings merge
    ],
)
def test_apply_overrides_parses_values_as_yaml(override: str, dotted: str, expected: Any) -> None:
    data = {"name": "a", "train": {"lr": 0.1}, "env": {"vars": {"A": "1"}}}
    out = apply_overrides(data, [override])
    node: Any = out
    for part in dotted.split("."):
        node = node[part]
    assert node == expected
    assert data == {"name": "a", "train": {"lr": 0.1}, "env": {"vars": {"A": "1"}}}  # unchanged


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("train.lr", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("train..lr=1", "not a dotted key"),
        ("slurm.tasks_per_nod=2", "did you mean 'slurm.tasks_per_node'?"),
        ("lr=0.1", "did you mean 'train.lr'?"),
        ("train.lr.x=1", "'train.lr' is a value, not a section"),
        ("train.lr=abc", "expected a number, got string 'abc'"),
        ("train.lr=[", "cannot read '[' as a YAML value"),
        ("slurm.extra.output=x", "RUN_DIR/logs/"),
        ("env.vars.MASTER_ADDR=x", "use dist.port"),
        ('name="a\\nb"', "line break"),
    ],
)
def test_bad_overrides_are_override_errors_naming_them(override: str, fragment: str) -> None:
    with pytest.raises(OverrideError) as info:
        apply_overrides({"name": "a"}, [override])
    assert str(info.value).startswith(f"override {override!r}: ")
    assert fragment in str(info.value)
    assert "HINT:" in str(info.value)


def test_combination_broken_by_override_names_the_job_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_job_config(DATA / "full.yaml", ["command=[python, t.py]"])
    assert str(info.value).startswith(f"{DATA / 'full.yaml'} (with overrides): command:")


# --- round trip ----------------------------------------------------------------------------------

# Strings a YAML reader could take for something else, or that need quoting.
AWKWARD = ["yes", "no", "on", "12:00:00", "1:30", "1e-3", "007", "0x10", "null", "~", "true",
           "2024-01-01", "- a", "a: b", "#x", "x #y", "'q'", '"dq"', "{a}", "[b]", "*ref", "&a",
           "!tag", "%x", "@x", "`x", "  lead", "trail ", "ünï €", "$HOME/${X}", "a\tb", "=",
           "<<"]  # fmt: skip


def _random_config(rng: random.Random) -> JobConfig:
    """A valid config with randomly chosen fields: a seeded stand-in for property testing."""

    def word() -> str:
        return rng.choice(AWKWARD)

    data: dict[str, Any] = {"name": f"job-{rng.randrange(1000)}"}
    if rng.random() < 0.5:
        data["command"] = [word() for _ in range(rng.randrange(1, 5))]
    else:
        data["entrypoint"] = rng.choice(["a.b:c", "pkg.mod_1:run"])
    gpus = rng.choice([None, 1, 2])
    data["slurm"] = {
        "nodes": rng.randrange(1, 9),
        "tasks_per_node": rng.randrange(1, 9),
        "gpus_per_task": gpus,
        "gpus_per_node": None if gpus else rng.choice([None, 8]),
        "mem": rng.choice([None, "16G", "4000", "2048K", 1000]),
        "time": rng.choice([30, "1:30:00", "2-12", "36:00:00"]),
        "partition": rng.choice([None, word()]),
        "exclusive": rng.random() < 0.5,
        "extra": {f"flag{i}": rng.choice([None, word(), 7]) for i in range(rng.randrange(3))},
        "srun_args": rng.choice([[], ["--mpi=none"], [f"--comment={word()}", "-l"]]),
    }
    data["env"] = {
        "modules": [word() for _ in range(rng.randrange(3))],
        "setup": [word() for _ in range(rng.randrange(3))],
        "vars": {f"V{i}": rng.choice([word(), 3]) for i in range(rng.randrange(3))},
        "container": rng.choice(
            [
                None,
                {
                    "runtime": "pyxis",
                    "image": word(),
                    "binds": [word()],
                    "options": [],
                    "python": rng.choice(["python3", "/opt/py/bin/python3.11"]),
                },
            ]
        ),
    }
    data["dist"] = {"backend": rng.choice(["auto", "nccl"]), "port": rng.choice([None, 40000])}
    data["train"] = {
        "lr": rng.choice([1e-5, 0.1, 3, 1e20, 2.5e-7]),
        "weight_decay": rng.choice([0, 0.0, 1e-4]),
        "max_steps": rng.choice([None, 10]),
        "epochs": rng.choice([1, 5]),
        "data_root": rng.choice([None, word()]),
        "model": rng.choice(["mlp", "resnet18", "a.b:c"]),
        "amp": rng.random() < 0.5,
    }
    data["requeue"] = {"signal": rng.choice(["USR1", "USR2", "TERM"]), "lead_time": 60}
    return job_config_from_dict(data, "random")


@pytest.mark.parametrize("seed", range(40))
def test_round_trip_through_dict_and_yaml(seed: int, tmp_path: Path) -> None:
    cfg = _random_config(random.Random(seed))
    assert job_config_from_dict(job_config_to_dict(cfg), "x") == cfg
    text = dump_job_config(cfg)
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_resolved_config(path) == cfg
    # The dump reads back the same with a plain YAML 1.1 reader too.
    assert job_config_from_dict(yaml.safe_load(text), "x") == cfg


def test_libyamls_emitter_writes_what_the_python_emitter_writes() -> None:
    """dump_yaml uses libyaml's emitter when PyYAML has it: the text must be the Python
    emitter's, byte for byte, for every awkward value and for whole configs."""
    from hpc_ddp.config import yaml_dialect

    assert yaml.__with_libyaml__  # else this compares the Python emitter with itself

    class PythonDumper(yaml.SafeDumper):
        pass

    PythonDumper.yaml_implicit_resolvers = yaml_dialect._Dumper.yaml_implicit_resolvers
    PythonDumper.yaml_representers = dict(yaml_dialect._Dumper.yaml_representers)

    def python_dump(data: Any) -> str:
        text: str = yaml.dump(data, Dumper=PythonDumper, sort_keys=False, allow_unicode=True,
                              default_flow_style=False, width=2**16)  # fmt: skip
        return text

    values = [*AWKWARD, "", "multi\nline", "a\\b", "x" * 300, "\u00e9\u4e2d", 0, -1.5, 1e300,
              True, None, [], {}, ["a", 1, None], {"k": {"n": ["on", "off"]}}]  # fmt: skip
    for value in values:
        assert yaml_dialect.dump_yaml({"v": value}) == python_dump({"v": value}), value
    for seed in range(40):
        plain = job_config_to_dict(_random_config(random.Random(seed)))
        assert yaml_dialect.dump_yaml(plain) == python_dump(plain)


def test_full_fixture_round_trips(tmp_path: Path) -> None:
    cfg = load_job_config(DATA / "full.yaml")
    plain = job_config_to_dict(cfg)
    assert plain["slurm"]["extra"] == {"gres": "gpu:a100:4", "mail-type": "END", "nice": "10",
                                       "hold": None}  # fmt: skip
    assert plain["env"]["modules"] == ["cuda/12.4", "gcc/12"]
    (tmp_path / "config.yaml").write_text(dump_job_config(cfg), encoding="utf-8")
    assert load_resolved_config(tmp_path / "config.yaml") == cfg
    lists = {"extra": cfg.slurm.extra, "srun_args": tuple(plain["slurm"]["srun_args"])}
    assert SlurmConfig(**{**plain["slurm"], **lists}) == cfg.slurm


def test_load_resolved_config_missing_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no resolved config"):
        load_resolved_config(tmp_path / "config.yaml")


# --- login-node imports --------------------------------------------------------------------------


def test_loading_modules_import_no_torch_or_submitit() -> None:
    code = (
        "import sys, hpc_ddp.config.load, hpc_ddp.sweep.spec, hpc_ddp.config.units\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'torchvision', 'submitit', 'numpy', 'jinja2'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_an_override_over_a_limit_names_it_once_and_briefly(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n")
    big = "q" * 20_000
    with pytest.raises(OverrideError) as info:
        load_job_config(path, [f"slurm.qos={big}"])
    message = str(info.value)
    assert message.startswith("override 'slurm.qos=qqqq")
    assert "(20,010 characters): slurm.qos: a value has 20,000 characters, over" in message
    assert "HINT:" in message
    assert len(message) < 600


@pytest.mark.parametrize(
    ("dotted", "value", "fragment"),
    [
        ("requeue.signal", "SIG" + "X" * 9000, "(9,003 characters) is over hpc-ddp's limit"),
        ("dist.backend", "n" * 9000, "(9,000 characters) is not one of"),
        ("name", "n" * 129, "over hpc-ddp's limit of 128 characters for a job name"),
        ("slurm.extra", {"x" * 9000: "1"}, "slurm.extra: the name 'xxxx"),
        ("env.vars", {"V" * 129: "1"}, "(129 characters) is over hpc-ddp's limit of 128"),
    ],
)
def test_long_bad_values_are_quoted_in_part(dotted: str, value: Any, fragment: str) -> None:
    data = _set({"name": "x"}, dotted, value) if dotted != "name" else {"name": value}
    with pytest.raises(ConfigError) as info:
        job_config_from_dict(data, "api")
    message = str(info.value)
    assert fragment in message
    assert "HINT:" in message
    assert len(message) < 600
