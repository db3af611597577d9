"""Which code a run runs: the submit directory, its git commit, and a digest of the job's code.

At submit (login side, never importing torch nor the job's own code) :func:`gather` finds what
goes into the manifest: where the run was submitted from, the git commit and whether the tree
was dirty (``git`` with a short timeout; no git, or no repository: None, never an error), and
the file of the job's code with its digest: for ``command:`` the script it names (``python
train.py``: ``train.py``; ``./run.sh``: ``run.sh``; ``python -m pkg.mod``: the module's file),
for ``entrypoint:`` the module's file; under torchrun (``torchrun ...``, ``python -m
torch.distributed.run ...``, or ``dist.launcher: torchrun``) the script torchrun's workers run,
never torchrun's own file. Modules are found, never imported
(:func:`importlib.machinery.PathFinder`), so a package's heavy dependencies stay unloaded.

On each attempt the task computes the same digest (:func:`code_of`) where the job runs, and
rank 0 appends it to the ledger as a ``code`` event
(:func:`hpc_ddp.rundir.ledger_events.code_event`), read back as :class:`CodeRun`
(:func:`read_code_runs`): ``status`` says when a requeued or resumed attempt ran other code
than the first (:func:`code_change`).

A ``command:`` runs in the directory it was submitted from (:func:`submit_dir_of`): a relative
script path means the same file on a resume started elsewhere.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import resolve_command
from hpc_ddp.rundir.ledger import _time

__all__ = [
    "GIT_TIMEOUT_S",
    "Code",
    "CodeRun",
    "Provenance",
    "code_change",
    "code_of",
    "file_digest",
    "gather",
    "git_state",
    "read_code_runs",
    "torchrun_split",
]

GIT_TIMEOUT_S = 3.0
"""How long a submit waits for each ``git`` call: a hung network file system must not hang it."""
_PYTHON_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})
_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_TORCHRUN_FLAGS = frozenset(
    {"standalone", "no-python", "run-path", "m", "module", "use-env", "virtual-local-rank"}
)
"""torchrun's options that take no value (every other one takes one: ``--nnodes 2``)."""


@dataclass(frozen=True)
class Code:
    """The file of a job's code and its digest (``sha256:<hex>``)."""

    file: str
    digest: str


@dataclass(frozen=True)
class Provenance:
    """What the manifest records of where a run was submitted from and which code it runs."""

    submit_dir: str
    git_commit: str | None
    git_dirty: bool | None
    code: Code | None


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of the file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def torchrun_split(argv: Sequence[str]) -> tuple[dict[str, str], list[str]] | None:
    """(torchrun's options, the program its workers run with its arguments) when ``argv`` runs
    torchrun (``torchrun ...``, ``python -m torch.distributed.run|launch ...``); None when it
    does not. Options are keyed without dashes, ``_`` read as ``-`` (``nproc-per-node``); a
    flag's value is ``""``. Pure."""
    if not argv:
        return None
    program, *args = argv
    name = Path(program).name
    if name == "torchrun":
        rest = args
    elif name.startswith("python"):
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "-m":
            i += 2 if args[i] in _PYTHON_OPTIONS_WITH_VALUE else 1
        if (
            args[i : i + 1] != ["-m"]
            or args[i + 1 : i + 2] == []
            or (args[i + 1] not in _TORCHRUN_MODULES)
        ):
            return None
        rest = args[i + 2 :]
    else:
        return None
    options: dict[str, str] = {}
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "--":
        key, eq, value = rest[i].lstrip("-").partition("=")
        key = key.replace("_", "-")
        if not eq and key not in _TORCHRUN_FLAGS:
            value = rest[i + 1] if i + 1 < len(rest) else ""
            i += 1
        options[key] = value
        i += 1
    if i < len(rest) and rest[i] == "--":
        i += 1
    return options, rest[i:]


def _torchrun_program(
    options: dict[str, str], program: list[str], base: Path, search: Sequence[str]
) -> Path | None:
    """The file of the program torchrun's workers run: a script, ``-m MODULE``'s file, or
    (``--no-python``) an executable named by its path."""
    if not program:
        return None
    if "m" in options or "module" in options:
        return _module_file(program[0], search)
    if "no-python" in options and "/" not in program[0]:
        return None  # found on PATH
    found = base / program[0]
    return found if found.is_file() else None


def code_file(cfg: JobConfig, base: Path, search: Sequence[str]) -> Path | None:
    """The file of the job's own code, relative paths taken from ``base``; ``search`` is where
    its Python finds modules. None for the built-in trainer, ``python -c``, a program on PATH,
    or a file that is not there. Under torchrun, the program its workers run."""
    if cfg.entrypoint:
        return _module_file(cfg.entrypoint.partition(":")[0], search)
    if not cfg.command:
        return None
    argv = list(resolve_command(cfg.command, cfg.params))
    torchrun = torchrun_split(argv)
    if torchrun is not None:
        return _torchrun_program(*torchrun, base, search)
    program, *args = argv
    if cfg.dist.launcher == "torchrun" and program.endswith(".py"):
        found = base / program  # hpc-ddp's torchrun runs a bare script under the interpreter
        return found if found.is_file() else None
    if "/" in program:  # a path: the program itself is the code
        found = base / program
        return found if found.is_file() else None
    if not Path(program).name.startswith("python"):
        return None  # a program found on PATH (bash ...): its first file argument
    return _python_program(args, base, search)


def _python_program(args: Sequence[str], base: Path, search: Sequence[str]) -> Path | None:
    """The file ``python ARGS`` runs: its script, or ``-m MODULE``'s file."""
    it = iter(args)
    for arg in it:
        if arg == "-m":
            module = next(it, None)
            return None if module is None else _module_file(module, search)
        if arg in ("-c", "-"):
            return None
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(it, None)
        elif not arg.startswith("-"):
            script = base / arg
            return script if script.is_file() else None
    return None


def _module_file(name: str, search: Sequence[str]) -> Path | None:
    """The file of module ``name`` (dotted) on ``search``, found without importing anything."""
    top, *rest = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, list(search))
    for part in rest:
        locations = None if spec is None else spec.submodule_search_locations
        if locations is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    if spec is None or not spec.origin or not spec.has_location:
        return None
    origin = Path(spec.origin)
    return origin if origin.is_file() else None


def code_of(cfg: JobConfig, base: Path, search: Sequence[str]) -> Code | None:
    """:func:`code_file` and its digest; None when there is none, or it cannot be read."""
    path = code_file(cfg, base, search)
    if path is None:
        return None
    try:
        return Code(str(path.resolve()), file_digest(path))
    except OSError:
        return None


def git_state(directory: Path, timeout_s: float = GIT_TIMEOUT_S) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether the work tree has changes) of the repository holding
    ``directory``; (None, None) outside one, without git, or when git does not answer."""
    commit = _git(directory, ["rev-parse", "HEAD"], timeout_s)
    if not commit:
        return None, None
    status = _git(directory, ["status", "--porcelain", "--untracked-files=no"], timeout_s)
    return commit.strip(), None if status is None else bool(status.strip())


def _git(directory: Path, args: list[str], timeout_s: float) -> str | None:
    import subprocess  # a real submit only: a dry run never asks git

    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # status must not take index.lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def gather(cfg: JobConfig, submit_dir: Path, search: Sequence[str]) -> Provenance:
    """Everything :class:`Provenance` records, for a job submitted from ``submit_dir``."""
    commit, dirty = git_state(submit_dir)
    return Provenance(str(submit_dir), commit, dirty, code_of(cfg, submit_dir, search))


def search_path(cfg: JobConfig, base: Path, python_path: Sequence[str]) -> list[str]:
    """Where the job's Python finds modules: ``base``, the job's PYTHONPATH, then
    ``python_path`` (this interpreter's ``sys.path``)."""
    job_path = dict(cfg.env.vars).get("PYTHONPATH", "")
    extra = [str(base / p) for p in job_path.split(os.pathsep) if p]
    return [str(base), *extra, *python_path]


def submit_dir_of(cfg: JobConfig, run_dir: Path) -> Path | None:
    """Where a task of the run in ``run_dir`` runs its ``command:``: the directory it was
    submitted from, as its manifest records it (a resume started elsewhere runs the same
    relative script). None when the job is not a command, sets its own ``slurm.extra.chdir``,
    or the manifest names no directory that exists here."""
    from hpc_ddp.errors import RunDirError
    from hpc_ddp.rundir.manifest import read_manifest

    if not cfg.command or "chdir" in dict(cfg.slurm.extra):
        return None
    try:
        recorded = read_manifest(run_dir).submit_dir
    except RunDirError:
        return None
    where = Path(recorded) if recorded else None
    return where if where is not None and where.is_dir() else None


def record_code(cfg: JobConfig, ledger: Path, *, job_id: str | None) -> Code | None:
    """Append this attempt's ``code`` event (the job's code, found from this process's working
    directory and ``sys.path``) to ``ledger``; rank 0's task calls it once per start."""
    import sys

    from hpc_ddp.durable import append_line
    from hpc_ddp.rundir.ledger_events import code_event

    here = Path.cwd()
    code = code_of(cfg, here, search_path(cfg, here, sys.path))
    if code is not None:
        ledger.parent.mkdir(parents=True, exist_ok=True)
        append_line(ledger, code_event(job_id=job_id, file=code.file, digest=code.digest))
    return code


# --- which code each attempt ran ------------------------------------------------------------


@dataclass(frozen=True)
class CodeRun:
    """One ``code`` event: the file of the job's own code and its digest when an attempt
    started (rank 0's task appends it, :mod:`hpc_ddp.rundir.provenance`)::

        {"event": "code", "time": ..., "job_id": "4242", "file": "/home/u/train.py",
         "digest": "sha256:..."}
    """

    time: float
    job_id: str | None
    file: str
    digest: str


def read_code_runs(path: Path) -> list[CodeRun]:
    """Every ``code`` event in the ledger at ``path``, oldest first ([] without a ledger, or
    when it cannot be read: the code is a note of ``status``, never its verdict)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    runs: list[CodeRun] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
            if not isinstance(event, dict) or event.get("event") != "code":
                continue
            file, digest = event["file"], event["digest"]
            if isinstance(file, str) and isinstance(digest, str):
                job_id = None if event.get("job_id") is None else str(event["job_id"])
                runs.append(CodeRun(_time(event["time"]), job_id, file, digest))
        except (ValueError, TypeError, KeyError, OverflowError):
            continue
    return runs


def code_change(runs: list[CodeRun]) -> tuple[CodeRun, CodeRun] | None:
    """(the first attempt's code, the latest attempt's) when they differ, else None."""
    if not runs or runs[-1].digest == runs[0].digest:
        return None
    return runs[0], runs[-1]
