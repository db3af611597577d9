"""The goodput account (pure): every second of a run's wall time, in exactly one part."""

from __future__ import annotations

import random

import pytest

from hpc_ddp.rundir.attempt import Attempt, Blame, Rescue, Save
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.state.goodput import PARTS, account, describe, total


def attempt(n: int, **kw: object) -> Attempt:
    fields: dict[str, object] = {
        "attempt": n, "started": 0.0, "ended": None, "cause": None, "steps_done": None,
        "checkpoint": None, "nodelist": "", "job_ref": "42", "resumed_from_step": None,
        "job_id": "42", "restart": 0, "launch": n, "alloc_nodes": 3,
    }  # fmt: skip
    fields.update(kw)
    return Attempt(**fields)  # type: ignore[arg-type]


def test_a_hang_restarted_in_the_job_is_accounted_second_by_second() -> None:
    """Launch 0: 5 s start-up, a save at step 10 (0.5 s stall), hung after step 20 (reached at
    t=20), detected at 30, step ended at 32. Launch 1 at 33: 5 s start-up, resumes from step 10,
    finishes at 60."""
    first = attempt(
        0, launched_at=0.0, started=5.0, ended=31.0, launch_ended=32.0, cause=EndCause.HANG,
        steps_done=20, saves=(Save(10.0, 10, 0.5),),
        blame=Blame((1,), ("n2",), "stale", False, 30.0, 20.0),
    )  # fmt: skip
    second = attempt(
        1, launched_at=33.0, started=38.0, ended=60.0, cause=EndCause.FINISHED, steps_done=40,
        resumed_from_step=10,
    )  # fmt: skip
    steps = [(10.0, 10), (20.0, 20), (50.0, 30), (60.0, 40)]
    g = account([first, second], steps, now=100.0)
    assert g.wall_s == 60.0
    assert (g.startup_s, g.checkpoint_stall_s, g.hang_undetected_s) == (10.0, 0.5, 10.0)
    assert g.redone_s == pytest.approx(9.5)  # steps 11..20 (10 s), less the save inside them
    assert g.redone_steps == 10
    assert g.recovery_s == pytest.approx(3.0)  # detection -> step ended (2 s) -> relaunch (1 s)
    assert g.requeue_wait_s == 0.0
    assert g.requeues == 0
    assert g.productive_s == pytest.approx(5.0 + 22.0)
    assert g.other_s == pytest.approx(0.0)
    assert g.ettr == pytest.approx(27.0 / 60.0)
    assert g.node_s == pytest.approx(3 * 32.0 + 3 * 27.0)
    text = "\n".join(describe(g))
    assert "ETTR 0.45" in text
    assert "hangs undetected" in text
    assert "(10 steps)" in text


def test_a_survivors_step_bounds_the_steps_redone_either_way() -> None:
    """The beats said step 10 (half a second behind); the survivor completed step 13. With its
    save the restart redoes none; without one (rank 0's buffers lost) it redoes 11..13 from the
    periodic save at 10, and the account says 3, not 0."""

    def redone(rescue: Rescue, resumed: int) -> int:
        dead = attempt(
            0, launched_at=0.0, started=1.0, ended=20.0, cause=EndCause.CRASH, steps_done=10,
            blame=Blame((0,), ("n1",), "dead", False, 14.0, 13.5), rescue=rescue,
        )  # fmt: skip
        again = attempt(
            1, launched_at=21.0, started=22.0, ended=40.0, cause=EndCause.FINISHED,
            steps_done=24, resumed_from_step=resumed,
        )  # fmt: skip
        return account([dead, again], [(10.0, 10), (13.0, 13)], now=50.0).redone_steps

    saved = Rescue(rank=1, step=13, checkpoint="step-00000013.pt", why=None, took_s=0.1)
    assert redone(saved, 13) == 0
    lost = Rescue(rank=1, step=13, checkpoint=None, why="rank 0 was lost", took_s=0.0)
    assert redone(lost, 10) == 3
    unknown = Rescue(rank=1, step=None, checkpoint=None, why="rank 0 was lost", took_s=0.0)
    assert redone(unknown, 10) == 0  # only the beats' word is left


def test_a_requeue_wait_is_the_gap_between_slurm_attempts_and_holds_no_node() -> None:
    first = attempt(0, started=0.0, ended=10.0, cause=EndCause.TIME_LIMIT, steps_done=10)
    second = attempt(
        1, started=131.0, ended=141.0, cause=EndCause.FINISHED, steps_done=20, restart=1,
        launch=0, resumed_from_step=10,
    )  # fmt: skip
    g = account([first, second], [], now=200.0)
    assert (g.wall_s, g.requeue_wait_s, g.requeues, g.productive_s) == (141.0, 121.0, 1, 20.0)
    assert g.node_s == pytest.approx(3 * 20.0)


@pytest.mark.parametrize(
    ("job", "then"), [(None, None), ("42", "77")], ids=["local", "a new slurm job"]
)
def test_a_cancel_and_resume_is_a_resume_not_a_requeue(job: str | None, then: str | None) -> None:
    """A person cancelled the run and later resumed it: a new job (locally, no job id at all),
    at restart 0 again. The wait was for the person, not for Slurm: counted apart."""
    first = attempt(0, started=0.0, ended=10.0, cause=EndCause.CANCELLED, steps_done=10,
                    job_id=job, job_ref=job)  # fmt: skip
    second = attempt(
        1, started=100.0, ended=110.0, cause=EndCause.FINISHED, steps_done=20, restart=0,
        launch=0, resumed_from_step=10, job_id=then, job_ref=then,
    )  # fmt: skip
    g = account([first, second], [], now=200.0)
    assert (g.requeues, g.requeue_wait_s) == (0, 0.0)
    assert (g.resumes, g.resume_wait_s) == (1, 90.0)
    assert g.other_s == pytest.approx(0.0)
    assert "(2 launches, 0 requeues, 1 resume)" in describe(g)[0]
    assert "  resume waits        0:01:30   81.8 %" in describe(g)
    assert total([g, g]).resumes == 2


def test_a_launch_that_never_trained_is_start_up_and_a_running_run_ends_now() -> None:
    dead = attempt(0, launched_at=0.0, started=0.0, ended=4.0, cause=EndCause.CRASH, trained=False)
    running = attempt(1, launched_at=5.0, started=8.0)
    g = account([dead, running], [(20.0, 5)], now=30.0, running=True)
    assert (g.wall_s, g.startup_s, g.recovery_s, g.productive_s) == (30.0, 7.0, 1.0, 22.0)


@pytest.mark.parametrize("seed", range(25))
def test_the_parts_always_sum_to_the_wall_time(seed: int) -> None:
    rng = random.Random(seed)
    attempts, steps, t, step = [], [], 0.0, 0
    for n in range(rng.randint(1, 6)):
        restart = n if rng.random() < 0.3 else 0
        launched = t + rng.uniform(0, 50)
        started = launched + rng.uniform(0, 10)
        resumed = max(0, step - rng.randint(0, 5))
        step = resumed
        now = started
        saves = []
        for _ in range(rng.randint(0, 20)):
            now += rng.uniform(0.1, 3)
            step += 1
            steps.append((now, step))
            if rng.random() < 0.2:
                saves.append(Save(now, step, rng.uniform(0, 0.5)))
        cause = rng.choice([EndCause.CRASH, EndCause.HANG, EndCause.NODE_FAIL, EndCause.FINISHED])
        detected = now + rng.uniform(0, 10)
        blame = Blame((1,), ("n2",), "x", False, detected, now - rng.uniform(0, 1))
        ended = detected + rng.uniform(0, 3)
        attempts.append(
            attempt(
                n, launched_at=launched, started=started, ended=ended, cause=cause,
                steps_done=step, resumed_from_step=resumed or None, saves=tuple(saves),
                blame=blame, restart=restart, trained=rng.random() < 0.9,
            )
        )  # fmt: skip
        t = ended
    g = account(attempts, steps, now=t + 100)
    parts = [getattr(g, f"{name}_s") for name, _ in PARTS]
    assert all(p >= -1e-9 for p in parts), g
    assert sum(parts) == pytest.approx(g.wall_s)
    assert abs(g.other_s) < 1e-6
    assert 0.0 <= g.ettr <= 1.0


def test_a_sweeps_total_adds_its_tasks() -> None:
    one = account([attempt(0, started=0.0, ended=10.0, cause=EndCause.FINISHED)], [], now=20.0)
    two = account([attempt(0, started=0.0, ended=30.0, cause=EndCause.FINISHED)], [], now=40.0)
    both = total([one, two])
    assert (both.wall_s, both.productive_s, both.ettr, both.launches) == (40.0, 40.0, 1.0, 2)
