"""A slow own-script loop for the status tests: ``python tests/helpers/slow_steps.py TOTAL``
runs TOTAL steps of 50 ms, logging a row with the step at each."""

from __future__ import annotations

import sys
import time

import hpc_ddp

with hpc_ddp.session() as s:
    for step in s.steps(int(sys.argv[1])):
        time.sleep(0.05)
        s.log(step=step, loss=1.0 / step)
