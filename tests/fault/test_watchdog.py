"""The watchdog: phase deadlines, and real processes that find a frozen peer and leave.

The processes here run the watchdog alone (no torch, no process group): ranks that only beat
and count steps, as fast as a test can make them. A frozen peer (SIGSTOP) is found by its
ring predecessor within ``stale_s``, named with its node, and every rank leaves without any
collective; a rank whose own step overruns its deadline names itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc_ddp.config.model import FaultConfig
from hpc_ddp.exitcodes import FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE
from hpc_ddp.fault.blame import EXITED, FaultRecord
from hpc_ddp.fault.watchdog import (
    Identity,
    StepTimes,
    Watchdog,
    claim_fault,
    phase_timeout,
    read_beat,
    read_fault,
)
from hpc_ddp.rundir.layout import LaunchPaths

CFG = FaultConfig(
    beat_s=0.2, stale_s=1.0, startup_timeout_s=30, step_timeout_s=2, warmup_steps=2,
    checkpoint_timeout_s=20,
)  # fmt: skip


def test_phase_timeouts_follow_the_phase_and_the_observed_step_times() -> None:
    times = StepTimes()
    assert phase_timeout("startup", CFG, times, 0) == 30
    assert phase_timeout("step", CFG, times, 1) == 30  # a warm-up step: start-up's limit
    assert phase_timeout("step", CFG, times, 5) == 2  # too few samples: the floor
    for _ in range(199):
        times.add(0.01)
    times.add(1.0)  # one slow step in 200 is not the 99th percentile: still the floor
    assert phase_timeout("step", CFG, times, 5) == 2
    for _ in range(10):
        times.add(1.0)  # slow steps are the rule now: factor x p99 = 5 x 1 s (the default)
    assert phase_timeout("step", CFG, times, 5) == pytest.approx(5.0)
    assert phase_timeout("checkpoint", CFG, times, 5) == 20
    assert phase_timeout("eval", CFG, times, 5, limit=7) == 7
    assert phase_timeout("command", CFG, times, 5) == float("inf")


_RANK = """
import sys, time
from pathlib import Path
from hpc_ddp.config.model import FaultConfig
from hpc_ddp.rundir.layout import LaunchPaths
from hpc_ddp.fault.watchdog import Identity, Watchdog
rank, launch, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cfg = FaultConfig(beat_s=0.2, stale_s=1.0, startup_timeout_s=30, step_timeout_s=2,
                  warmup_steps=2, checkpoint_timeout_s=20)
wd = Watchdog(cfg, LaunchPaths(launch), Identity(rank, 2, f"n{rank + 1}"), supervised=False).start()
wd.enter("step")
step = 0
while True:
    if mode == "stuck" and step == 5:
        time.sleep(3600)  # this rank's main thread stops making progress; its beats go on
    if mode in ("leave", "stop_together") and step == 5:
        # Its session left the loop (an exit note), then it blocks (as in a collective the
        # others never join); its beats go on. "stop_together": the peer leaves too, later.
        from hpc_ddp.fault.blame import ExitNote
        from hpc_ddp.fault.watchdog import write_exit_note
        if rank == 1 or mode == "stop_together":
            wd.enter("after-loop", limit=3600)  # its own deadline is not what finds it
            if rank == 0:
                time.sleep(2.0)  # well inside the grace an early stop together is given
            note = ExitNote(rank, f"n{rank + 1}", 0, time.time(), step, 100, None)
            write_exit_note(LaunchPaths(launch).exit_note(rank), note)
            time.sleep(3600)
    step += 1
    wd.step_done(step)
    time.sleep(0.05)
"""


def _start(tmp_path: Path, rank: int, mode: str = "steps") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [sys.executable, "-c", _RANK, str(rank), str(tmp_path), mode],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _end(proc: subprocess.Popen[str]) -> str:
    """Kill ``proc`` if it still runs (a stopped one too); its stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    return proc.communicate(timeout=20)[1]


def _wait_beating(launch: LaunchPaths, ranks: list[int]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        beats = [read_beat(launch.beat(r)) for r in ranks]
        if all(b is not None and b.seq >= 3 and b.step >= 5 for b in beats):
            return
        time.sleep(0.05)
    raise AssertionError(f"ranks {ranks} never beat")


def test_a_frozen_rank_is_found_named_and_every_rank_leaves(tmp_path: Path) -> None:
    launch = LaunchPaths(tmp_path)
    procs = [_start(tmp_path, 0), _start(tmp_path, 1)]
    try:
        _wait_beating(launch, [0, 1])
        stopped = time.monotonic()
        procs[1].send_signal(signal.SIGSTOP)
        assert procs[0].wait(timeout=20) == FAULT_EXIT_CODE
        found = time.monotonic() - stopped
        record = read_fault(launch.fault)
        assert record is not None
        assert (record.kind, record.ranks, record.nodes, record.by) == (
            "hang", (1,), ("n2",), "rank 0 on n1",
        )  # fmt: skip
        # stale_s (1 s) after the peer last saw its beat change, which can be a beat (0.2 s,
        # more on a busy machine) before the SIGSTOP; never the 300 s of gloo.
        assert 0.5 <= found < 10.0
        procs[1].send_signal(signal.SIGCONT)  # woken, it adopts the fault and leaves too
        assert procs[1].wait(timeout=20) == PEER_FAULT_EXIT_CODE
    finally:
        out0, out1 = (_end(p) for p in procs)
    assert "did not run for" in out1  # it knows it was stopped
    # Each rank's stderr: where its main thread stood (the program's own code), and nothing
    # of hpc-ddp's threads, which go to hpc-ddp's stacks file of the launch.
    for rank, out, how in ((0, out0, "declared"), (1, out1, "adopted")):
        said = f"hpc-ddp watchdog: rank {rank}'s main thread when the launch ended (hang)"
        assert said in out, out
        assert f"(every thread: {launch.stacks(rank)})" in out
        assert 'File "<string>"' in out.split(said)[1]  # the -c script: the program's frames
        assert "watchdog.py" not in out.split(said)[1]
        assert "Thread 0x" not in out
        stacks = launch.stacks(rank).read_text()
        assert f"rank {rank} leaving for a hang it {how}" in stacks
        assert "watchdog.py" in stacks  # every thread, the watchdog's too
    last = read_beat(launch.beat(1))
    assert last is not None
    assert (last.state, last.code, last.frozen_s is not None) == (
        EXITED,
        PEER_FAULT_EXIT_CODE,
        True,
    )


def test_stacks_asked_for_after_a_crash_stay_out_of_the_programs_stderr(tmp_path: Path) -> None:
    """The supervisor asks every rank for its stacks after every fault (SIGURG), a crash
    loop's survivors too: every thread's stacks, hpc-ddp's own threads included, go to
    hpc-ddp's stacks file of the launch, and the program's stderr gets none of them; leaving
    for a crash adds no main-thread stack there either (the culprit's traceback says it)."""
    launch = LaunchPaths(tmp_path)
    procs = [_start(tmp_path, 0), _start(tmp_path, 1)]
    try:
        _wait_beating(launch, [0, 1])
        for p in procs:
            p.send_signal(signal.SIGURG)
        deadline = time.monotonic() + 20
        while not all("Thread 0x" in _text(launch.stacks(r)) for r in (0, 1)):
            assert time.monotonic() < deadline, "no stacks written"
            time.sleep(0.05)
        crash = FaultRecord("crash", "rank 2 on n3", time.time(), (2,), ("n3",), "boom", False)
        assert claim_fault(launch.fault, crash)
        assert [p.wait(timeout=20) for p in procs] == [PEER_FAULT_EXIT_CODE] * 2
    finally:
        outs = [_end(p) for p in procs]
    for rank, out in enumerate(outs):
        assert "Thread 0x" not in out, out
        assert "most recent call first" not in out, out
        assert "watchdog.py" not in out, out
        stacks = launch.stacks(rank).read_text()
        assert "watchdog.py" in stacks  # hpc-ddp's own thread, in hpc-ddp's file
        assert f"rank {rank} leaving for a crash it adopted (boom)" in stacks


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_rank_whose_step_overruns_its_deadline_names_itself(tmp_path: Path) -> None:
    launch = LaunchPaths(tmp_path)
    procs = [_start(tmp_path, 0), _start(tmp_path, 1, "stuck")]
    try:
        _wait_beating(launch, [0, 1])
        assert procs[1].wait(timeout=20) == FAULT_EXIT_CODE
        assert procs[0].wait(timeout=20) == PEER_FAULT_EXIT_CODE
    finally:
        for p in procs:
            _end(p)
    record = read_fault(launch.fault)
    assert record is not None
    assert (record.kind, record.ranks, record.nodes) == ("hang", (1,), ("n2",))
    assert "step phase at step 5" in record.why
    assert "deadline" in record.why


def test_the_watchdog_checks_again_just_after_a_deadline_that_falls_between_beats(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    cfg = FaultConfig(beat_s=2.0, stale_s=10.0, startup_timeout_s=30, step_timeout_s=3,
                      warmup_steps=0, checkpoint_timeout_s=20)  # fmt: skip
    wd = Watchdog(cfg, LaunchPaths(tmp_path), Identity(0, 1, "n1"), supervised=True,
                  clock=lambda: now[0])  # fmt: skip
    wd.enter("step")
    assert wd._next_wait() == 2.0  # the deadline is 3 s away: a whole beat
    now[0] += 1.5
    assert wd._next_wait() == pytest.approx(1.5 + 0.05)  # not 2 s: 0.05 s past the deadline
    now[0] += 2.0
    assert wd._next_wait() == 2.0  # already past: the next tick declares it anyway
    wd.enter("command")  # no deadline of its own
    assert wd._next_wait() == 2.0


def test_a_crash_claims_the_fault_unless_the_rank_only_lost_a_peer(tmp_path: Path) -> None:
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)

    def wd(rank: int) -> Watchdog:
        return Watchdog(
            CFG, LaunchPaths(tmp_path), Identity(rank, 2, f"n{rank + 1}"), supervised=True,
            exit=fake_exit,  # type: ignore[arg-type]
        )  # fmt: skip

    tmp_path.mkdir(exist_ok=True)
    wd(0).crashed("RuntimeError: Connection reset by peer")
    assert read_fault(LaunchPaths(tmp_path).fault) is None
    culprit = wd(1)
    culprit.crashed("ValueError: bad batch")
    record = read_fault(LaunchPaths(tmp_path).fault)
    assert record is not None
    assert (record.kind, record.ranks) == ("crash", (1,))
    culprit.exiting(1, "ValueError: bad batch")
    beat = read_beat(LaunchPaths(tmp_path).beat(1))
    assert beat is not None
    assert (beat.state, beat.code, beat.fault) == (EXITED, 1, record)


def test_the_first_claim_of_a_fault_wins(tmp_path: Path) -> None:
    first = FaultRecord("hang", "rank 0 on n1", 1.0, (1,), ("n2",), "a", False)
    second = FaultRecord("crash", "rank 1 on n2", 2.0, (0,), ("n1",), "b", False)
    path = tmp_path / "fault.json"
    assert claim_fault(path, first) is True
    assert claim_fault(path, second) is False
    assert read_fault(path) == first
    assert json.loads(path.read_text())["kind"] == "hang"


def test_a_rank_that_says_it_leaves_is_ended_if_its_exit_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error path must never wait on a collective teardown (NCCL's may block for good): the
    last beat says how the rank leaves, and the process is ended if still there a moment later."""
    import threading

    from hpc_ddp.fault import watchdog

    ended = threading.Event()
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        ended.set()

    monkeypatch.setattr(watchdog, "EXIT_GRACE_S", 0.2)
    wd = Watchdog(
        CFG, LaunchPaths(tmp_path), Identity(0, 2, "n1"), supervised=True,
        exit=fake_exit,  # type: ignore[arg-type]
    )  # fmt: skip
    wd.exiting(1, "RuntimeError: boom")
    last = read_beat(LaunchPaths(tmp_path).beat(0))
    assert last is not None
    assert (last.state, last.code, last.error) == (EXITED, 1, "RuntimeError: boom")
    assert ended.wait(timeout=5)
    assert codes == [1]


def test_a_peer_that_left_its_loop_early_is_found_without_a_supervisor(tmp_path: Path) -> None:
    """Rank 1 leaves its loop at step 5 of 100 (its exit note) and blocks; rank 0, its ring
    predecessor, declares it an early exit after the grace an agreed early stop gets, naming
    rank 1, and every rank leaves; when rank 0 leaves its loop too within the grace, nothing
    is declared."""
    launch = LaunchPaths(tmp_path / "alone")
    procs = [_start(launch.root, 0, "leave"), _start(launch.root, 1, "leave")]
    try:
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        errs = [_end(p) for p in procs]
    assert codes == [FAULT_EXIT_CODE, PEER_FAULT_EXIT_CODE], errs
    fault = read_fault(launch.fault)
    assert fault is not None
    assert (fault.kind, fault.ranks, fault.nodes, fault.by) == (
        "early_exit", (1,), ("n2",), "rank 0 on n1",
    )  # fmt: skip
    assert "left its training loop at step 5 of 100" in fault.why
    together = LaunchPaths(tmp_path / "together")
    procs = [_start(together.root, 0, "stop_together"), _start(together.root, 1, "stop_together")]
    try:
        time.sleep(12.0)  # past the grace
        assert [p.poll() for p in procs] == [None, None]
    finally:
        [_end(p) for p in procs]
    assert read_fault(together.fault) is None


def test_a_survivor_that_lost_a_peer_says_so_in_its_beat_while_it_waits(tmp_path: Path) -> None:
    """It waits for the fault (it may be the one to save the last step): its beat carries the
    lost connection meanwhile, so the supervisor can call the silent peer's node lost at once."""
    tmp_path.mkdir(exist_ok=True)
    survivor = Watchdog(CFG, LaunchPaths(tmp_path), Identity(0, 2, "n1"), supervised=True)
    survivor.rescue = object()  # type: ignore[assignment]  # a rescue is armed
    waiting = threading.Thread(
        target=survivor.crashed, args=("RuntimeError: Connection reset by peer",)
    )
    waiting.start()
    try:
        deadline = time.monotonic() + 5
        beat = None
        while time.monotonic() < deadline:
            beat = read_beat(LaunchPaths(tmp_path).beat(0))
            if beat is not None and beat.error:
                break
            time.sleep(0.02)
        assert beat is not None
        assert (beat.exited, beat.lost_a_peer) == (False, True)
        assert waiting.is_alive()  # still waiting for the fault
        assert read_fault(LaunchPaths(tmp_path).fault) is None  # and claims none itself
    finally:
        survivor._gone.set()
        waiting.join(timeout=5)


def test_a_survivor_writing_its_save_is_not_unwound_by_the_peer_it_outlived(
    tmp_path: Path,
) -> None:
    """A hang: this rank's watchdog took the fault up and is writing the survivor's save while
    the main thread waits in a collective. The hung peer, woken to leave, dies, and the
    collective raises on the main thread. That thread must wait for the save and the
    watchdog's exit, not unwind and end the process under the save (the save and its ledger
    line were lost: the step trained again)."""
    tmp_path.mkdir(exist_ok=True)
    exits: list[int] = []
    saving, release = threading.Event(), threading.Event()
    survivor = Watchdog(
        CFG, LaunchPaths(tmp_path), Identity(0, 2, "n1"), supervised=True,
        exit=exits.append,  # type: ignore[arg-type]
    )  # fmt: skip

    def save(record: FaultRecord) -> None:
        saving.set()
        release.wait(10)

    survivor.rescue = save
    hang = FaultRecord("hang", "supervisor", time.time(), (1,), ("n2",), "stopped", False)
    leaving = threading.Thread(target=survivor._leave, args=(hang,), kwargs={"declared": False})
    leaving.start()
    assert saving.wait(5)
    main = threading.Thread(
        target=survivor.crashed, args=("RuntimeError: Connection reset by peer",)
    )
    main.start()
    try:
        main.join(timeout=1.0)
        assert main.is_alive(), "the main thread unwound while the save was being written"
        assert exits == []
    finally:
        release.set()
        leaving.join(timeout=5)
        main.join(timeout=5)
    assert not main.is_alive()
    assert exits == [PEER_FAULT_EXIT_CODE]
