"""Submit-time checks (hpc_ddp.config.preflight): names with did-you-mean, data_root, import strings
found without importing, command programs and scripts, and the warn-instead-of-error rule for
jobs whose environment (container, modules, setup) may hold what this machine lacks.

The table tests run against a fabricated login node (a temporary directory with its own PATH
and module path); the CLI tests run ``main()`` from the repository root."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.loginnode import LoginNode, expand_path, this_machine
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.preflight import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    TORCHVISION_MODELS,
    TORCHVISION_MODELS_VERSION,
    check_job,
    preflight_job,
    preflight_points,
)
from hpc_ddp.config.programs import find_module
from hpc_ddp.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> LoginNode:
    """A login node in ``tmp_path/work`` with ``tmp_path/bin`` as PATH and ``tmp_path/site`` as
    its only package directory: nothing of this machine's leaks in."""
    work, bin_dir, site = tmp_path / "work", tmp_path / "bin", tmp_path / "site"
    for d in (work / "mypkg", work / "libs" / "extra", bin_dir, site / "installed" / "sub",
              work / "data", work / "app", tmp_path / "home" / "data"):  # fmt: skip
        d.mkdir(parents=True)
    (work / "app" / "__main__.py").write_text("")
    (work / "mypkg" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (work / "mypkg" / "models.py").write_text("")
    (work / "single.py").write_text("")  # a module, not a package
    (work / "train.py").write_text("")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    (work / "notes.txt").write_text("")
    (work / "libs" / "extra" / "tool.py").write_text("")
    (site / "installed" / "__init__.py").write_text("")
    (site / "installed" / "sub" / "__init__.py").write_text("")
    for name in ("python", "torchrun", "ch-run"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    # A Charliecloud directory image: its interpreters and the directories binds may land on.
    image = tmp_path / "img"
    for inside in ("opt/venv/bin", "usr/bin", "scratch", "tmp"):
        (image / inside).mkdir(parents=True)
    (image / "usr" / "bin" / "python3").symlink_to("python3.11")  # dangling here: as in images
    (image / "opt" / "venv" / "bin" / "python").write_text("")
    (tmp_path / "img.sqfs").write_text("hsqs")
    return LoginNode(
        cwd=work,
        path=str(bin_dir),
        python_path=(str(site),),
        torchvision_version=lambda: TORCHVISION_MODELS_VERSION,
        use_import_system=False,
        environ={"HOME": str(tmp_path / "home"), "STAGE": str(work)},
    )


def job(**sections: Any) -> JobConfig:
    return job_config_from_dict({"name": "j", **sections}, "t")


CONTAINER = {"container": {"runtime": "apptainer", "image": "/images/t.sif"}}


def ch(**container: Any) -> dict[str, Any]:
    """An ``env`` section with a Charliecloud container on the node fixture's image."""
    return {"container": {"runtime": "charliecloud", "image": "../img", **container}}


OK, ERROR, WARN = "ok", "error", "warn"

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, job sections, outcome, fragment of the message)
    ("defaults", {}, OK, ""),
    ("torchvision-model", {"train": {"model": "resnet18"}}, OK, ""),
    ("model-typo", {"train": {"model": "resnet181"}}, ERROR,
     "train.model: 'resnet181' is not a known model. HINT: did you mean 'resnet18'"),
    ("model-unknown", {"train": {"model": "transformer"}}, ERROR, "HINT: use 'mlp', a torchvision"),
    ("model-typo-despite-setup", {"train": {"model": "resnet181"}, "env": {"setup": ["x"]}},
     ERROR, "did you mean 'resnet18'"),
    ("dataset-typo", {"train": {"dataset": "cifar"}}, ERROR,
     "train.dataset: 'cifar' is not a known dataset. HINT: did you mean 'cifar10'"),
    ("dataset-unknown", {"train": {"dataset": "imagenet22k"}}, ERROR,
     "HINT: use one of synthetic, cifar10, mnist, imagefolder"),
    ("staged-without-root", {"train": {"dataset": "mnist"}}, ERROR,
     "train.data_root: is not set, and train.dataset 'mnist' is read from pre-staged files"),
    ("staged-with-root", {"train": {"dataset": "imagefolder", "data_root": "data"}}, OK, ""),
    ("staged-root-from-env", {"train": {"dataset": "mnist", "data_root": "$STAGE/data"}}, OK, ""),
    ("staged-root-from-env-braced", {"train": {"dataset": "mnist", "data_root": "${STAGE}/data"}},
     OK, ""),
    ("staged-root-in-home", {"train": {"dataset": "cifar10", "data_root": "~/data"}}, OK, ""),
    # Not here is not an error: the data may be staged where only the compute nodes look.
    ("staged-root-missing", {"train": {"dataset": "cifar10", "data_root": "/no/such/data"}},
     WARN, "train.data_root: '/no/such/data' does not exist on this machine; it may exist only "
     "on the compute nodes. HINT: stage the data there"),
    ("staged-root-var-unset", {"train": {"dataset": "cifar10", "data_root": "/s/$NOPE/data"}},
     WARN, "HINT: $NOPE: not set here; the nodes must set it"),
    ("staged-root-expanded", {"train": {"dataset": "cifar10", "data_root": "$STAGE/nope"}}, WARN,
     "'$STAGE/nope' ("),
    ("staged-root-a-file", {"train": {"dataset": "imagefolder", "data_root": "notes.txt"}}, WARN,
     "'notes.txt' is not a directory on this machine"),
    ("synthetic-ignores-root", {"train": {"data_root": "/no/such/data"}}, OK, ""),
    ("model-module-in-cwd", {"train": {"model": "mypkg.models:Net"}}, OK, ""),
    ("dataset-module-installed", {"train": {"dataset": "installed.sub:make"}}, OK, ""),
    ("model-module-missing", {"train": {"model": "nopkg.models:Net"}}, ERROR,
     "train.model: module 'nopkg.models' of 'nopkg.models:Net' cannot be found"),
    ("submodule-missing", {"train": {"model": "mypkg.nothere:Net"}}, ERROR,
     "module 'mypkg.nothere'"),
    ("module-not-a-package", {"train": {"dataset": "single.sub:make"}}, ERROR,
     "module 'single.sub'"),
    ("module-on-job-pythonpath", {"train": {"model": "extra.tool:Net"},
                                  "env": {"vars": {"PYTHONPATH": "libs"}}}, OK, ""),
    ("module-missing-container", {"train": {"model": "nopkg:Net"}, "env": CONTAINER}, WARN,
     "may exist only in the job's environment (a container)"),
    ("module-missing-modules", {"train": {"model": "nopkg:Net"}, "env": {"modules": ["m"]}},
     WARN, "(env.modules)"),
    ("module-missing-setup", {"train": {"model": "nopkg:Net"}, "env": {"setup": ["s"]}}, WARN,
     "(env.setup)"),
    ("entrypoint-found", {"entrypoint": "mypkg.models:main"}, OK, ""),
    ("entrypoint-missing", {"entrypoint": "nopkg.train:main"}, ERROR,
     "entrypoint: module 'nopkg.train' of 'nopkg.train:main' cannot be found"),
    ("trainer-names-unused-with-entrypoint",
     {"entrypoint": "mypkg.models:main", "train": {"model": "bogus"}}, OK, ""),
    ("trainer-names-unused-with-command", {"command": ["torchrun"], "train": {"dataset": "x"}},
     OK, ""),
    ("program-on-path", {"command": ["torchrun", "--nproc-per-node", "2", "x"]}, OK, ""),
    ("program-not-on-path", {"command": ["pythn", "train.py"]}, ERROR,
     "command[0]: program 'pythn' is not on PATH"),
    ("program-not-on-path-container", {"command": ["pythn"], "env": CONTAINER}, WARN,
     "program 'pythn' is not on PATH; it may exist only in the job's environment"),
    ("program-file", {"command": ["./run.sh", "--fast"]}, OK, ""),
    ("program-file-missing", {"command": ["./nope.sh"]}, ERROR,
     "command[0]: program './nope.sh' does not exist"),
    ("program-a-directory", {"command": ["./mypkg"]}, ERROR,
     "command[0]: program './mypkg' is a directory"),
    ("program-not-executable", {"command": ["./notes.txt"]}, ERROR,
     "is not executable. HINT: chmod +x ./notes.txt"),
    ("python-script", {"command": ["python", "-u", "-X", "dev", "train.py", "--lr", "1"]}, OK, ""),
    ("python-script-missing", {"command": ["python", "-u", "trian.py"]}, ERROR,
     "command: python script 'trian.py' does not exist"),
    ("python-script-missing-setup", {"command": ["python", "trian.py"],
                                     "env": {"setup": ["cd /x"]}}, WARN, "(env.setup)"),
    ("python-module", {"command": ["python", "-m", "mypkg.models", "--x"]}, OK, ""),
    ("python-module-missing", {"command": ["python", "-m", "mypkg.trainer"]}, ERROR,
     "python -m mypkg.trainer: module 'mypkg.trainer' cannot be found"),
    ("python-code", {"command": ["python", "-c", "print(1)"]}, OK, ""),
    ("python-runs-a-directory", {"command": ["python", "app", "--x"]}, OK, ""),  # __main__.py
    ("python-script-a-directory", {"command": ["python", "libs"]}, ERROR,
     "command: python script 'libs' is a directory without a __main__.py"),
    ("python-by-path", {"command": ["../bin/python", "missing.py"]}, ERROR,
     "python script 'missing.py'"),
    # NCCL without GPUs asked: the tasks see none unless the site hands them out anyway.
    ("nccl-without-gpus", {"dist": {"backend": "nccl"}}, WARN,
     "dist.backend: is nccl, but the job asks for no GPUs"),
    ("nccl-with-gpus", {"dist": {"backend": "nccl"}, "slurm": {"gpus_per_task": 1}}, OK, ""),
    ("nccl-with-gres", {"dist": {"backend": "nccl"}, "slurm": {"extra": {"gres": "gpu:2"}},
                        "command": ["python", "train.py"]}, OK, ""),
    # A Charliecloud directory image is looked into: its python, the directories binds land on.
    ("ch-image", {"env": ch(python="/opt/venv/bin/python", binds=["/scratch"])}, OK, ""),
    ("ch-python-by-name", {"env": ch(python="python3")}, OK, ""),  # /usr/bin: PATH's fallback
    ("ch-python-not-in-image", {"env": ch(python="/opt/conda/bin/python")}, ERROR,
     "env.container.python: '/opt/conda/bin/python' is not in the image"),
    ("ch-python-name-not-in-image", {"env": ch(python="python3.12")}, ERROR,
     "env.container.python: 'python3.12' is not found in the image"),
    ("ch-python-name-setup-may-add-it", {"env": {**ch(python="python3.12"), "setup": ["x"]}},
     WARN, "'python3.12' is not found in the image"),
    ("ch-bind-target-missing", {"env": ch(binds=["/scratch", "/work"])}, ERROR,
     "env.container.binds: '/work': the image"),
    ("ch-bind-target-elsewhere", {"env": ch(binds=["/data/x:/scratch"])}, OK, ""),
    ("ch-bind-target-missing-dst", {"env": ch(binds=["/scratch:/data"])}, ERROR,
     "has no directory /data"),
    ("ch-bind-writable-image", {"env": ch(binds=["/work"], options=["-w"])}, OK, ""),
    ("ch-image-missing", {"env": ch(image="/no/such/image")}, WARN,
     "env.container.image: '/no/such/image' does not exist on this machine"),
    ("ch-image-name-in-storage", {"env": ch(image="pytorch", python="/x")}, OK, ""),
    ("ch-image-squashfs", {"env": ch(image="../img.sqfs", python="/x")}, OK, ""),
    ("apptainer-image-not-looked-into", {"env": {"container": {
        "runtime": "apptainer", "image": "../img", "python": "/x", "binds": ["/work"]}}}, OK, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("sections", "outcome", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_job(node: LoginNode, sections: dict[str, Any], outcome: str, fragment: str) -> None:
    found = check_job(job(**sections), node)
    if outcome == OK:
        assert found.error is None
        assert found.warnings == ()
        return
    messages = [f"{k}: {t}" for k, t in found.warnings]
    if outcome == ERROR:
        assert found.error is not None, messages
        messages = [f"{found.error[0]}: {found.error[1]}"]
    else:
        assert found.error is None
        assert len(messages) == 1
    assert fragment in messages[0]
    assert "HINT:" in messages[0]


@pytest.mark.parametrize(
    ("cwd", "sections", "error"),
    [
        ("/srv/project", {}, "env.container.binds: the job's working directory '/srv/project'"),
        ("/scratch/alice/project", {}, None),  # under a bind that keeps its path
        ("/srv/project", {"slurm": {"extra": {"chdir": "/scratch/alice"}}}, None),
        ("/srv/project", {"slurm": {"extra": {"chdir": "/srv/x"}}}, "directory '/srv/x'"),
        ("/srv/project", {"env": {"container": {"options": ["--home"]}}}, None),  # ch-run tells
    ],
)
def test_charliecloud_tasks_must_see_the_working_directory(
    node: LoginNode, tmp_path: Path, cwd: str, sections: dict[str, Any], error: str | None
) -> None:
    """ch-run starts each task where the job was submitted from (``--cd``)."""
    env = ch(image=str(tmp_path / "img"), binds=["/scratch"])
    env["container"].update(sections.pop("env", {}).get("container", {}))
    found = check_job(job(env=env, **sections), dataclasses.replace(node, cwd=Path(cwd)))
    if error is None:
        assert found.error is None, found.error
    else:
        assert found.error is not None
        assert error in f"{found.error[0]}: {found.error[1]}"
        assert "HINT: add a directory that holds it to env.container.binds" in found.error[1]


def test_ch_run_missing_here_is_a_warning(node: LoginNode) -> None:
    found = check_job(job(env=ch()), dataclasses.replace(node, path="/nonexistent"))
    assert found.error is None
    [(key, text)] = found.warnings
    assert key == "env.container.runtime"
    assert "ch-run is not on PATH on this machine" in text
    assert "HINT: load what provides it" in text


def test_python_and_python3_need_no_python_on_path(node: LoginNode, tmp_path: Path) -> None:
    """They run the task's own interpreter (job.command.command_argv), not PATH's: a login
    shell without any python on PATH is no reason to refuse them. Their scripts still count."""
    bare = dataclasses.replace(node, path=str(tmp_path / "empty"))
    for program in ("python", "python3"):
        assert check_job(job(command=[program, "train.py"]), bare).error is None
        assert check_job(job(command=[program, "-m", "mypkg.models"]), bare).error is None
        error = check_job(job(command=[program, "trian.py"]), bare).error
        assert error is not None
        assert "python script 'trian.py' does not exist" in error[1]
    error = check_job(job(command=["python3.11", "train.py"]), bare).error  # run as written
    assert error == (
        "command[0]",
        "program 'python3.11' is not on PATH. HINT: check the spelling, give its full path, or "
        "load what provides it in env.setup",
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/scratch/$USER/data", "/scratch/alice/data"),
        ("/scratch/${USER}/data", "/scratch/alice/data"),
        ("$SCRATCH/$USER", "/lustre/alice"),
        ("~/data", "/home/alice/data"),
        ("~", "/home/alice"),
        ("/d/$UNSET/x", "/d/$UNSET/x"),  # left as written: the message shows which is missing
        ("/d/~/x", "/d/~/x"),  # only a leading ~ is the home
        ("/plain/path", "/plain/path"),
        ("$USER_DIR", "$USER_DIR"),  # the whole name, not a prefix of it
    ],
)
def test_expand_path_like_a_shell(value: str, expected: str) -> None:
    env = {"USER": "alice", "SCRATCH": "/lustre", "HOME": "/home/alice/"}
    assert expand_path(value, env) == expected


def test_a_newer_torchvision_here_turns_an_unknown_model_into_a_warning(node: LoginNode) -> None:
    newer = LoginNode(node.cwd, node.path, node.python_path, lambda: (0, 99), False)
    found = check_job(job(train={"model": "resnet181"}), newer)
    assert found.error is None
    [(key, text)] = found.warnings
    assert key == "train.model"
    assert "torchvision 0.99 here may have it" in text
    assert check_job(job(train={"model": "resnet181"}), node).error is not None


def test_find_module_never_imports(node: LoginNode) -> None:
    # mypkg/__init__.py raises when imported: finding mypkg.models must not run it.
    assert find_module("mypkg.models", [str(node.cwd)], use_import_system=False)
    assert "mypkg" not in sys.modules
    assert not find_module("mypkg.models", [str(node.cwd / "libs")], use_import_system=False)


def test_find_module_asks_the_import_system_for_installed_packages() -> None:
    assert find_module("yaml.constructor", [], use_import_system=True)
    assert not find_module("yaml.constructor", [], use_import_system=False)
    assert not find_module("no_such_top_level_module_xyz", [], use_import_system=True)


def test_this_machine_reads_its_environment() -> None:
    here = this_machine({"PATH": "/opt/x/bin"})
    assert here.path == "/opt/x/bin"
    assert here.cwd == Path.cwd()
    assert here.python_path == tuple(sys.path)
    assert here.torchvision_version() is not None  # installed with hpc-ddp
    assert here.environ == {"PATH": "/opt/x/bin"}  # what data_root's $VARS expand to


def test_preflight_job_raises_with_the_source_and_logs_warnings(
    node: LoginNode, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match=r"^jobs/x\.yaml: train\.model: 'resnet181'"):
        preflight_job(job(train={"model": "resnet181"}), "jobs/x.yaml", node)
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.config.preflight"):
        preflight_job(job(command=["pythn"], env=CONTAINER), "jobs/x.yaml", node)
    assert [r.getMessage().split(": program")[0] for r in caplog.records] == [
        "jobs/x.yaml: command[0]"
    ]


def test_preflight_points_checks_each_distinct_job_once_and_names_the_point(
    node: LoginNode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = check_job

    def counting(cfg: JobConfig, login: LoginNode) -> Any:
        calls.append(cfg.name)
        return real(cfg, login)

    monkeypatch.setattr("hpc_ddp.config.preflight.check_job", counting)
    points = [
        (f"s.yaml: point {i}", job(train={"lr": 0.1 * (i + 1)}, command=["pythn"], env=CONTAINER))
        for i in range(5)
    ]
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.config.preflight"):
        preflight_points(points, node)
    assert len(calls) == 1  # train.lr is not looked at: one check for five points
    [record] = caplog.records
    assert record.getMessage().startswith("s.yaml: point 0 and 4 more: command[0]: program")

    bad = [*points[:2], ("s.yaml: point 2", job(train={"model": "resnet181"}))]
    with pytest.raises(ConfigError, match=r"^s\.yaml: point 2: train\.model: 'resnet181'"):
        preflight_points(bad, node)


# --- through the command line -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["train.model=resnet181"], "did you mean 'resnet18'"),
        (["train.dataset=cifar10"], "train.data_root: is not set"),
        (["train.model=no_such_pkg_xyz.models:Net"], "module 'no_such_pkg_xyz.models'"),
        (["command=[no-such-program-xyz]"], "program 'no-such-program-xyz' is not on PATH"),
        (["command=[python, no_such_script.py]"], "python script 'no_such_script.py'"),
    ],
)
def test_submit_refuses_before_writing_anything(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    fragment: str,
) -> None:
    monkeypatch.chdir(REPO)
    runs = tmp_path / "runs"
    rc = main(["submit", "jobs/quickstart.yaml", *overrides, "--dry-run", "--runs-dir", str(runs)])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.startswith("hpc-ddp submit: error: jobs/quickstart.yaml: ")
    assert fragment in captured.err
    assert "HINT:" in captured.err
    assert captured.out == ""
    assert not runs.exists()


def test_submit_warns_and_goes_on_when_the_job_brings_its_environment(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    argv = ["submit", "jobs/quickstart.yaml", "train.model=site_only_pkg.models:Net",
            "env.modules=[pytorch/2.4]", "--dry-run", "--runs-dir", str(tmp_path)]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.config.preflight"):
        assert main(argv) == 0
    [record] = caplog.records
    assert record.getMessage().startswith("jobs/quickstart.yaml: train.model: module")
    assert "(env.modules)" in record.getMessage()
    assert "#SBATCH" in capsys.readouterr().out


def test_sweep_names_the_bad_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        f"base: {REPO / 'jobs' / 'quickstart.yaml'}\n"
        "sweep:\n  list: [{train.model: mlp}, {train.model: resnet181}]\n"
    )
    rc = main(["sweep", str(sweep), "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    captured = capsys.readouterr()
    assert rc == 2
    assert f"{sweep}: point 1: train.model: 'resnet181' is not a known model" in captured.err
    assert captured.out == ""


def test_checking_an_import_string_imports_neither_torch_nor_the_module(tmp_path: Path) -> None:
    """find_spec("torchvision.models") would import torchvision, and torch with it."""
    code = (
        "import sys\nfrom hpc_ddp.cli.main import main\n"
        "rc = main(['submit', 'jobs/quickstart.yaml', 'train.model=torchvision.models:resnet18',"
        f" '--dry-run', '--runs-dir', {str(tmp_path)!r}])\n"
        "assert rc == 0, rc\n"
        "heavy = {'torch', 'torchvision', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


# --- the static name lists against the real libraries -------------------------------------------


@pytest.mark.torch
def test_the_model_list_is_torchvisions() -> None:
    import importlib.metadata

    from hpc_ddp.train.models import torchvision_model_names

    installed = set(torchvision_model_names())
    # Every model the installed torchvision has must pass the submit-time check ...
    assert installed <= set(TORCHVISION_MODELS), sorted(installed - set(TORCHVISION_MODELS))
    # ... and the list is exactly the release it says it was taken from.
    version = tuple(int(p) for p in importlib.metadata.version("torchvision").split(".")[:2])
    if version == TORCHVISION_MODELS_VERSION:
        assert set(TORCHVISION_MODELS) == installed
    assert not set(BUILTIN_MODELS) & installed


@pytest.mark.torch
def test_the_dataset_list_is_what_data_builds() -> None:
    from hpc_ddp.train import data

    assert data.BUILTIN is BUILTIN_DATASETS
    with pytest.raises(ConfigError, match="did you mean 'cifar10'"):
        data.build_dataset(job(train={"dataset": "cifar"}).train, train=True)


# --- another cluster, however it is named ------------------------------------------------------

CLUSTERS_SAID = "multi-cluster is not supported yet"


@pytest.mark.parametrize(
    ("section", "value", "key"),
    [
        ("env", {"vars": {"SLURM_CLUSTERS": "other"}}, "env.vars.SLURM_CLUSTERS"),
        ("env", {"vars": {"SBATCH_CLUSTERS": "other"}}, "env.vars.SBATCH_CLUSTERS"),
        ("slurm", {"srun_args": ["-Mother"]}, "slurm.srun_args[0]"),
        ("slurm", {"srun_args": ["--mpi=pmix", "-M"]}, "slurm.srun_args[1]"),
        ("slurm", {"srun_args": ["--clusters=other"]}, "slurm.srun_args[0]"),
        ("slurm", {"srun_args": ["--cluster=other"]}, "slurm.srun_args[0]"),
        ("slurm", {"srun_args": ["--clus=other"]}, "slurm.srun_args[0]"),
    ],
)
def test_another_cluster_in_the_config_is_refused(section: str, value: Any, key: str) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(key) + f".*another cluster.*HINT: {CLUSTERS_SAID}"
    ):
        job(**{section: value})


def test_srun_options_that_merely_start_like_clusters_pass() -> None:
    cfg = job(slurm={"srun_args": ["--cluster-constraint=x", "--mpi=pmix", "--mem-bind=local"]})
    assert cfg.slurm.srun_args[0] == "--cluster-constraint=x"


@pytest.mark.parametrize("name", ["SBATCH_CLUSTERS", "SLURM_CLUSTERS"])
def test_another_cluster_in_the_submitting_environment_is_refused(
    node: LoginNode, name: str
) -> None:
    here = dataclasses.replace(node, environ={**node.environ, name: "other"})
    found = check_job(job(), here)
    assert found.error is not None
    key, text = found.error
    assert key == f"${name}"
    assert "is set in this environment ('other'), which submits to another cluster" in text
    assert f"HINT: {CLUSTERS_SAID}" in text
    assert text.endswith(f"or unset {name} to use this one")
    # Empty counts as unset, as for Slurm.
    assert check_job(job(), dataclasses.replace(node, environ={name: ""})).error is None


def test_submit_with_sbatch_clusters_set_is_refused_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SBATCH_CLUSTERS", "other")
    runs = tmp_path / "runs"
    rc = main(["submit", "jobs/quickstart.yaml", "--dry-run", "--runs-dir", str(runs)])
    captured = capsys.readouterr()
    assert rc == 2
    assert "jobs/quickstart.yaml: $SBATCH_CLUSTERS: is set in this environment" in captured.err
    assert not runs.exists()
