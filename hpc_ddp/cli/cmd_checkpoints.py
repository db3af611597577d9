"""``hpc-ddp checkpoints RUN_DIR [--json] [--verify] [--export FILE]``: step, epoch, time,
size, weights digest, and the state of every ``step-*.pt`` file (ok, damaged or foreign, with
the reason; what a format-1 file restores unverified) and of every sharded ``step-*/``
directory of an FSDP run (ok, or damaged: a shard, ``.metadata`` or the digest record missing,
or with --verify a file that no longer matches its digest). ``--export`` writes the whole model
of the newest verified sharded checkpoint to one ``torch.save`` file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tabulate import tabulate

from hpc_ddp.api.targets import require_dir, sweep_task_of
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.run_id import recorded_run_id

if TYPE_CHECKING:
    from hpc_ddp.checkpoint.format import CheckpointInfo

EPILOG = """\
A file resume cannot use is listed, never fatal: "damaged" (empty, torn, unreadable, not a
regular file, a dangling symlink, malformed, named for another step than the one it holds, or
with --verify any part that no longer matches its digest: the weights, optimizer, scheduler,
scaler, RNG states, progress, extra values, config), "foreign" (a tensor, another program's
file, another format version) or "stranger" (a checkpoint written by another run: both run ids
are named). Resume skips them all and takes the newest older checkpoint that passes every
check, every digest included. A checkpoint written before hpc-ddp recorded run ids has no run
id (null "run_id" in --json): it is accepted, its run unknown.

An FSDP run's checkpoints are directories (step-N/: one shard per rank, DCP's .metadata, a
digest record written last). One lacking any file its record lists, or the record itself (a
save cut short), is "damaged"; --verify hashes every file of every one.

A checkpoint of format 1 (written by hpc-ddp before every part had a digest) still loads, but
only its weights can be verified: it is listed as "ok (format 1: ... unverified)", and --verify
says so on stderr when resume would use it.

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
    parser.add_argument("--json", action="store_true", help="print one JSON object (docs/json.md)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also recompute every digest from the content, as resume does (reads every "
        "byte; without it the content is not checked)",
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="write the whole model of the newest verified sharded (FSDP) checkpoint to FILE, "
        "one torch.save state dict for inference",
    )


def run(args: argparse.Namespace) -> int:
    """List the checkpoints (this command imports torch: it reads the files)."""
    run_dir = Path(args.run_dir)
    if run_dir.exists() or sweep_task_of(run_dir) is None:  # a task not started has none yet
        run_dir = require_dir(args.run_dir)  # before torch is imported: a typo fails at once
    from hpc_ddp.checkpoint.format import CheckpointState, list_checkpoints
    from hpc_ddp.checkpoint.sharded import list_sharded

    own = run_dir.parent if run_dir.name == "checkpoints" else run_dir
    if args.export:
        from hpc_ddp.checkpoint.sharded import export_model

        exported = export_model(run_dir, Path(args.export))
        print(f"hpc-ddp checkpoints: the model of {exported.name} written to {args.export}")
        return 0
    run_id = recorded_run_id(RunPaths(own))
    infos = list_checkpoints(run_dir, verify=args.verify, run_id=run_id)
    infos += list_sharded(run_dir, verify=args.verify, run_id=run_id)  # an FSDP run's step-N/
    infos.sort(key=lambda i: i.step)
    if args.json:
        from hpc_ddp.output import CHECKPOINTS, document

        rows = [
            {
                "path": str(i.path),
                "step": i.step,
                "epoch": i.epoch,
                "saved_at": _iso(i.time),
                "size_bytes": i.size,
                "weights_digest": i.weights_digest,
                "state": i.state.value,
                "error": i.error,
                "version": i.version,
                "unverified": list(i.unverified),
                "run_id": i.run_id,
            }
            for i in infos
        ]
        shown = {"run_dir": str(run_dir), "checkpoints": rows}
        print(json.dumps(document(CHECKPOINTS, shown), indent=2))
    else:
        table = [
            [
                i.path.name,
                i.step,
                "-" if i.epoch is None else i.epoch,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.time)) if i.time else "-",
                f"{i.size / 1e6:.1f} MB",
                (i.weights_digest or "-")[:16],
                _state(i),
            ]
            for i in infos
        ]
        headers = ["file", "step", "epoch", "saved", "size", "digest", "state"]
        print(tabulate(table, headers=headers))
    newest = infos[-1] if infos else None
    good = [i for i in infos if i.state is CheckpointState.OK]
    if args.verify and good and good[-1].unverified:
        print(
            f"hpc-ddp checkpoints: resume would use {good[-1].path.name}, a format-"
            f"{good[-1].version} checkpoint: only its weights were verified; its "
            f"{', '.join(good[-1].unverified)} have no digest",
            file=sys.stderr,
        )
    if args.verify and newest is not None and newest.state is not CheckpointState.OK:
        fallback = good[-1].path.name if good else "none (no good checkpoint)"
        print(
            f"hpc-ddp checkpoints: newest checkpoint {newest.path.name} is {newest.state.value}: "
            f"{newest.error}; resume would use {fallback}",
            file=sys.stderr,
        )
        return 1
    return 0


def _iso(when: float | None) -> str | None:
    """Epoch seconds as ISO 8601 (UTC), as every ``--json`` writes a time; None for none."""
    from datetime import datetime, timezone

    if not when:
        return None
    return datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="seconds")


def _state(info: CheckpointInfo) -> str:
    if info.error is not None:
        return f"{info.state.value}: {info.error}"
    if info.unverified:
        unverified = ", ".join(info.unverified)
        return f"{info.state.value} (format {info.version}: {unverified} unverified)"
    return info.state.value
