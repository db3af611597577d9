"""Which processes a local run is, proven from ``/proc`` before anything is signalled.

A local run's job id is the pid of submitit's controller, and pids are reused: once the run
has ended the same number may belong to any process on the machine. So at submit time the
controller's identity goes to ``RUN_DIR/local.json``, and each rank records its own in
``RUN_DIR/local-ranks/rank-N.json`` when it starts: pid, start time (field 22 of
``/proc/PID/stat``, in clock ticks since boot, which no later process with that pid can share
until a reboot), boot id, process group, session and command line. A run is live while its
controller or any of its ranks still matches its record and its command line names this run
directory (``RUN_DIR/submitit``: a copied run directory keeps the original's records, and the
original's processes are not the copy's); ``cancel`` signals a process only while both hold,
through a pidfd opened before the check, so the pid cannot change hands between the check and
the signal. (Ranks also ask to be SIGTERMed when the controller dies,
:func:`hpc_ddp.job.local_task.run_task`; their records still find them if that failed.)
Processes no record names (a ``command``'s children) are found through the session the
controller leads (:func:`session_members`).

Linux only (``/proc``), as the local backend's controller is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from hpc_ddp.errors import RunDirError, TargetError

IDENTITY_FILE = "local.json"
RANKS_DIR = "local-ranks"
CANCELLED_FILE = "local-cancelled"
PROC = Path("/proc")
PID_MAX_LIMIT = 1 << 22
"""Linux's largest possible pid (``PID_MAX_LIMIT`` on 64-bit; ``kernel/pid_max`` is at most
this): a recorded pid outside 2..this is a damaged record, never a process."""
_PID_RE = re.compile(r"[0-9]{1,7}")


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
    other negatives as process groups; 1 is init. None of them is ever a local job, and
    neither is a number above any pid Linux hands out.
    """
    if not _PID_RE.fullmatch(job_id) or not 1 < int(job_id) <= PID_MAX_LIMIT:
        shown = job_id if len(job_id) <= 40 else job_id[:40] + "..."
        raise TargetError(
            f"{where}: local job id {shown!r} is not a process id (an integer from 2 to "
            f"{PID_MAX_LIMIT}); nothing was signalled. HINT: the manifest is damaged; stop the "
            "run's processes by hand (see its logs/) or move the run aside."
        )
    return int(job_id)


def _identity_data(ident: ProcIdentity) -> str:
    return json.dumps({**asdict(ident), "cmdline": list(ident.cmdline)}, indent=2) + "\n"


def _int_in(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} {str(value)[:40]!r} is not an integer in {low}..{high}")
    return value


def _parse_identity(path: Path) -> ProcIdentity:
    """The identity recorded in ``path``; a :class:`RunDirError` with a hint if it is damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ProcIdentity(
            pid=_int_in(data, "pid", 2, PID_MAX_LIMIT),
            start_ticks=_int_in(data, "start_ticks", 0, 1 << 63),
            boot_id=str(data["boot_id"]),
            pgid=_int_in(data, "pgid", 0, PID_MAX_LIMIT),
            sid=_int_in(data, "sid", 0, PID_MAX_LIMIT),
            cmdline=tuple(str(a) for a in data["cmdline"]),
        )
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunDirError(
            f"{path}: damaged local process record ({type(exc).__name__}: {exc}); nothing was "
            "signalled. HINT: stop the run's processes by hand (see its logs/) or move it aside."
        ) from None


def write_identity(run_dir: Path, ident: ProcIdentity) -> None:
    """Record the controller's identity in ``RUN_DIR/local.json``."""
    from hpc_ddp.durable import write_text_atomic

    write_text_atomic(run_dir / IDENTITY_FILE, _identity_data(ident))


def read_identity(run_dir: Path) -> ProcIdentity | None:
    """The identity recorded at submit time; None when the run has no ``local.json``."""
    try:
        return _parse_identity(run_dir / IDENTITY_FILE)
    except FileNotFoundError:
        return None


# --- the ranks ---------------------------------------------------------------------------------


def write_rank_identity(run_dir: Path, rank: int, ident: ProcIdentity) -> None:
    """Record a rank process's identity in ``RUN_DIR/local-ranks/rank-N.json`` (durably: a
    rank that outlives its controller is found through it)."""
    from hpc_ddp.durable import write_text_atomic

    folder = run_dir / RANKS_DIR
    folder.mkdir(exist_ok=True)
    write_text_atomic(folder / f"rank-{rank}.json", _identity_data(ident))


def clear_rank_identities(run_dir: Path) -> None:
    """Forget an earlier job's ranks before a new job of the run starts (a resumed run)."""
    for path in (run_dir / RANKS_DIR).glob("rank-*.json"):
        path.unlink(missing_ok=True)


def read_rank_identities(run_dir: Path) -> dict[int, ProcIdentity]:
    """Every rank's recorded identity, by rank; {} for a run from before the records."""
    found: dict[int, ProcIdentity] = {}
    try:
        paths = sorted((run_dir / RANKS_DIR).glob("rank-*.json"))
    except OSError:
        return found
    for path in paths:
        number = path.name.removeprefix("rank-").removesuffix(".json")
        if number.isdigit():
            try:
                found[int(number)] = _parse_identity(path)
            except FileNotFoundError:
                continue  # a new job of the run cleared it meanwhile
    return found


def names_run_dir(cmdline: tuple[str, ...], run_dir: Path) -> bool:
    """True when a command line names this run directory's ``submitit`` folder, as both of a
    local run's kinds of process do: the controller (``python -m submitit.local._local
    RUN_DIR/submitit``) and each rank (``python -u -m submitit.core._submit RUN_DIR/submitit``);
    or, under a supervisor (``fault.enabled``), a rank it started (``python -m hpc_ddp run
    RUN_DIR``). Paths are compared as files (a symlinked runs directory names the same one)."""
    if _runs_hpc_ddp(cmdline, run_dir):
        return True
    folder = run_dir.resolve() / "submitit"
    for arg in cmdline:
        if arg == str(folder):
            return True
        if arg.startswith("/") and Path(arg).name == "submitit":
            try:
                if os.path.samefile(arg, folder):
                    return True
            except OSError:
                continue
    return False


def _runs_hpc_ddp(cmdline: tuple[str, ...], run_dir: Path) -> bool:
    """``... -m hpc_ddp run RUN_DIR``: a supervised local rank of this run directory."""
    for i in range(len(cmdline) - 3):
        if cmdline[i : i + 3] == ("-m", "hpc_ddp", "run"):
            with contextlib.suppress(OSError):
                return os.path.samefile(cmdline[i + 3], run_dir)
    return False


def _runs_as_recorded(ident: ProcIdentity, proc: Path) -> bool:
    return identify(ident.pid, proc) == ident


def live_ranks(run_dir: Path, proc: Path = PROC) -> dict[int, ProcIdentity]:
    """The recorded rank processes that still run (a zombie, or a stranger that got the pid,
    does not match its record: its command line or start time differ) and are this run
    directory's (:func:`names_run_dir`)."""
    return {
        rank: ident
        for rank, ident in read_rank_identities(run_dir).items()
        if _runs_as_recorded(ident, proc) and names_run_dir(ident.cmdline, run_dir)
    }


def controller_cmdline_matches(cmdline: tuple[str, ...], run_dir: Path) -> bool:
    """True for submitit's local controller of this run (for runs with no ``local.json``)."""
    return "submitit.local._local" in cmdline and names_run_dir(cmdline, run_dir)


def live_controller(run_dir: Path, job_id: str | None, proc: Path = PROC) -> ProcIdentity | None:
    """The run's controller while it runs: the process recorded in ``local.json`` if it runs
    this run directory's controller (or, for older runs, the pid if it does). A bare pid check
    would call any later process that got the same pid this run."""
    expected = read_identity(run_dir)
    if expected is not None:
        mine = _runs_as_recorded(expected, proc) and names_run_dir(expected.cmdline, run_dir)
        return expected if mine else None
    if not job_id or not _PID_RE.fullmatch(job_id) or not 1 < int(job_id) <= PID_MAX_LIMIT:
        return None
    now = identify(int(job_id), proc)
    if now is not None and controller_cmdline_matches(now.cmdline, run_dir.resolve()):
        return now
    return None


def local_alive(run_dir: Path, job_id: str | None) -> bool:
    """True while the run's controller or any of its ranks runs: one live rank is enough
    for a second job in the same run directory to corrupt it."""
    return live_controller(run_dir, job_id) is not None or bool(live_ranks(run_dir))


def signal_if_same(expected: ProcIdentity, signum: int, proc: Path = PROC) -> bool:
    """Send ``signum`` to ``expected.pid`` if that process is still ``expected``.

    False (and nothing sent) when the process is gone or the pid now belongs to another one.
    """
    if not 1 < expected.pid <= PID_MAX_LIMIT:
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


# --- every process of a run ---------------------------------------------------------------------


def _state_and_session(pid: int, proc: Path) -> tuple[str, int] | None:
    """(state, session) of ``pid`` from ``/proc/PID/stat``; None when there is no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[6 - 3])


def session_members(leader: ProcIdentity, proc: Path = PROC) -> list[ProcIdentity]:
    """Every live process of the session that the recorded controller ``leader`` leads.

    The local controller leads a session of its own (:func:`hpc_ddp.backends.local.controller.
    _start_controller`), and everything the run starts stays in it: the tasks, the
    supervisor's ranks, a ``command``'s children, even once their parent is gone. A session id
    is a pid, and the kernel hands that number to no new process while any member of the
    session lives; so while ``leader.pid`` is either gone or still the leader as recorded, a
    process of that session started since the leader is the run's. Once the number belongs
    to another process, the run's session has ended: [] (and [] for a controller recorded
    before it led its own session, whose session is its caller's). Zombies are left out: they
    are gone, only not yet reaped.
    """
    if leader.sid != leader.pid:
        return []
    now = identify(leader.pid, proc)
    # Compared by start time, not by the whole record: a dead leader not yet reaped (a zombie)
    # has lost its command line, and its session may still have members.
    if now is not None and (now.start_ticks, now.boot_id) != (leader.start_ticks, leader.boot_id):
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        seen = _state_and_session(int(entry.name), proc)
        if seen is None or seen[1] != leader.sid or seen[0] in ("Z", "X"):
            continue
        ident = identify(int(entry.name), proc)
        if ident is None or ident.boot_id != leader.boot_id:
            continue
        if ident.start_ticks >= leader.start_ticks:
            found.append(ident)
    return found


def run_processes(run_dir: Path, job_id: str | None, proc: Path = PROC) -> list[ProcIdentity]:
    """Every process of a local run that still runs: its controller, its ranks (as recorded)
    and every other member of the controller's session (:func:`session_members`), by pid."""
    found = {i.pid: i for i in live_ranks(run_dir, proc).values()}
    controller = live_controller(run_dir, job_id, proc)
    if controller is not None:
        found[controller.pid] = controller
    recorded = read_identity(run_dir)
    if recorded is not None:
        found |= {i.pid: i for i in session_members(recorded, proc)}
    return [found[pid] for pid in sorted(found)]


def describe_processes(idents: list[ProcIdentity], limit: int = 5) -> str:
    """``pid 12 (`python -m hpc_ddp run ...`), pid 13 (...)``: for a message."""
    shown = [f"pid {i.pid} (`{' '.join(i.cmdline)[:80]}`)" for i in idents[:limit]]
    more = f" and {len(idents) - limit} more" if len(idents) > limit else ""
    return ", ".join(shown) + more


KILL_WAIT_S = 30.0
"""How long a local ``cancel`` waits, after its SIGTERM, for every process of the run to end
before it SIGKILLs those left: Slurm's ``KillWait`` (30 s by default) does the same after
``scancel``. A run that stops as asked (the ranks agree on a step, rank 0 saves) is gone well
before; one whose program ignores the signal is killed. ``hpc-ddp cancel --kill-wait S``;
the wait is :func:`hpc_ddp.backends.local.stop.stop_local`'s."""

LocalOutcome = Literal["cancelled", "already_finished", "not_this_run", "still_running"]
"""What a local cancel did: stopped the run, found it ended, found its records naming processes
of another run directory (and signalled nothing), or could not stop every process of it
(:func:`hpc_ddp.backends.local.stop.stop_local` says which still run)."""


@dataclass(frozen=True)
class LocalCancel:
    """The outcome of :func:`cancel_local` and a line saying it."""

    outcome: LocalOutcome
    message: str


def cancel_local(run_dir: Path, job_id: str | None) -> LocalCancel:
    """SIGTERM a local run: its controller if it still is that (it forwards the signal to the
    ranks, which agree on a step, save and stop), else any rank that outlived it.

    Only processes proven to be this run directory's are signalled; records that name live
    processes of another run directory (a copied ``local.json``) signal nothing and say so.
    """
    pid = parse_pid(job_id or "", str(run_dir))
    expected = read_identity(run_dir)
    if expected is not None and expected.pid != pid:
        raise RunDirError(
            f"{run_dir}: the manifest's job id {pid} is not the pid {expected.pid} recorded in "
            "local.json; nothing was signalled. HINT: one of the two files was edited or is "
            "damaged; stop the run's processes by hand (see its logs/)."
        )
    controller = live_controller(run_dir, job_id)
    ranks = live_ranks(run_dir)
    ended = LocalCancel(
        "already_finished", f"{run_dir}: local job {pid} already ended; nothing was signalled"
    )
    if controller is None and not ranks:
        return _foreign(run_dir, pid) or ended
    # Noted before the signal: `submit --wait` may see the end at once.
    marked = mark_cancelled(run_dir)
    if controller is not None and signal_if_same(controller, signal.SIGTERM):
        return LocalCancel("cancelled", f"cancelled local job {pid} ({run_dir})")
    stopped = [rank for rank, ident in ranks.items() if signal_if_same(ident, signal.SIGTERM)]
    if not stopped:
        if marked:
            unmark_cancelled(run_dir)
        return ended
    return LocalCancel(
        "cancelled",
        f"cancelled local job {pid} ({run_dir}): its controller had exited; signalled the "
        f"rank process(es) still running: rank {', '.join(map(str, stopped))}",
    )


def _foreign(run_dir: Path, pid: int, proc: Path = PROC) -> LocalCancel | None:
    """The refusal for records that name live processes of another run directory, or None."""
    recorded = [read_identity(run_dir), *read_rank_identities(run_dir).values()]
    others = [i for i in recorded if i is not None and _runs_as_recorded(i, proc)]
    if not others:
        return None
    other = others[0]
    elsewhere = next((a for a in other.cmdline if Path(a).name == "submitit"), None)
    runs = f"runs {Path(elsewhere).parent}" if elsewhere else "names no run directory"
    return LocalCancel(
        "not_this_run",
        f"{run_dir}: local job {pid} is not this run's: its process {other.pid} "
        f"(`{' '.join(other.cmdline)[:160]}`) {runs}, not {run_dir.resolve()}; nothing was "
        "signalled. HINT: a copied run directory keeps the original's local.json and "
        "manifest.json; cancel the original run by its own directory (`hpc-ddp status` lists "
        "the runs).",
    )


# --- a person's cancel -------------------------------------------------------------------------


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
