"""One rank of a built-in trainer run for the tests.

Usage: train_run.py RUN_DIR TRAIN_JSON [STOP_AT STOP_RANK [SIGNAL]]

TRAIN_JSON holds TrainConfig fields. With STOP_AT, rank STOP_RANK sends itself a real SIGNAL
(default USR2) just before the ranks agree at the boundary after step STOP_AT, exactly as if
Slurm's warning had arrived during that step. Prints one JSON line: the TrainResult on a
finished run, or the stop (step, signal, exit code) on a stopped one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.runtime.stopflag import AgreementCadence
from hpc_ddp.sessions.session import RequeueExit, Session
from hpc_ddp.train.trainer import run_training


class SignalAt(Session):
    """A session whose rank ``rank`` is signalled during step ``step``."""

    def __init__(self, run_dir: Path, config: JobConfig, step: int, rank: int, signum: int):
        super().__init__(run_dir, config)
        self.at, self.target, self.signum = step, rank, signum
        self.cadence = AgreementCadence(fixed=1)  # the stop must come exactly after ``step``

    def should_stop(self) -> bool:
        if self.rank == self.target and self.progress.step == self.at:
            os.kill(os.getpid(), self.signum)
        return super().should_stop()


def main() -> None:
    run_dir = Path(sys.argv[1])
    cfg = JobConfig(name="test", train=TrainConfig(**json.loads(sys.argv[2])))
    if len(sys.argv) > 3:
        signum = int(signal.Signals[sys.argv[5]]) if len(sys.argv) > 5 else signal.SIGUSR2
        s: Session = SignalAt(run_dir, cfg, int(sys.argv[3]), int(sys.argv[4]), signum)
    else:
        s = Session(run_dir, cfg)
    try:
        with s.start():
            result = run_training(cfg, s)
    except RequeueExit as stop:
        print(json.dumps({"stopped": s.progress.step, "signal": stop.signal, "code": stop.code}))
        _exit(stop.code)
    print(json.dumps(dataclasses.asdict(result)))
    _exit(0)


def _exit(code: object) -> None:
    # Skip the interpreter's 1.5 s teardown of torch's modules: the run is over and flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    main()
