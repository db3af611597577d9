"""The step path reads nothing back from the device that the user did not ask for.

On a GPU every ``item()``, ``tolist()`` or ``float()`` of a device tensor waits for all the
work queued before it, and the GPU idles while the host catches up. Between two progress
reports hpc-ddp's own step path may read only the stop agreement, from the host buffer it was
copied into one agreement earlier. Counted on CPU with real ranks: a new read in the trainer's
or the session's step path shows up here, whatever device it would run on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.launch import REPO, start_ranks

pytestmark = pytest.mark.torch

AGREEMENT_READ = "runtime.stopflag:read"
HOST_DATA = ("runtime.sampler:", "train.data:")
"""The data loader and the datasets: they work on host memory before any batch reaches the
device, so what they read is never a device tensor (collation and index reads, not syncs)."""
TOTAL, LOG_EVERY = 60, 10


@pytest.mark.parametrize("loop", ["trainer", "session"])
def test_between_reports_the_step_path_reads_only_the_agreement_in_flight(
    tmp_path: Path, loop: str
) -> None:
    script = REPO / "tests" / "helpers" / "host_reads.py"
    ranks = start_ranks([str(script), str(tmp_path / "run"), loop, str(LOG_EVERY), str(TOTAL)], 2)
    try:
        results = ranks.wait(180)
    finally:
        ranks.kill()
    for code, _, err in results:
        assert code == 0, err[-3000:]
    seen = json.loads(results[0][1])
    reports = {s for s in range(1, TOTAL + 1) if s % LOG_EVERY == 0 or s == TOTAL}
    unasked = [
        (s, site)
        for s, site in seen["reads"]
        if site != AGREEMENT_READ and not site.startswith(HOST_DATA) and s not in reports
    ]
    assert unasked == []
    agreement_reads = sorted(s for s, site in seen["reads"] if site == AGREEMENT_READ)
    assert seen["agreements"], "the ranks never read an agreement: nothing was checked"
    assert agreement_reads == sorted(seen["agreements"])  # one read per agreement, no more
