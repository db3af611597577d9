"""A process that has imported torch once and forks the test ranks from there.

Each rank the helpers start (:func:`tests.helpers.launch.start_ranks`) would otherwise spend
about 4 s of CPU before its first line: ``import torch`` (2 s, half of it loading the CUDA
libraries of torch's CUDA wheel, which a CPU machine never uses) and the ``torch._dynamo``
that DDP's constructor and every ``optimizer.step()`` import (1.6 s). The suite runs a few
hundred such ranks on a 2-core machine, where CPU is its wall time.

A rank forked from here is a real process running its script as ``python SCRIPT ARGS`` would:
its own pid, environment, working directory, argv and output files, ``__main__`` run by
:func:`runpy.run_path` (``-m MODULE`` and ``-c CODE`` as ``python`` runs them), the
interpreter's own exit (atexit, a traceback and status 1 for an uncaught exception), real gloo
connections. What it shares with its siblings is what the import left behind: torch's state at
import, and Python's hash seed. The tests of the whole product (the real-cluster and
local-backend suites) start every rank fresh, and ``HPC_DDP_TEST_FRESH_RANKS=1`` starts these
fresh too.

Protocol: one JSON line per request on stdin (``argv``, ``env``, ``cwd``, ``stdout``,
``stderr``: paths); one JSON line per event on stdout: ``{"pid": N}`` for each request in
order, then ``{"exited": N, "code": C}`` (``C`` as ``Popen.returncode``: ``-SIG`` for a
signal). At end of input every child still running is killed and the process exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import select
import signal
import sys
import types
from typing import Any

IMPORTS = ("torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel")
PR_SET_PDEATHSIG = 1


def _send(event: dict[str, Any]) -> None:
    os.write(1, (json.dumps(event) + "\n").encode())


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> dict[str, Any]:
    """Fork a child per request; the child returns its request (the parent never returns)."""
    # Dies with the test process that started it, whatever way that one ends.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for name in IMPORTS:
        __import__(name)
    _send({"ready": os.getpid()})
    children: set[int] = set()
    pending = b""
    while True:
        _reap(children)
        ready, _, _ = select.select([0], [], [], 0.05)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            os._exit(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return dict(request)
            children.add(pid)
            _send({"pid": pid})


def become(request: dict[str, Any]) -> None:
    """In the forked child: turn into ``python ARGV...`` as the request describes."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = list(request["argv"])
    if argv[0] == "-c":  # python -c CODE ARGS
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        return
    if argv[0] == "-m":  # python -m MODULE ARGS: argv[0] becomes the module's file
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the test process's to handle
    become(serve())
