"""``hpc-ddp ARGV`` run by the CLI's own ``main`` in the test's process, its stdout captured.

For tests of a handler's output over a fake backend, and for e2e tests that only read a run's
files (``checkpoints``): no new process, so no second ``import torch`` (2 s of CPU each).
"""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc_ddp.backends.registry import Registry


def run_cli(*argv: str, backends: Registry | None = None) -> tuple[int, str]:
    """(exit code, stdout) of ``hpc-ddp ARGV`` over ``backends`` (None: the real ones)."""
    from hpc_ddp.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv), backends=backends)
    return code, out.getvalue()
