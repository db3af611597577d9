"""Entry point of the ``hpc-ddp`` command: ``main(argv)`` over one small handler per sub-command.

Each handler lives in its own module and is imported only when its sub-command runs, so the
login-node paths (submit, status, logs, cancel) never pay for torch or submitit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

from hpc_ddp import collector
from hpc_ddp.errors import HpcDdpError
from hpc_ddp.output import error_document
from hpc_ddp.version import __version__

if TYPE_CHECKING:
    from hpc_ddp.backends.registry import Registry

# sub-command -> (module under hpc_ddp.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("cmd_init", "write a commented job file (--byo: and a train.py with a session)"),
    "submit": ("cmd_submit", "validate a job config, render its sbatch script and submit it"),
    "resume": ("cmd_resume", "submit a stopped run again to go on from its newest checkpoint"),
    "status": ("cmd_status", "show runs: state, attempts, last checkpoint and loss"),
    "logs": ("cmd_logs", "print (or follow) a run's logs"),
    "cancel": ("cmd_cancel", "cancel a run's Slurm job"),
    "checkpoints": ("cmd_checkpoints", "list a run's checkpoints"),
    "sweep": ("cmd_sweep", "expand a sweep file into one Slurm job array and submit it"),
    "results": ("cmd_results", "gather every sweep task's metrics into one table"),
    "nodes": ("cmd_nodes", "list the lemon record (nodes blamed for faults); --forget NODE"),
    "doctor": (
        "cmd_doctor",
        "check an allocation's nodes: software, GPUs, port, clock, disk, bandwidth",
    ),
    "run": ("cmd_run", "on a Slurm task (or local process): run the job in RUN_DIR"),
    "supervise": (
        "cmd_supervise",
        "in a job's batch script: run its launches, restart them after a fault",
    ),
    "dev-cluster": (
        "cmd_devcluster",
        "a real Slurm on this machine (root, Debian): N nodes, fake GPUs, accounting if asked",
    ),
}

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The whole argument parser; each sub-command module adds its own arguments."""
    parser = argparse.ArgumentParser(
        prog="hpc-ddp",
        description="PyTorch DDP on Slurm that survives preemption, time limits and requeues.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"hpc-ddp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Formatter)
        sp.set_defaults(_module=module)
        _load(module).add_arguments(sp)
    return parser


def _load(module: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"hpc_ddp.cli.{module}")


def _is_override(arg: str) -> bool:
    return "=" in arg and not arg.startswith("-")


def _command_name(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None, *, backends: Registry | None = None) -> int:
    """Run the CLI on ``argv`` and return the exit code (2: usage/config, 1: failure).

    ``backends`` is the registry every handler's runs go through (``args.backends``); None:
    the real backends, each made when first asked for (a dry run makes no Slurm client).
    Tests pass ``Registry(FakeSlurm().client())``
    (:class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`).
    """
    argv = sys.argv[1:] if argv is None else argv
    # Build only the parser of the sub-command asked for: importing every handler would pull
    # in modules the login-node paths must not load.
    name = _command_name(argv)
    parser = build_parser() if name not in COMMANDS else _single_parser(name)
    args, extra = parser.parse_known_args(argv)
    # `submit x.yaml --dry-run train.lr=0.1`: argparse stops filling the KEY=VALUE positional
    # once an option came between; collect such stragglers, refuse anything else.
    if hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *(a for a in extra if _is_override(a))]
        extra = [a for a in extra if not _is_override(a)]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command != "run":
        # On the tasks the session sets up rank-aware logging (INFO on rank 0 only).
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    printed: list[bool] = []
    # `results --json` is `--format json`.
    as_json = getattr(args, "json", False) is True or getattr(args, "format", None) == "json"
    try:
        module = _load(args._module)
        # Start-up ends here but for `run`, whose start-up (torch, the model) ends with its
        # first training step or where it hands over to the job's own code.
        if args.command != "run":
            collector.release()
        args.backends = backends if backends is not None else _real_backends()
        handler: Handler = module.run
        with _watched_stdout(as_json) as printed:
            code = handler(args)
        sys.stdout.flush()  # a reader that has gone shows here, not at the interpreter's exit
        return code
    except HpcDdpError as exc:
        print(f"hpc-ddp {args.command}: error: {exc}", file=sys.stderr)
        # A script reading --json gets one object either way: the verb's own, or this one.
        if as_json and not printed:
            import json  # only here: most commands never need it

            print(json.dumps(error_document(args.command, str(exc), exc.exit_code)), flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


class _Watched:
    """A text stream that notes in ``printed`` whether anything was written to it."""

    def __init__(self, inner: IO[str], printed: list[bool]) -> None:
        self._inner = inner
        self._printed = printed

    def write(self, text: str) -> int:
        if text and not self._printed:
            self._printed.append(True)
        return self._inner.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def _watched_stdout(watch: bool) -> Iterator[list[bool]]:
    """``sys.stdout`` watched (``watch``: a ``--json`` command) while a handler runs:
    ``[True]`` once it printed anything (its own object: an error after it must not print a
    second one), else ``[]``. Other commands keep their stdout as it is: ``run`` hands it to
    the user's own code."""
    printed: list[bool] = []
    if not watch:
        yield printed
        return
    inner = sys.stdout
    sys.stdout = _Watched(inner, printed)
    try:
        yield printed
    finally:
        sys.stdout = inner


PIPE_CLOSED_EXIT_CODE = 141
"""Exit status when the reader of stdout went away (``status | head -1``): 128 + SIGPIPE, what
a shell reports for ``cat``, ``grep`` or any tool that dies of the SIGPIPE Python ignores. So
``set -o pipefail`` treats hpc-ddp like them, and the code stays apart from 1 (a failure, a
damaged run) and 2 (a usage error): the output was cut short, nothing failed."""


def _reader_gone() -> int:
    """Python's recipe for a closed stdout (the ``signal`` module's notes on SIGPIPE): point
    fd 1 at /dev/null, so that flushing at exit finds no closed pipe and prints no traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout with no file descriptor (captured by a test)
        pass
    return PIPE_CLOSED_EXIT_CODE


def _real_backends() -> Registry:
    # Imported here: --help and a usage error need no backend.
    from hpc_ddp.backends.registry import Registry

    return Registry()


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, with the terminal's width found without ``shutil``.

    argparse makes a formatter for every ``add_argument`` (to check its help text), and its own
    asks ``shutil.get_terminal_size``: importing shutil (and bz2, lzma, fnmatch with it) was
    ~2 ms of every command, ``submit --dry-run`` included. Same rule as shutil's: ``$COLUMNS``,
    else the terminal of stdout, else 80; minus 2, as argparse does.
    """

    def __init__(self, prog: str, **kwargs: Any) -> None:
        if kwargs.get("width") is None:
            kwargs["width"] = _columns() - 2
        super().__init__(prog, **kwargs)


def _columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
        return 80


def _single_parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpc-ddp", formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"hpc-ddp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    module, help_text = COMMANDS[name]
    sp = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Formatter)
    sp.set_defaults(_module=module)
    _load(module).add_arguments(sp)
    return parser


def entrypoint() -> None:
    """Console-script wrapper around :func:`main`, with the garbage collector held off while the
    command starts (:mod:`hpc_ddp.collector`)."""
    collector.hold()
    try:
        code = main()
    finally:
        collector.freeze_for_exit()
    sys.exit(code)
