"""``hpc-ddp sweep`` and ``hpc-ddp results`` end to end through ``main()``, against a
:class:`~hpc_ddp.backends.slurm.fake.FakeSlurm` (the real dev cluster runs them in test_sweep_e2e),
and a check that neither command imports torch or submitit."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpc_ddp.cli.main as cli_main
from hpc_ddp.backends.arrays import read_arrays
from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.errors import SlurmUnavailableError
from hpc_ddp.rundir.endcause import EndCause
from tests.ledgers import record_end, record_start

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """A scripted Slurm behind every ``main([...])`` here (the CLI's one seam that would build
    the real client answers with it); its job ids start at 501."""
    fake = FakeSlurm(first_job_id=501)
    monkeypatch.setattr(cli_main, "_real_backends", lambda: Registry(fake.client()))
    # A login node: `sbatch` on PATH, so that --backend auto means Slurm (never run: the fake
    # client answers).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("HPC_DDP_SITE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/hpc-ddp/site.yaml
    return fake


def empty_queue(slurm: FakeSlurm) -> None:
    """Every job submitted so far has left the queue (and slurmctld forgot it)."""
    for job in slurm.jobs.values():
        job.in_queue = False


def sweep_file(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "job.yaml").write_text(
        "name: lr\nslurm: {nodes: 2, time: '10'}\ntrain: {max_steps: 20}\n"
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "base: job.yaml\nsweep:\n  grid:\n    train.lr: [0.1, 0.01, 0.001]\n"
        f"    train.seed: [0, 1]\n  max_parallel: 2\n{extra}"
    )
    return path


def test_dry_run_shows_points_and_script_and_touches_nothing(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    rc = main(["sweep", str(sweep_file(tmp_path)), "--dry-run", "--runs-dir", str(runs)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["#", "name", "train.lr", "train.seed"]
    assert lines[2].split() == ["0", "lr-0", "0.1", "0"]
    assert lines[7].split() == ["5", "lr-5", "0.001", "1"]
    assert "#!/bin/bash" in out
    assert "#SBATCH --array=0-5%2" in out
    assert "# would run: sbatch --parsable " in out
    assert "# 6 points in 1 job array(s), at most 2 at once" in out
    assert not runs.exists()
    assert slurm.commands() == ["scontrol show config"]  # never sbatch


def test_dry_run_without_slurm_assumes_the_default_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = FakeSlurm()
    slurm.script("scontrol", SlurmUnavailableError("'scontrol' is not on PATH"))
    monkeypatch.delenv("HPC_DDP_SITE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    rc = main(
        ["sweep", str(sweep_file(tmp_path)), "--dry-run", "--json"],
        backends=Registry(slurm.client()),
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [a["array"] for a in doc["arrays"]] == ["0-5%2"]
    assert doc["schema"] == "hpc-ddp.sweep/1"
    assert [p["values"] for p in doc["points"][:2]] == [
        {"train.lr": 0.1, "train.seed": 0},
        {"train.lr": 0.1, "train.seed": 1},
    ]


def test_dry_run_splits_past_max_array_size(
    tmp_path: Path,
    slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    slurm.max_array_size = 4
    assert main(["sweep", str(sweep_file(tmp_path)), "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(a["points"], a["offset"], a["array"]) for a in doc["arrays"]] == [
        ([0, 1, 2, 3], 0, "0-3%2"),
        ([4, 5], 4, "0-1%2"),
    ]
    assert "export HPC_DDP_ARRAY_OFFSET=4" in doc["arrays"][1]["script"]


def test_a_typo_in_a_swept_key_is_caught_before_anything_happens(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sweep_file(tmp_path)
    path.write_text(path.read_text().replace("train.seed", "train.sed"))
    rc = main(["sweep", str(path), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.sed" in err
    assert "seed" in err.split("HINT:")[1]
    assert not (tmp_path / "runs").exists()
    assert slurm.calls == []


@pytest.mark.parametrize(
    "argv",
    [["sweep"], ["sweep", "s.yaml", "--resubmit-failed", "runs/x"]],
)
def test_usage_errors_exit_2(
    argv: list[str], slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "HINT:" in capsys.readouterr().err


def submit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    rc = main(["sweep", str(sweep_file(tmp_path)), "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert rc == 0
    return Path(json.loads(capsys.readouterr().out)["sweep_dir"])


def test_submit_is_one_sbatch_call_and_prints_where_to_look(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["sweep", str(sweep_file(tmp_path)), "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert rc == 0
    calls = slurm.commands()
    assert [c.split()[0] for c in calls] == ["scontrol", "sbatch"]
    [sweep_dir] = (tmp_path / "runs").iterdir()
    assert calls[1] == f"sbatch --parsable {sweep_dir}/job.sbatch"
    assert "6 points as array job 501 (--array=0-5%2)" in out
    assert f"sweep dir: {sweep_dir}" in out
    assert f"hpc-ddp status {sweep_dir}" in out
    assert f"hpc-ddp results {sweep_dir}" in out


def _fill(sweep_dir: Path, slurm: FakeSlurm) -> None:
    """Tasks 0-2 finished with metrics, 3 crashed, 4 and 5 never ran (gone from the queue)."""
    empty_queue(slurm)
    for i, val in ((0, 0.8), (1, 0.5), (2, 0.9), (3, 2.0)):
        task = sweep_dir / "tasks" / str(i)
        task.mkdir(exist_ok=True)  # each task makes its directory when it starts
        rows = [{"step": 10, "loss": val + 0.1}, {"step": 20, "loss": val, "val_loss": val}]
        (task / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        record_start(task / "ledger.jsonl", attempt=0, job_id="501", job_ref=f"501_{i}",
                     nodelist="n1", world_size=2, resumed_from_step=None,
                     checkpoint=None)  # fmt: skip
        cause = EndCause.CRASH if i == 3 else EndCause.FINISHED
        record_end(task / "ledger.jsonl", attempt=0, cause=cause, steps_done=20,
                   checkpoint=None, requeue_requested=False)  # fmt: skip


def test_resubmit_failed_from_the_command_line(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    assert main(["sweep", "--resubmit-failed", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "resubmitted 3 task(s)" in out
    assert "(3, 4, 5) as array job 502 (--array=3-5%2)" in out
    assert [r.points for r in read_arrays(sweep_dir)] == ["0-5", "3-5"]
    empty_queue(slurm)
    assert main(["sweep", "--resubmit-failed", str(sweep_dir), "--dry-run", "--json"]) == 0
    # The new array is now what squeue would be asked about; it is gone (empty queue), so the
    # same tasks are failed again and would be resubmitted again.
    assert json.loads(capsys.readouterr().out)["resubmitted"] == [3, 4, 5]


def test_a_sweep_dir_of_the_old_layout_reads_as_before(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sweeps written before task_configs.jsonl (every tasks/<i>/config.yaml written at submit,
    no packed file) are on users' disks: status, results, logs and --resubmit-failed read them
    as before."""
    from hpc_ddp.rundir.taskconfig import materialise_task_config

    sweep_dir = submit(tmp_path, capsys)
    for index in range(6):
        assert materialise_task_config(sweep_dir, index) is not None
    (sweep_dir / "task_configs.jsonl").unlink()
    _fill(sweep_dir, slurm)
    expected = ["finished"] * 3 + ["failed"] * 3
    assert main(["status", str(sweep_dir), "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["sweeps"]
    assert [task["state"] for task in entry["tasks"]] == expected
    assert main(["results", str(sweep_dir), "--json", "--sort", "index"]) == 0
    assert [row["state"] for row in json.loads(capsys.readouterr().out)["rows"]] == expected
    assert main(["logs", str(sweep_dir), "--task", "4", "--rank", "2"]) == 2  # 2 ranks: 0-1
    assert "no such rank (the run has 2 ranks" in capsys.readouterr().err
    assert main(["logs", str(sweep_dir), "--task", "4"]) == 1
    assert "no rank-0.err log yet" in capsys.readouterr().err
    assert main(["sweep", "--resubmit-failed", str(sweep_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resubmitted"] == [3, 4, 5]
    assert "#SBATCH --array=3-5%2\n" in (sweep_dir / "job-1.sbatch").read_text()


def test_status_and_results_ask_sacct_how_tasks_the_queue_forgot_ended(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tasks 4 and 5 left no ledger, and squeue forgot them: sacct says task 4 was cancelled;
    its line for task 5 is another sweep's (the cluster's job ids started again)."""
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    script = str(sweep_dir / "job.sbatch")
    for task, state, ran in ((4, JobState.CANCELLED, script), (5, JobState.TIMEOUT, "/x.sbatch")):
        slurm.add_job(f"60{task}", array_job_id="501", array_task_id=str(task), state=state,
                      in_queue=False, command=ran)  # fmt: skip
    expected = ["finished"] * 3 + ["failed", "cancelled", "failed"]
    assert main(["status", str(sweep_dir), "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["sweeps"]
    assert [task["state"] for task in entry["tasks"]] == expected
    assert main(["results", str(sweep_dir), "--json", "--sort", "index"]) == 0
    assert [row["state"] for row in json.loads(capsys.readouterr().out)["rows"]] == expected
    assert [c.split()[:2] for c in slurm.commands()].count(["sacct", "-n"]) == 2
    slurm.accounting = False  # no slurmdbd: the queue's silence and the ledgers are all there is
    assert main(["status", str(sweep_dir), "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["sweeps"]
    assert [task["state"] for task in entry["tasks"]][4] == "failed"


def test_results_formats_sorting_and_top(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    assert main(["results", str(sweep_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["#", "state", "train.lr", "train.seed", "best", "val_loss"]
    assert [line.split()[0] for line in out[2:8]] == ["1", "0", "2", "3", "4", "5"]
    assert out[5].split()[1:3] == ["failed", "(crash)"]
    assert out[-1] == "6 tasks: 3 finished, 3 failed; ranked by best (min)"

    assert main(["results", str(sweep_dir), "--format", "csv", "--sort", "train.lr"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0][:3] == ["#", "state", "train.lr"]
    assert [r[2] for r in table[1:]] == ["0.001", "0.001", "0.01", "0.01", "0.1", "0.1"]

    assert main(["results", str(sweep_dir), "--format", "json", "--top", "2"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["rows"]
    assert [(r["index"], r["best"], r["state"]) for r in rows] == [
        (1, 0.5, "finished"), (0, 0.8, "finished")
    ]  # fmt: skip
    assert "showing 2 of 6 tasks" in captured.err

    assert main(["results", str(sweep_dir), "--format", "markdown", "--mode", "max"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("|")
    assert md[1].startswith("|--")
    assert [line.split("|")[1].strip() for line in md[2:]] == ["3", "2", "0", "1", "4", "5"]


def test_results_plot(tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")  # an optional extra: hpc-ddp[plot]
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    out = tmp_path / "plots" / "sweep.png"
    assert main(["results", str(sweep_dir), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {out}" in capsys.readouterr().err


def test_results_plot_to_a_directory_or_a_bare_name_says_the_true_path(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    plots = tmp_path / "plots"
    plots.mkdir()
    for arg, written in ((plots, plots / "results.png"), (plots / "bare", plots / "bare.png"),
                         (plots / "new" / "p.svg", plots / "new" / "p.svg")):  # fmt: skip
        assert main(["results", str(sweep_dir), "--plot", str(arg)]) == 0
        assert f"plot written to {written}\n" in capsys.readouterr().err
        assert written.stat().st_size > 0
    assert sorted(p.name for p in plots.iterdir()) == ["bare.png", "new", "results.png"]
    assert (plots / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (plots / "new" / "p.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("notes.txt/x.png", "notes.txt is a file, not a directory. HINT:"),
        ("notes.txt/sub/x.png", "notes.txt is a file, not a directory. HINT:"),
        ("x.txt", "matplotlib cannot write '.txt' files. HINT: end the file name with one of "
                  "the supported formats: "),
        ("x.PNGX", "cannot write '.PNGX' files"),
        ("/proc/x.png", "cannot write /proc/x.png (No such file or directory). HINT:"),
    ],
)  # fmt: skip
def test_results_plot_to_an_unwritable_place_or_format_is_a_usage_error_before_any_work(
    tmp_path: Path,
    slurm: FakeSlurm,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    words: str,
) -> None:
    pytest.importorskip("matplotlib")
    sweep_dir = submit(tmp_path, capsys)
    (tmp_path / "notes.txt").write_text("a file\n")
    monkeypatch.chdir(tmp_path)
    asked = len(slurm.calls)
    assert main(["results", str(sweep_dir), "--plot", target]) == 2
    captured = capsys.readouterr()
    assert words in captured.err
    if target == "x.txt":
        assert ".pdf, " in captured.err
        assert ".png, " in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""  # no table: refused before anything was computed
    assert len(slurm.calls) == asked  # ...and before squeue was asked
    assert not Path("x.txt").exists()


def test_results_sort_by_a_metric_no_task_logged_names_those_that_were(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    with (sweep_dir / "tasks" / "2" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 20, "val_acc": 0.75}) + "\n")
    assert main(["results", str(sweep_dir), "--sort", "nosuch"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        "--sort nosuch: no task logged a metric 'nosuch' (metrics logged: loss, val_acc, "
        "val_loss), and it is no swept key or column. HINT: sort by a logged metric or one of: "
        "train.lr, train.seed, best, final, loss, steps, attempts, index"
    ) in captured.err
    assert main(["results", str(sweep_dir), "--sort", "val_los"]) == 2
    assert "HINT: did you mean 'val_loss'? sort by" in capsys.readouterr().err
    # A metric only one task logged still ranks (the others come last).
    assert main(["results", str(sweep_dir), "--sort", "val_acc", "--mode", "max"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[4:6] == ["best", "val_acc"]
    assert out[2].split()[0] == "2"
    assert out[-1].endswith("ranked by best (max)")


@pytest.mark.parametrize(
    "arrays",
    ['[{"job_id": "501", "points": "abc", "offset": 0, "array": "0-5", "script": "job.sbatch",'
     ' "submitted_at": "t"}]', "{}", '[{"job_id": 501}]'],
    ids=["points-abc", "object", "job-id-int"],
)  # fmt: skip
def test_results_and_resubmit_of_a_sweep_with_a_damaged_arrays_json_exit_1(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], arrays: str
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    (sweep_dir / "arrays.json").write_text(arrays)
    for argv in (["results", str(sweep_dir)], ["sweep", "--resubmit-failed", str(sweep_dir)]):
        asked = len(slurm.calls)
        assert main(argv) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert f"{sweep_dir / 'arrays.json'}: damaged array record (" in captured.err
        assert "HINT: it is written by `hpc-ddp sweep`" in captured.err
        assert "Traceback" not in captured.err
        assert len(slurm.calls) == asked  # nothing submitted, nothing asked


def test_results_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path,
    slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert main(["results", str(sweep_dir), "--plot", str(tmp_path / "p.png")]) == 2
    captured = capsys.readouterr()
    assert "pip install 'hpc-ddp[plot]'" in captured.err
    assert captured.out == ""  # fails before printing a table
    assert not (tmp_path / "p.png").exists()


def test_sweep_and_results_do_not_import_torch_or_submitit(tmp_path: Path) -> None:
    path = sweep_file(tmp_path)
    code = (
        "import sys\nfrom hpc_ddp.cli.main import main\n"
        "from hpc_ddp.backends.registry import Registry\n"
        "from hpc_ddp.backends.slurm.fake import FakeSlurm\n"
        "backends = Registry(FakeSlurm().client())\n"
        f"assert main(['sweep', {str(path)!r}, '--runs-dir', {str(tmp_path / 'r')!r}], "
        "backends=backends) == 0\n"
        f"import pathlib; [d] = pathlib.Path({str(tmp_path / 'r')!r}).iterdir()\n"
        "assert main(['results', str(d)], backends=backends) == 0\n"
        "heavy = {'torch', 'torchvision', 'submitit', 'matplotlib'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        # No site profile from this machine's HOME or environment.
        env={**{k: v for k, v in os.environ.items() if k != "HPC_DDP_SITE"}, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# --- user errors and damaged files: an exit code and a HINT, never a traceback -----------------


def test_results_of_a_file_or_of_nothing_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.csv"
    path.write_text("not a sweep\n")
    assert main(["results", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"hpc-ddp results: error: {path}: is a file, not a sweep directory. HINT:" in err
    assert main(["results", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"hpc-ddp results: error: {tmp_path / 'nope'}: no such sweep directory. HINT:" in err


@pytest.mark.parametrize("top", ["0", "-3"])
def test_results_top_must_be_positive(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], top: str
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    assert main(["results", str(sweep_dir), "--top", top]) == 2
    captured = capsys.readouterr()
    assert f"--top {top}: must be at least 1" in captured.err
    assert "HINT: leave --top out" in captured.err
    assert captured.out == ""


def test_results_skip_damaged_metric_lines_and_say_so(
    tmp_path: Path,
    slurm: FakeSlurm,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    good = (sweep_dir / "tasks" / "1" / "metrics.jsonl").read_bytes()
    (sweep_dir / "tasks" / "1" / "metrics.jsonl").write_bytes(
        b"\x00\xff\xfe\x89PNG\r\n[1, 2]\n42\n"
        + b'{"step": 30, "val_loss": '
        + b"9" * 400
        + b"}\n"  # too large for a float
        + good
    )
    (sweep_dir / "tasks" / "2" / "metrics.jsonl").unlink()
    (sweep_dir / "tasks" / "2" / "metrics.jsonl").mkdir()  # unreadable as a file
    with caplog.at_level(logging.WARNING, logger="hpc_ddp.sweep.results"):
        assert main(["results", str(sweep_dir), "--format", "json", "--no-slurm"]) == 0
    rows = {r["index"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert (rows[1]["best"], rows[1]["steps"]) == (0.5, 30)  # the good rows still count
    assert rows[2]["best"] is None
    warnings = [r.getMessage() for r in caplog.records]
    assert any("tasks/1/metrics.jsonl: skipped 3 line(s) that are not JSON objects (first: "
               "line 1). HINT:" in w for w in warnings)  # fmt: skip
    assert any("tasks/2/metrics.jsonl: cannot read it" in w for w in warnings)


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
@pytest.mark.parametrize("under", [False, True])
def test_sweep_refuses_a_runs_dir_that_is_a_file(
    tmp_path: Path,
    slurm: FakeSlurm,
    capsys: pytest.CaptureFixture[str],
    dry_run: list[str],
    under: bool,
) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("")
    runs = blocker / "sub" if under else blocker
    rc = main(["sweep", str(sweep_file(tmp_path)), "--runs-dir", str(runs), *dry_run])
    captured = capsys.readouterr()
    assert rc == 2
    what = f"lies under the file {blocker}" if under else "is a file"
    assert f"hpc-ddp sweep: error: --runs-dir {runs}: {what}, not a directory. HINT:" in (
        captured.err
    )
    assert captured.out == ""
    assert slurm.calls == []  # Slurm was never asked


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SLURM_ARRAY_TASK_ID": "abc"}, "SLURM_ARRAY_TASK_ID='abc' is not an integer. HINT:"),
        ({"SLURM_ARRAY_TASK_ID": "1", "HPC_DDP_ARRAY_OFFSET": "x"},
         "HPC_DDP_ARRAY_OFFSET='x' is not an integer. HINT:"),
        ({"SLURM_ARRAY_TASK_ID": "-1"}, "SLURM_ARRAY_TASK_ID='-1' is below 0. HINT:"),
    ],
)  # fmt: skip
def test_run_with_a_garbled_array_task_id_fails_with_a_message(
    tmp_path: Path,
    slurm: FakeSlurm,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    fragment: str,
) -> None:
    sweep_dir = submit(tmp_path, capsys)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["run", str(sweep_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"hpc-ddp run: error: {fragment}")


def test_a_full_disk_while_writing_the_sweep_is_a_failure_with_a_hint(
    tmp_path: Path,
    slurm: FakeSlurm,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hpc_ddp.backends.slurm.sweeps.submit_sweep", full)  # what the API calls
    runs = tmp_path / "runs"
    assert main(["sweep", str(sweep_file(tmp_path)), "--runs-dir", str(runs)]) == 1
    err = capsys.readouterr().err
    assert f"writing the sweep directory under {runs} failed: [Errno 28] No space left" in err
    assert "HINT:" in err


def test_results_of_a_plain_run_directory_names_nothing_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory is no sweep: ``results`` says so and exits 2, like any target that
    names nothing (a damaged sweep, one with tasks/ but no sweep.yaml, stays exit 1)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text("{}")
    assert main(["results", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir}: a run directory, not a sweep directory (no sweep.yaml)" in err
    assert f"`hpc-ddp status {run_dir}`" in err
    assert main(["results", str(tmp_path)]) == 2
    assert "no sweep, not a sweep directory" in capsys.readouterr().err
    (run_dir / "tasks").mkdir()
    assert main(["results", str(run_dir)]) == 1
    assert "no sweep.yaml, so not a sweep directory" in capsys.readouterr().err


def test_the_json_of_every_status_follows_one_convention(
    tmp_path: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status --json`` of a run and of a sweep (docs/json.md): a schema, snake_case keys,
    seconds as numbers, null for none (never "-"), lists as lists."""
    sweep_dir = submit(tmp_path, capsys)
    _fill(sweep_dir, slurm)
    assert main(["status", str(sweep_dir), str(sweep_dir / "tasks" / "0"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["schema"] == "hpc-ddp.status/1"
    assert [e["task"] for e in shown["sweeps"]] == [None, 0]

    def walk(value: object, where: str) -> None:
        assert value not in ("-", ""), f"{where}: {value!r} for none (null is)"
        if isinstance(value, dict):
            for key, item in value.items():
                inside = where.endswith(".values")  # a point's dotted keys are the user's
                assert inside or (key.replace("_", "").isalnum() and key == key.lower()), key
                walk(item, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    walk(shown, "status")
    task = shown["sweeps"][0]["tasks"][0]
    assert task["values"] == {"train.lr": 0.1, "train.seed": 0}
    assert isinstance(task["attempts"], int)


def test_backend_local_is_accepted_and_auto_means_local_without_sbatch(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The error without Slurm suggests `--backend local`: sweep takes it, and `auto` (the
    default) is local where `sbatch` is not on PATH, as for submit. A dry run starts nothing."""
    runs = tmp_path / "runs"
    argv = ["sweep", str(sweep_file(tmp_path)), "--runs-dir", str(runs), "--dry-run"]
    assert main([*argv, "--backend", "local"]) == 0
    out = capsys.readouterr().out
    assert "# backend: local; 6 points as local runs, 2 at once" in out
    assert "#SBATCH" not in out
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["backend"], shown["max_parallel"], shown["arrays"]) == ("local", 2, [])
    assert [p["values"] for p in shown["points"][:1]] == [{"train.lr": 0.1, "train.seed": 0}]
    assert not runs.exists()
    assert slurm.commands() == []
