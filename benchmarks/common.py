"""Small helpers shared by the benchmarks: timing whole commands, report lines, targets.

Every benchmark states what it must reach through :class:`Targets`: one line per target,
``TARGET <name>: <measured> vs <target> -> met|MISSED`` (:data:`TARGET_LINE` parses it back),
and its exit status is :meth:`Targets.exit_code`: 0 only when every target was met.
"""

from __future__ import annotations

import operator
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

TARGET_LINE = re.compile(
    r"^TARGET (?P<name>[^:]+): (?P<measured>.*) vs (?P<target>.*) -> (?P<verdict>met|MISSED)$"
)
"""One target line as :meth:`Targets.check` prints it (``benchmarks/run_all.py`` reads these)."""

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}


class Targets:
    """The targets one benchmark checked, printed as it checks them."""

    def __init__(self) -> None:
        self.missed: list[str] = []
        self.checked: list[str] = []

    def check(
        self, name: str, measured: float, op: str, bound: float, *, fmt: str = ".3g", unit: str = ""
    ) -> bool:
        """Print ``TARGET name: measured vs op bound -> met|MISSED``; True when met."""
        if ":" in name or op not in _COMPARE:
            raise ValueError(
                f"target {name!r} {op!r}: no ':' in a name; op one of {list(_COMPARE)}"
            )
        met = _COMPARE[op](measured, bound)
        verdict = "met" if met else "MISSED"
        print(
            f"TARGET {name}: {measured:{fmt}}{unit} vs {op} {bound:{fmt}}{unit} -> {verdict}",
            flush=True,
        )
        self.checked.append(name)
        if not met:
            self.missed.append(name)
        return met

    def exit_code(self) -> int:
        """0 when at least one target was checked and none was missed, else 1."""
        return 0 if self.checked and not self.missed else 1


def byte_compile_package() -> None:
    """Compile hpc_ddp's modules to bytecode first, as ``pip install`` does.

    The site-packages that the baselines import (submitit, torch) were compiled when pip
    installed them; a checkout run under ``PYTHONDONTWRITEBYTECODE=1`` (or read-only) would
    otherwise compile every hpc_ddp module from source in every process, which no installed
    copy does. Prints that it did, so a report can say so.
    """
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "hpc_ddp")],
        check=True,
        capture_output=True,
    )
    print("(hpc_ddp byte-compiled first, as pip install does for every package)", flush=True)


def time_command(argv: Sequence[str], repeats: int, cwd: Path = REPO) -> list[float]:
    """Wall-clock seconds of ``repeats`` runs of ``argv`` (after one warm-up run)."""
    return time_commands_interleaved({"": argv}, repeats, cwd)[""]


def time_commands_interleaved(
    commands: Mapping[str, Sequence[str]], repeats: int, cwd: Path = REPO
) -> dict[str, list[float]]:
    """Wall-clock seconds of ``repeats`` runs of each command (after one warm-up run of each),
    one run of each in turn per round (the order rotated every round), so a busy spell of the
    machine falls on all of them alike."""
    for argv in commands.values():
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)  # warm-up
    times: dict[str, list[float]] = {label: [] for label in commands}
    labels = list(commands)
    for round_ in range(repeats):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            t0 = time.perf_counter()
            subprocess.run(commands[label], cwd=cwd, check=True, capture_output=True)
            times[label].append(time.perf_counter() - t0)
    return times


def summary(label: str, times: Sequence[float]) -> str:
    """One report line: median, min and max in milliseconds."""
    return (
        f"{label:48} median {1000 * statistics.median(times):8.1f} ms"
        f"   min {1000 * min(times):8.1f}   max {1000 * max(times):8.1f}   (n={len(times)})"
    )
