"""Which process a local run's controller is, proven from ``/proc`` before anything is signalled.

A local run's job id is the pid of submitit's controller, and pids are reused: once the run
has ended the same number may belong to any process on the machine. So at submit time the
controller's identity goes to ``RUN_DIR/local.json``: pid, start time (field 22 of
``/proc/PID/stat``, in clock ticks since boot, which no later process with that pid can share
until a reboot), boot id, process group, session and command line. ``cancel`` signals the
pid only while the process under it still matches all of them, through a pidfd opened before
the check, so the pid cannot change hands between the check and the signal.

Linux only (``/proc``), as the local backend's controller is.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from hpc_ddp.errors import RunDirError, TargetError

IDENTITY_FILE = "local.json"
CANCELLED_FILE = "local-cancelled"
PROC = Path("/proc")
_PID_RE = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ProcIdentity:
    """What tells one process apart from any later process that gets the same pid."""

    pid: int
    start_ticks: int
    """Field 22 of ``/proc/PID/stat``: when the process started, in clock ticks since boot."""
    boot_id: str
    pgid: int
    sid: int
    cmdline: tuple[str, ...]


def parse_stat(text: str) -> tuple[int, int, int]:
    """``(pgid, sid, start_ticks)`` from the text of ``/proc/PID/stat``.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from the last ``)``.
    """
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): field N is rest[N - 3].
    return int(rest[5 - 3]), int(rest[6 - 3]), int(rest[22 - 3])


def identify(pid: int, proc: Path = PROC) -> ProcIdentity | None:
    """The identity of the process ``pid`` now; None when there is no such process."""
    base = proc / str(pid)
    try:
        pgid, sid, start = parse_stat((base / "stat").read_text())
        raw = (base / "cmdline").read_bytes()
        boot_id = (proc / "sys/kernel/random/boot_id").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    cmdline = tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0") if raw)
    return ProcIdentity(pid, start, boot_id, pgid, sid, cmdline)


def identify_started(pid: int, timeout_s: float = 5.0, proc: Path = PROC) -> ProcIdentity | None:
    """:func:`identify` for a process just started with ``Popen``; None if it is gone.

    ``Popen`` returns once the exec has closed its close-on-exec pipe, but the kernel sets up
    the new program's arguments a moment later: until then ``/proc/PID/cmdline`` is empty, and
    an identity read then would never match the process again.
    """
    deadline = time.monotonic() + timeout_s
    ident = identify(pid, proc)
    while ident is not None and not ident.cmdline and time.monotonic() < deadline:
        time.sleep(0.005)
        ident = identify(pid, proc)
    return ident


def parse_pid(job_id: str, where: str) -> int:
    """A local job id as a pid, refusing what could signal a process group or everything.

    ``os.kill`` reads 0 as "my own process group", -1 as "every process I may signal" and
    other negatives as process groups; 1 is init. None of them is ever a local job.
    """
    if not _PID_RE.fullmatch(job_id) or int(job_id) <= 1:
        raise TargetError(
            f"{where}: local job id {job_id!r} is not a process id (an integer above 1); "
            "nothing was signalled. HINT: the manifest is damaged; stop the run's processes "
            "by hand (see its logs/) or move the run aside."
        )
    return int(job_id)


def write_identity(run_dir: Path, ident: ProcIdentity) -> None:
    """Record the controller's identity in ``RUN_DIR/local.json``."""
    from hpc_ddp.rundir import write_text_atomic

    data = {**asdict(ident), "cmdline": list(ident.cmdline)}
    write_text_atomic(run_dir / IDENTITY_FILE, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_identity(run_dir: Path) -> ProcIdentity | None:
    """The identity recorded at submit time; None when the run has no ``local.json``."""
    path = run_dir / IDENTITY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ident = ProcIdentity(
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            boot_id=str(data["boot_id"]),
            pgid=int(data["pgid"]),
            sid=int(data["sid"]),
            cmdline=tuple(str(a) for a in data["cmdline"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunDirError(
            f"{path}: damaged local process record ({type(exc).__name__}: {exc}); nothing was "
            "signalled. HINT: stop the run's processes by hand (see its logs/) or move it aside."
        ) from None
    return ident


def controller_cmdline_matches(cmdline: tuple[str, ...], run_dir: Path) -> bool:
    """True for submitit's local controller of this run (for runs with no ``local.json``)."""
    return "submitit.local._local" in cmdline and str(run_dir / "submitit") in cmdline


def signal_if_same(expected: ProcIdentity, signum: int, proc: Path = PROC) -> bool:
    """Send ``signum`` to ``expected.pid`` if that process is still ``expected``.

    False (and nothing sent) when the process is gone or the pid now belongs to another one.
    """
    if expected.pid <= 1:
        raise ValueError(f"refusing to signal pid {expected.pid}")
    try:
        # Held open, the pidfd names this process even if it exits and its pid is reused.
        fd = os.pidfd_open(expected.pid)
    except ProcessLookupError:
        return False
    try:
        if identify(expected.pid, proc) != expected:
            return False
        try:
            signal.pidfd_send_signal(fd, signum)
        except ProcessLookupError:
            return False  # it ended after the check
        return True
    finally:
        os.close(fd)


def mark_cancelled(run_dir: Path) -> bool:
    """Note that a person cancelled the run, so ``submit --wait`` reports CANCELLED, not done.

    False when an earlier cancel had already noted it.
    """
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        with (run_dir / CANCELLED_FILE).open("x") as f:
            f.write(stamp + "\n")
    except FileExistsError:
        return False
    return True


def unmark_cancelled(run_dir: Path) -> None:
    """Take back the note of :func:`mark_cancelled` (the signal was not sent after all)."""
    (run_dir / CANCELLED_FILE).unlink(missing_ok=True)


def was_cancelled(run_dir: Path) -> bool:
    """True once :func:`mark_cancelled` was called for the run."""
    return (run_dir / CANCELLED_FILE).exists()
