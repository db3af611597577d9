"""The session API: lazy package import, run-dir resolution, stop -> checkpoint -> requeue ->
exact resume (in-process, single rank), the Slurm requeue request, and the BYO example run as
one process and under torchrun."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.slurm.allocation import SlurmAllocation
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.checkpoint.format import list_checkpoints
from hpc_ddp.config.load import dump_job_config, load_job_config
from hpc_ddp.config.model import FaultConfig, JobConfig, RequeueConfig, TrainConfig
from hpc_ddp.errors import CheckpointError, ConfigError, HpcDdpError
from hpc_ddp.exitcodes import FAULT_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.fault.watchdog import Identity, Watchdog
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RUN_DIR_ENV, LaunchPaths
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.numbering import DEFAULT_RUN_DIR
from hpc_ddp.runtime.procgroup import unwrap
from hpc_ddp.sessions.session import Phase, RequeueExit, Session
from tests.helpers.launch import REPO, base_env, free_port
from tests.runtime.array_task import TASK

pytestmark = pytest.mark.torch

USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)
BYO = REPO / "examples" / "byo" / "train.py"
JOBS = REPO / "jobs"


def test_import_hpc_ddp_does_not_import_torch() -> None:
    code = (
        "import sys, hpc_ddp; assert 'torch' not in sys.modules, 'torch imported'; "
        "print(hpc_ddp.__version__); s = hpc_ddp.session; assert 'torch' in sys.modules; "
        "assert s is hpc_ddp.session and callable(s); "
        "assert issubclass(hpc_ddp.RequeueExit, SystemExit)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    import hpc_ddp

    with pytest.raises(AttributeError):
        _ = hpc_ddp.no_such_name


@pytest.mark.parametrize(
    ("arg", "env", "expected"),
    [
        ("given", {RUN_DIR_ENV: "from-env"}, "given"),
        (None, {RUN_DIR_ENV: "from-env"}, "from-env"),
        (None, {}, DEFAULT_RUN_DIR),
    ],
)
def test_run_dir_resolution(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arg: str | None,
    env: dict[str, str],
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    s = Session(arg, env=env)
    assert s.run_dir == tmp_path / expected
    assert s.config == JobConfig(name=expected)  # no config.yaml: the defaults


def test_config_comes_from_the_run_dir(tmp_path: Path) -> None:
    cfg = JobConfig(name="mine", train=TrainConfig(lr=0.5, keep_last=7))
    (tmp_path / "config.yaml").write_text(dump_job_config(cfg))
    assert Session(tmp_path, env={}).config == cfg
    explicit = JobConfig(name="explicit")
    assert Session(tmp_path, explicit, env={}).config is explicit


def test_params_reach_the_script_read_only_from_the_run_dir(tmp_path: Path) -> None:
    cfg = load_job_config(
        JOBS / "quickstart.yaml", ["params.lr=0.25", "params.opt.name=adam", "params.tag=x y"]
    )
    (tmp_path / "config.yaml").write_text(dump_job_config(cfg))
    params = Session(tmp_path, env={}).params
    assert params == {"lr": 0.25, "opt": {"name": "adam"}, "tag": "x y"}
    assert params["opt"]["name"] == "adam"  # type: ignore[index]
    with pytest.raises(TypeError):
        params["lr"] = 1.0  # type: ignore[index]


DATA = TensorDataset(torch.randn(96, 4, generator=torch.Generator().manual_seed(0)),
                     torch.arange(96) % 3)  # fmt: skip


def byo_loop(
    run_dir: Path,
    total: int,
    env: dict[str, str],
    stop_at: int | None = None,
    signum: int = USR2,
    slurm: FakeSlurm | None = None,
) -> str:
    """A user-style loop (dropout, momentum, 12 batches per epoch); the final weights' digest."""
    cfg = JobConfig(name="t", train=TrainConfig(keep_last=2))
    face = None if slurm is None else SlurmAllocation(env, slurm.client())
    with Session(run_dir, cfg, env=env, allocation=face) as s:
        torch.manual_seed(0)
        model = s.wrap(nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 3)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        s.restore(model=model, optimizer=opt)
        batches = s.loader(DATA, batch_size=8).forever()
        for step in s.steps(total, checkpoint_every=5):
            x, y = next(batches)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
            s.log(step=step, epoch=s.progress.epoch)
            if step == stop_at:
                os.kill(os.getpid(), signum)  # a real signal, mid-step
        s.checkpoint(wait=True)
        return weights_digest(unwrap(model).state_dict())


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("stop_at", [7, 10, 12])  # mid-epoch, on a checkpoint, epoch end
def test_single_process_stop_and_resume_is_exact(tmp_path: Path, stop_at: int) -> None:
    full = byo_loop(tmp_path / "full", 30, env={})
    with pytest.raises(RequeueExit) as stop:
        byo_loop(tmp_path / "cut", 30, env={}, stop_at=stop_at)
    assert (stop.value.code, stop.value.signal, stop.value.requeued) == (0, USR2, False)
    assert [i.step for i in list_checkpoints(tmp_path / "cut")][-1] == stop_at
    assert byo_loop(tmp_path / "cut", 30, env={}) == full
    rows = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == list(range(1, 31))  # none twice, none lost


@pytest.mark.usefixtures("own_process")
def test_a_session_handed_task_variables_alone_keeps_the_users_histories_in_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save-time history (requeue.lead_time: auto) is the user's, found through this
    process's $XDG_STATE_HOME, not through the task variables a session is handed: a given
    env without it once sent a test's saves to the real ~/.local/state."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    byo_loop(tmp_path / "run", 10, env={})
    state = Path(os.environ["XDG_STATE_HOME"])
    assert (state / "hpc-ddp" / "savetimes.json").is_file()
    assert not (tmp_path / "home").exists()


@pytest.mark.usefixtures("own_process")
def test_checkpoint_needs_restore_first_and_corrupt_only_is_an_error(tmp_path: Path) -> None:
    with Session(tmp_path, JobConfig(name="t"), env={}) as s:
        with pytest.raises(HpcDdpError, match=r"HINT: call session\.restore"):
            s.checkpoint()
        (s.paths.checkpoints / "step-00000003.pt").write_bytes(b"torn")
        with pytest.raises(CheckpointError, match="HINT"):
            s.restore(model=s.wrap(nn.Linear(2, 2)))


RUNNING = "JobId=78 JobState=RUNNING Reason=None Restarts=0 PreemptTime=None"
REQUEUEING = "JobId=78 JobState=COMPLETING Reason=None Restarts=1 PreemptTime=None"
CANCELLING = "JobId=78 JobState=COMPLETING Reason=None Restarts=0 PreemptTime=None"

# A `command:` job's child under `hpc-ddp run`: torchrun-style variables inside a Slurm job.
COMMAND_CHILD = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "SLURM_JOB_ID": "90"}


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize(
    ("env", "signum", "job", "call"),
    [
        (TASK, USR2, RUNNING, "requeue 77_3"),
        # SIGTERM from `scontrol requeue`: Slurm already counted the restart.
        (TASK, TERM, REQUEUEING, None),
        # SIGTERM from `scancel`: completing without a restart, never brought back.
        (TASK, TERM, CANCELLING, None),
        (COMMAND_CHILD, USR2, RUNNING, "requeue 90"),
        ({}, USR2, RUNNING, None),
    ],
)
def test_requeue_under_slurm(
    tmp_path: Path,
    env: dict[str, str],
    signum: int,
    job: str,
    call: str | None,
) -> None:
    """The requeue signal in a Slurm job makes rank 0 run `scontrol requeue ARRAYJOB_TASK`,
    exactly once; a SIGTERM while Slurm requeues or cancels, and non-Slurm runs, do not."""
    slurm = FakeSlurm()
    slurm.script("scontrol show job", job)  # what Slurm 22.05 was seen to print then
    slurm.script("scontrol requeue", "")
    with pytest.raises(RequeueExit) as stop:
        byo_loop(tmp_path / "run", 30, env=env, stop_at=4, signum=signum, slurm=slurm)
    assert stop.value.requeued is (call is not None)
    assert stop.value.signal == signum
    assert slurm.commands("scontrol requeue") == ([] if call is None else [f"scontrol {call}"])
    [attempt] = read_ledger(tmp_path / "run" / "ledger.jsonl")
    assert attempt.requeue_requested is (call is not None)
    assert attempt.cause is not None
    assert attempt.steps_done == 4
    # The handler stays installed after the stop: Slurm's SIGTERM now only gets recorded.
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.usefixtures("own_process")
def test_a_failed_requeue_leaves_non_zero_and_says_so(tmp_path: Path) -> None:
    """An ``scontrol`` that cannot reach Slurm (munged's socket missing, as in a container):
    the session leaves with REQUEUE_FAILED_EXIT_CODE on every path out, and the ledger says
    the requeue failed, with the checkpoint kept."""
    slurm = FakeSlurm()
    no_munge = (
        "scontrol: error: Munge encode failed: Failed to access "
        '"/run/munge/munge.socket.2": No such file or directory'
    )
    slurm.fail("scontrol", no_munge, times=3)  # show job, requeue, show job again
    with pytest.raises(RequeueExit) as stop:
        byo_loop(tmp_path / "run", 30, env=TASK, stop_at=4, signum=USR2, slurm=slurm)
    assert slurm.commands() == [
        "scontrol show job -o 77_3",
        "scontrol requeue 77_3",
        "scontrol show job -o 77_3",
    ]
    assert stop.value.code == REQUEUE_FAILED_EXIT_CODE
    assert stop.value.requeued is False
    [attempt] = read_ledger(tmp_path / "run" / "ledger.jsonl")
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.REQUEUE_FAILED, False)
    assert (attempt.steps_done, attempt.checkpoint) == (4, "step-00000004.pt")
    assert (tmp_path / "run" / "checkpoints" / "step-00000004.pt").is_file()
    assert attempt.message is not None
    assert "Munge encode failed" in attempt.message
    assert "HINT:" in attempt.message


def test_custom_requeue_signal_is_caught(tmp_path: Path, own_process: None) -> None:
    cfg = JobConfig(name="t", requeue=RequeueConfig(signal="USR1"))
    with Session(tmp_path, cfg, env={}) as s:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert s.should_stop()
        assert s.stop_signal == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # restored on a normal close


def _metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line]


def _stop_when_logging(proc: subprocess.Popen[bytes], run_dir: Path, signum: int) -> None:
    deadline = time.monotonic() + 60
    while not _metric_steps(run_dir) or _metric_steps(run_dir)[-1] < 30:
        assert proc.poll() is None, "finished before it could be stopped"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signum)
    proc.wait(60)


def test_byo_single_process_ctrl_c_and_resume_is_exact(tmp_path: Path) -> None:
    steps = ["--steps", "1000", "--checkpoint-every", "300"]
    env = base_env({RUN_DIR_ENV: str(tmp_path / "full")})
    subprocess.run([sys.executable, BYO, *steps], env=env, check=True, capture_output=True)
    cut_env = base_env({RUN_DIR_ENV: str(tmp_path / "cut")})
    with (tmp_path / "cut.err").open("wb") as err:
        proc = subprocess.Popen([sys.executable, BYO, *steps], env=cut_env, stderr=err)
        _stop_when_logging(proc, tmp_path / "cut", signal.SIGINT)  # ^C at a terminal
    assert proc.returncode == 0, (tmp_path / "cut.err").read_text()[-3000:]
    stopped = list_checkpoints(tmp_path / "cut")[-1].step
    assert 30 <= stopped < 1000
    subprocess.run([sys.executable, BYO, *steps], env=cut_env, check=True, capture_output=True)
    full, cut = list_checkpoints(tmp_path / "full")[-1], list_checkpoints(tmp_path / "cut")[-1]
    assert cut.step == full.step == 1000
    assert cut.weights_digest == full.weights_digest
    assert _metric_steps(tmp_path / "cut") == list(range(10, 1001, 10))


def test_byo_under_torchrun_two_ranks_stop_and_resume(tmp_path: Path) -> None:
    """torchrun gets SIGTERM (as from a scheduler); it forwards it to both ranks, which save."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv = [*torchrun, "--master-port", str(free_port()), str(BYO), "--steps", "800"]
    env = base_env({RUN_DIR_ENV: str(tmp_path)})
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _stop_when_logging(proc, tmp_path, signal.SIGTERM)
    stopped = list_checkpoints(tmp_path)[-1]
    assert 30 <= stopped.step < 800
    argv[argv.index("--master-port") + 1] = str(free_port())
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from step-{stopped.step:08d}.pt" in done.stderr
    assert list_checkpoints(tmp_path)[-1].step == 800
    assert _metric_steps(tmp_path) == list(range(10, 801, 10))


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("on_crash", [True, False])
def test_a_crash_in_the_loop_reaches_the_coordinator(tmp_path: Path, on_crash: bool) -> None:
    """An exception escaping the training loop ends the attempt as a crash; with
    requeue.on_crash (and budget left) the job is requeued, and the error still propagates."""
    slurm = FakeSlurm()
    slurm.add_job("78", array_job_id="77", array_task_id="3", state=JobState.RUNNING)
    cfg = JobConfig(name="t", requeue=RequeueConfig(max_requeues=1, on_crash=on_crash))
    s = Session(tmp_path, cfg, env=TASK, allocation=SlurmAllocation(TASK, slurm.client()))
    with pytest.raises(ValueError, match="boom"), s:  # noqa: PT012
        s.restore(model=s.wrap(nn.Linear(4, 3)))
        for step in s.steps(10, checkpoint_every=2):
            if step == 5:
                raise ValueError("boom")
    assert s.phase is Phase.CLOSED
    assert slurm.commands() == (["scontrol requeue 77_3"] if on_crash else [])
    [attempt] = read_ledger(tmp_path / "ledger.jsonl")
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, on_crash)
    assert (attempt.steps_done, attempt.checkpoint) == (5, "step-00000004.pt")


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize(
    ("kind", "cause"),
    [("node_fail", EndCause.NODE_FAIL), ("startup", EndCause.HANG), ("crash", EndCause.CRASH)],
)
def test_a_fault_this_ranks_watchdog_declares_ends_the_attempt_with_its_cause(
    tmp_path: Path, kind: str, cause: EndCause
) -> None:
    """The session writes the cause the supervisor would give the same fault kind (one map,
    :func:`~hpc_ddp.fault.blame.fault_cause`): a lost node is ``node_fail``, not a crash."""
    exits: list[int] = []
    launch = LaunchPaths(tmp_path / "launch")
    dog = Watchdog(
        FaultConfig(enabled=True), launch, Identity(0, 1, "n1"), supervised=True,
        exit=exits.append,  # type: ignore[arg-type]
    ).start()  # fmt: skip
    try:
        face = SlurmAllocation(TASK, FakeSlurm().client())
        with Session(tmp_path, JobConfig(name="t"), env=TASK, allocation=face):
            dog.declare(kind, "node n1 stopped answering", own=True)  # this rank leaves
    finally:
        dog.stop()
    assert exits == [FAULT_EXIT_CODE]
    [attempt] = read_ledger(tmp_path / "ledger.jsonl")
    assert attempt.cause is cause
    assert (attempt.message or "").startswith(f"{cause.value}: rank 0 on n1: node n1 stopped")


def _exit_note(run_dir: Path) -> object:
    from hpc_ddp.fault.blame import parse_exit_note
    from hpc_ddp.rundir.layout import RunPaths

    path = RunPaths(run_dir).launch("local.0.0").exit_note(0)
    return parse_exit_note(path.read_bytes()) if path.exists() else None


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("how", ["break", "exit", "raise", "end"])
def test_a_loop_left_before_its_end_says_so_at_once(tmp_path: Path, how: str) -> None:
    """A rank that leaves its steps loop early (break, sys.exit(0)) writes its exit note the
    moment it leaves, before anything after the loop can block it; rank 0 does not call that
    `training finished`. An exception is a crash (its note names the error), and a loop run to
    its end writes no note at all."""
    from hpc_ddp.fault.blame import ExitNote

    s = Session(tmp_path, JobConfig(name="t"), env={})
    expected = {"exit": pytest.raises(SystemExit), "raise": pytest.raises(ValueError, match="boom")}
    with expected.get(how, contextlib.nullcontext()), s:
        s.restore(model=s.wrap(nn.Linear(4, 3)))
        for step in s.steps(10):
            if step == 4 and how != "end":
                if how == "break":
                    break
                if how == "exit":
                    sys.exit(0)
                raise ValueError("boom")
        if how == "break":  # said before the code after the loop runs
            said = _exit_note(tmp_path)
            assert isinstance(said, ExitNote)
            assert (said.rank, said.pid, said.step, said.total) == (0, os.getpid(), 4, 10)
    note = _exit_note(tmp_path)
    [attempt] = read_ledger(tmp_path / "ledger.jsonl")
    if how == "end":
        assert note is None
        assert attempt.message == "training finished"
        return
    assert isinstance(note, ExitNote)
    assert note.step == 4
    if how == "raise":
        assert (note.left_early, note.error) == (False, "ValueError: boom")
        return
    assert (note.left_early, note.total) == (True, 10)
    if how == "break":
        assert (attempt.cause, attempt.message) == (
            EndCause.FINISHED, "left the training loop at step 4 of 10",
        )  # fmt: skip


@pytest.mark.usefixtures("own_process")
def test_named_objects_must_be_stateful_and_in_the_checkpoint(tmp_path: Path) -> None:
    """A named object without state_dict/load_state_dict is refused at restore(); a checkpoint
    that lacks one of the named objects is refused (it would stay as it is now, silently)."""
    cfg = JobConfig(name="t")
    with Session(tmp_path, cfg, env={}) as s:
        model = s.wrap(nn.Linear(2, 2))
        with pytest.raises(ConfigError, match=r"restore\(\) got level=int, .*HINT"):
            s.restore(model=model, level=3)
        ema = nn.Linear(2, 2)
        s.restore(model=model, ema=ema)
        for _ in s.steps(2):
            pass
    with Session(tmp_path, cfg, env={}) as s:
        model = s.wrap(nn.Linear(2, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ConfigError, match=r"holds no state for 'opt_d' .*'ema'.*HINT"):
            s.restore(model=model, ema=nn.Linear(2, 2), opt_d=opt)


DATA_WORKERS_KILLED = """
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from hpc_ddp.sessions.attempt import let_data_workers_go

loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2)
batches = iter(loader)
next(batches)
workers = [w.pid for w in batches._workers]
let_data_workers_go()
for pid in workers:
    os.kill(pid, signal.SIGKILL)  # as Slurm ends what SIGTERM did not
deadline = time.monotonic() + 2.0
while time.monotonic() < deadline:  # torch's handler would raise in here
    time.sleep(0.05)
print("no crash", flush=True)
"""


@pytest.mark.torch
def test_a_data_worker_slurm_ends_during_the_requeue_is_no_crash() -> None:
    """After a requeue request Slurm SIGTERMs the step's processes, the data-loader workers
    too; torch's SIGCHLD handler then raised in whatever the rank did next (a CI run recorded
    the stop as a crash). Once the attempt ends, a worker's death raises nothing.

    In a process of its own, as a rank is: forking data workers from the test process, which
    earlier in-process tests left with threads of theirs, once segfaulted and once hung there.
    """
    done = subprocess.run(
        [sys.executable, "-c", DATA_WORKERS_KILLED], capture_output=True, text=True,
        timeout=120, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "no crash"), done.stderr[-3000:]
