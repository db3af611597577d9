"""``hpc-ddp checkpoints RUN_DIR [--json] [--verify]``: step, epoch, time, size, weights digest,
and the state of every ``step-*.pt`` file (ok, damaged or foreign, with the reason)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tabulate import tabulate

from hpc_ddp.cli.runs import require_dir

EPILOG = """\
A file resume cannot use is listed, never fatal: "damaged" (empty, torn, unreadable, a dangling
symlink, malformed, or with --verify weights that no longer match their digest) or "foreign"
(a tensor, another program's file, another format version). Resume skips both and takes the
newest older checkpoint that passes every check, the digest included.

Exit status, the same with and without --json: 0 when the listing succeeds, whatever the files
hold; with --verify, 1 when the newest file is not ok (resume would fall back to an older one,
or to none; stderr says which). RUN_DIR missing or not a directory: 2 (a usage error), with
the error on stderr.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this sub-command's arguments."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("run_dir", help="the run directory (or its checkpoints/ directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also recompute each weights digest from the tensors, as resume does "
        "(reads every byte; without it the tensors are not checked)",
    )


def run(args: argparse.Namespace) -> int:
    """List the checkpoints (this command imports torch: it reads the files)."""
    run_dir = require_dir(args.run_dir)  # before torch is imported: a typo fails at once
    from hpc_ddp.runtime.checkpoint import CheckpointState, list_checkpoints

    infos = list_checkpoints(run_dir, verify=args.verify)
    if args.json:
        rows = [
            {
                "path": str(i.path),
                "step": i.step,
                "epoch": i.epoch,
                "time": i.time,
                "size": i.size,
                "weights_digest": i.weights_digest,
                "state": i.state.value,
                "error": i.error,
            }
            for i in infos
        ]
        print(json.dumps(rows, indent=2))
    else:
        table = [
            [
                i.path.name,
                i.step,
                "-" if i.epoch is None else i.epoch,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.time)) if i.time else "-",
                f"{i.size / 1e6:.1f} MB",
                (i.weights_digest or "-")[:16],
                i.state.value if i.error is None else f"{i.state.value}: {i.error}",
            ]
            for i in infos
        ]
        headers = ["file", "step", "epoch", "saved", "size", "digest", "state"]
        print(tabulate(table, headers=headers))
    newest = infos[-1] if infos else None
    if args.verify and newest is not None and newest.state is not CheckpointState.OK:
        good = [i for i in infos if i.state is CheckpointState.OK]
        fallback = good[-1].path.name if good else "none (no good checkpoint)"
        print(
            f"hpc-ddp checkpoints: newest checkpoint {newest.path.name} is {newest.state.value}: "
            f"{newest.error}; resume would use {fallback}",
            file=sys.stderr,
        )
        return 1
    return 0
