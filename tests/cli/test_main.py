"""The CLI edge: exit codes, messages instead of tracebacks, and a light login-node path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.submission.submit import choose_backend

REPO = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize(
    ("requested", "sbatch", "expected"),
    [("auto", "/usr/bin/sbatch", "slurm"), ("auto", None, "local"), ("local", "/x", "local")],
)
def test_choose_backend(requested: str, sbatch: str | None, expected: str) -> None:
    asked: list[str] = []

    def on_path(command: str) -> str | None:
        asked.append(command)
        return sbatch

    assert choose_backend(requested, on_path) == expected
    assert asked == (["sbatch"] if requested == "auto" else [])  # a named one looks for nothing


def test_choose_backend_knows_every_backend_a_manifest_may_name() -> None:
    """Both ask the catalog: the same names."""
    from hpc_ddp.backends.catalog import backend_names
    from hpc_ddp.errors import ConfigError

    assert [choose_backend(name) for name in backend_names()] == list(backend_names())
    with pytest.raises(ConfigError, match=r"'pbs' is not one of auto, slurm, local\. HINT"):
        choose_backend("pbs")


def test_dry_run_prints_script_and_command_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Overrides after an option are still overrides (argparse alone would refuse them).
    code = main(
        [
            "submit",
            "jobs/quickstart.yaml",
            "--dry-run",
            "--runs-dir",
            str(tmp_path),
            "--backend",
            "slurm",
            "train.lr=0.2",
            "slurm.nodes=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=1\n" in out
    assert "# backend: slurm; would run: sbatch --parsable " in out
    assert not any(tmp_path.iterdir())


def test_dry_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["submit", "jobs/quickstart.yaml", "--dry-run", "--json", "--backend", "slurm"]
    assert main([*argv, "--runs-dir", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"][:2] == ["sbatch", "--parsable"]
    assert data["script"].startswith("#!/bin/bash")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["slurm.tasks_per_nod=2"], "did you mean 'slurm.tasks_per_node'"),
        (["slurm.time=25:99"], "slurm.time"),
        (["slurm.gpus_per_task=1", "slurm.gpus_per_node=2"], "HINT"),
        (["requeue.lead_time=900"], "requeue.lead_time"),
        (["notakey"], "unrecognized arguments"),
    ],
)
def test_config_mistakes_exit_2_with_a_message(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse exits itself on usage errors
        raise SystemExit(main(["submit", "jobs/quickstart.yaml", "--dry-run", *args]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize("backend", ["slurm", "local"])
@pytest.mark.parametrize("value", ["x\ny", "x\r", "a\n- b"])
def test_a_line_break_in_an_override_names_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: str, value: str
) -> None:
    """It was reported as ``context.submit_command`` (the script's header comment) on Slurm,
    and locally YAML silently folded it into a space: ``params.a`` became ``'x y'``."""
    argv = ["submit", "jobs/quickstart.yaml", f"params.a={value}", "--dry-run", "--backend",
            backend, "--runs-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"override {f'params.a={value}'!r}: params.a: the value {value!r} contains a line" in err
    assert "HINT: an override is one line" in err
    assert "context.submit_command" not in err
    assert not any(tmp_path.iterdir())


def test_missing_config_file_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "jobs/nope.yaml", "--dry-run"]) == 2
    assert "jobs/nope.yaml" in capsys.readouterr().err


def test_status_of_a_non_run_dir_says_what_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "12345", "--runs-dir", str(tmp_path)]) == 2
    assert "HINT" in capsys.readouterr().err


def test_login_node_commands_import_no_torch_or_submitit(tmp_path: Path) -> None:
    """submit --dry-run, status and init must not pay seconds for torch/torchvision/submitit."""
    probe = (
        "import sys\n"
        "from hpc_ddp.cli.main import main\n"
        "runs = sys.argv[-1]\n"
        "for argv in (['submit', 'jobs/quickstart.yaml', '--dry-run', '--runs-dir', runs,\n"
        "              '--backend', 'slurm'],\n"
        "             ['submit', 'jobs/quickstart.yaml', '--dry-run', '--runs-dir', runs,\n"
        "              '--backend', 'local'],\n"
        "             ['status', '--runs-dir', runs],\n"
        "             ['status', '--runs-dir', runs, '--goodput'],\n"
        "             ['nodes'], ['nodes', '--json'],\n"
        "             ['init', '--byo', runs + '/init']):\n"
        "    assert main(argv) == 0\n"
        "    if argv[0] == 'submit':  # only what a typo or a Slurm call needs is left out\n"
        "        assert not {'subprocess', 'difflib'} & set(sys.modules), argv\n"
        "    if argv[-1] == 'slurm':  # nor what reads runs back: the verb uses none of it\n"
        "        unused = {'hpc_ddp.api.targets', 'hpc_ddp.rundir.manifest', 'fcntl',\n"
        "                  'hpc_ddp.backends.arrays', 'hpc_ddp.sweep.records',\n"
        "                  'hpc_ddp.lemons.record', 'hpc_ddp.lemons.store'}  # no record\n"
        "        assert not unused & set(sys.modules), argv\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "               ('torch', 'torchvision', 'submitit', 'numpy'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_a_default_dry_run_imports_no_jinja2_and_no_shutil(tmp_path: Path) -> None:
    """The default script is written without Jinja2 (hpc_ddp.backends.slurm.default_script), and the
    help formatter finds the terminal's width without shutil: each was milliseconds of every
    submit. A user's own slurm.template still renders through Jinja2."""
    probe = (
        "import sys\n"
        "from hpc_ddp.cli.main import main\n"
        "runs, template = sys.argv[-2:]\n"
        "assert main(['submit', 'jobs/quickstart.yaml', '--dry-run', '--runs-dir', runs,\n"
        "             '--backend', 'slurm']) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jinja2', 'shutil')))\n"
        "assert main(['submit', 'jobs/quickstart.yaml', '--dry-run', '--runs-dir', runs,\n"
        "             '--backend', 'slurm', f'slurm.template={template}']) == 0\n"
        "print('jinja2' in sys.modules)\n"
    )
    template = tmp_path / "mine.j2"
    template.write_text("#!/bin/bash\n{{ sbatch_lines | join('\\n') }}\necho mine\n")
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "runs"), str(template)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.strip().splitlines()
    assert [x for x in lines if x.startswith("[")] == ["[]"]  # neither, by the default's
    assert lines[-1] == "True"  # the user's template: rendered by Jinja2
    assert "echo mine" in out


def test_the_python_api_on_a_login_node_imports_no_torch_or_submitit(tmp_path: Path) -> None:
    """The same promise for ``import hpc_ddp`` and its login-side API (issue 27): a dry run, a
    submit and a sweep (over a FakeSlurm), status, metrics, results and the listing of runs."""
    probe = (
        "import sys\n"
        "import hpc_ddp\n"
        "from hpc_ddp.api.job import plan_submit\n"
        "from hpc_ddp.backends.registry import Registry\n"
        "from hpc_ddp.backends.slurm.fake import FakeSlurm\n"
        "runs = sys.argv[-1]\n"
        "fake = Registry(FakeSlurm().client())\n"
        "for backend in ('slurm', 'local'):  # what --dry-run shows\n"
        "    assert plan_submit('jobs/quickstart.yaml', {'train.lr': 0.1}, backend=backend,\n"
        "                       runs_dir=runs, backends=fake).cfg.train.lr == 0.1\n"
        "job = hpc_ddp.submit('jobs/quickstart.yaml', {'train.lr': 0.1}, backend='slurm',\n"
        "                     runs_dir=runs, backends=fake)\n"
        "assert hpc_ddp.Job.from_run_dir(job.run_dir, backends=fake).status().state == 'PENDING'\n"
        "assert job.metrics() == []\n"
        "sweep = hpc_ddp.submit_sweep('jobs/sweep-lr.yaml', runs_dir=runs, backends=fake)\n"
        "assert len(sweep.results()) == len(sweep.tasks()) == 6\n"
        "assert sweep.status().summary['pending'] == 6\n"
        "assert len(hpc_ddp.runs(runs, backends=fake)) == 2\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "               ('torch', 'torchvision', 'submitit', 'numpy'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "argv",
    [["status", "{run}", "--attempts"], ["status", "--runs-dir", "{runs}", "--json"],
     ["logs", "{run}"], ["checkpoints", "{run}"],
     ["submit", "jobs/quickstart.yaml", "--dry-run", "--backend", "slurm"]],
)  # fmt: skip
def test_a_reader_that_went_away_ends_every_verb_with_141_and_no_traceback(
    tmp_path: Path, argv: list[str]
) -> None:
    """``hpc-ddp status --attempts | head -1``: the reader closes the pipe. Here it is closed
    before hpc-ddp writes at all, so the very first write finds it gone, every time."""
    from hpc_ddp.rundir.layout import RunPaths
    from hpc_ddp.rundir.manifest import Manifest, write_manifest

    run = tmp_path / "runs" / "a"
    paths = RunPaths(run)
    paths.logs.mkdir(parents=True)
    paths.checkpoints.mkdir()
    paths.rank_log(0, "err").write_text("step 1\n" * 100)
    write_manifest(paths, Manifest("a", "local", "4194304", "2026-01-01T00:00:00+00:00",
                                   ["x"], "job.yaml", str(run)))  # fmt: skip
    args = [a.format(run=run, runs=run.parent) for a in argv]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "hpc_ddp", *args], cwd=REPO,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                              check=False)  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141, done.stderr


# --- --json when a verb fails: one error object on stdout ------------------------------------

# A failing invocation of every verb that takes --json (each fails before it needs Slurm).
FAILING_JSON = {
    "submit": ["submit", "/nonexistent/job.yaml", "--json", "--dry-run"],
    "resume": ["resume", "/nonexistent/run", "--json"],
    "status": ["status", "/nonexistent/run", "--json"],
    "results": ["results", "/nonexistent/sweep", "--json"],
    "sweep": ["sweep", "/nonexistent/sweep.yaml", "--json"],
    "cancel": ["cancel", "/nonexistent/run", "--json"],
    "checkpoints": ["checkpoints", "/nonexistent/run", "--json"],
    "doctor": ["doctor", "/nonexistent/job.yaml", "--json"],
    "nodes": ["nodes", "--forget", "a b", "--json"],
    "dev-cluster": [
        "dev-cluster",
        "up",
        "--json",
        "--nodes",
        "0",
        "--state-dir",
        "/nonexistent/dc",
    ],
}


def _verbs_with_json() -> set[str]:
    import argparse

    from hpc_ddp.cli.main import COMMANDS, _load

    found = set()
    for verb, (module, _) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        _load(module).add_arguments(parser)
        if "--json" in parser._option_string_actions:
            found.add(verb)
    return found


def test_every_verb_with_json_has_a_failing_case_here() -> None:
    assert _verbs_with_json() == set(FAILING_JSON)


@pytest.mark.parametrize("verb", sorted(FAILING_JSON))
def test_a_failed_json_command_prints_one_error_object_on_stdout(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ddp.output import ERROR

    code = main(FAILING_JSON[verb])
    captured = capsys.readouterr()
    assert code in (1, 2), captured
    shown = json.loads(captured.out)  # one object and nothing else
    assert list(shown) == ["schema", "verb", "error", "hint", "exit_code"]
    assert (shown["schema"], shown["verb"], shown["exit_code"]) == (ERROR, verb, code)
    assert ERROR == "hpc-ddp.error/1"
    # The same words as stderr's line, split at the HINT.
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(f"hpc-ddp {verb}: error: {shown['error']}")
    assert shown["hint"]
    assert line.endswith(f"HINT: {shown['hint']}")
    assert "HINT" not in shown["error"]


def test_without_json_a_failure_prints_nothing_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["status", "/nonexistent/run"]) == 2
    assert capsys.readouterr().out == ""


def test_an_error_after_the_verbs_own_object_prints_no_second_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``submit --wait --json`` prints its object, then the wait may fail: stdout keeps one
    object (the error still goes to stderr)."""
    import argparse
    import types

    import hpc_ddp.cli.main as cli
    from hpc_ddp.errors import RunFailedError

    def run(args: argparse.Namespace) -> int:
        print(json.dumps({"schema": "hpc-ddp.submit/1", "job_id": "1"}))
        raise RunFailedError("the run failed")

    fake = types.SimpleNamespace(
        add_arguments=lambda p: p.add_argument("--json", action="store_true"),
        run=run,
    )
    monkeypatch.setitem(cli.COMMANDS, "fake", ("cmd_fake", "a test verb"))
    monkeypatch.setattr(cli, "_load", lambda module: fake)
    assert main(["fake", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"schema": "hpc-ddp.submit/1", "job_id": "1"}
    assert "hpc-ddp fake: error: the run failed" in captured.err


def test_an_error_without_a_hint_has_a_null_hint() -> None:
    from hpc_ddp.output import error_document

    assert error_document("status", "it broke", 1) == {
        "schema": "hpc-ddp.error/1", "verb": "status", "error": "it broke", "hint": None,
        "exit_code": 1,
    }  # fmt: skip
    assert error_document("x", "A failed; HINT: do B.", 2)["error"] == "A failed"


def test_supervise_asks_the_node_registry_through_the_registry_it_was_handed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``supervise`` gets its Slurm client from ``args.backends``, as every verb gets its runs'
    backends: the one ``main(argv, backends=)`` was handed reaches the node registry."""
    from hpc_ddp.backends import node_registry
    from hpc_ddp.backends.registry import Registry
    from hpc_ddp.backends.slurm.fake import FakeSlurm
    from hpc_ddp.errors import BackendError

    registry = Registry(FakeSlurm().client())
    runs = tmp_path / "runs"
    argv = ["submit", "jobs/quickstart.yaml", "--backend", "slurm", "--runs-dir", str(runs)]
    assert main(argv, backends=registry) == 0
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SLURMD_"))]:
        monkeypatch.delenv(key)
    asked: list[object] = []

    def launcher_for(
        env: object, argv: list[str], *, clients: Callable[[str], object | None]
    ) -> None:
        asked.append((argv, clients("slurm")))
        raise BackendError("asked")

    monkeypatch.setattr(node_registry, "launcher_for", launcher_for)
    assert main(["supervise", str(run_dir), "--", "srun", "x"], backends=registry) == 1
    assert asked == [(["srun", "x"], registry.slurm)]
