"""``hpc-ddp checkpoints RUN_DIR [--json] [--verify] [--export FILE]``: step, epoch, time,
size, weights digest, and the state of every ``step-*.pt`` file (ok, damaged or foreign, with
the reason; what a format-1 file restores unverified) and of every sharded ``step-*/``
directory of an FSDP run (ok, or damaged: a shard, ``.metadata`` or the digest record missing,
or with --verify a file that no longer matches its digest). ``--export FILE`` writes the whole
model of the newest verified checkpoint (a shard set, or a DDP run's ``step-N.pt``) to one
``torch.save`` file: never over an existing file without ``--force``, never into the run's
checkpoints directory."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tabulate import tabulate

from hpc_ddp.api.targets import require_dir, sweep_task_of
from hpc_ddp.errors import CheckpointError
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

--export FILE writes the model's weights of the newest checkpoint that passes every check
(a shard set gathered whole, or a step-N.pt file's weights) to FILE, one torch.save state dict
(model.load_state_dict(torch.load(FILE))). FILE must be in a directory that exists and must not
exist already, unless --force; it is never written inside the run's checkpoints directory.

Exit status, the same with and without --json: 0 when the listing succeeds, whatever the files
hold; with --verify, 1 when the newest file is not ok (resume would fall back to an older one,
or to none; stderr says which). RUN_DIR missing or not a directory: 2 (a usage error), with
the error on stderr; so is an --export FILE that cannot or must not be written (2, with a
HINT). No checkpoint to export: 1.
"""


class ExportPathError(CheckpointError):
    """``--export FILE`` names a file that cannot or must not be written (a usage error)."""

    exit_code = 2


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
        help="write the whole model of the newest verified checkpoint (an FSDP run's shard "
        "set or a DDP run's step-N.pt) to FILE, one torch.save state dict for inference",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --export: replace FILE if it exists (never a file in the run's checkpoints)",
    )


def run(args: argparse.Namespace) -> int:
    """List the checkpoints (this command imports torch: it reads the files)."""
    run_dir = Path(args.run_dir)
    if run_dir.exists() or sweep_task_of(run_dir) is None:  # a task not started has none yet
        run_dir = require_dir(args.run_dir)  # before torch is imported: a typo fails at once
    own = run_dir.parent if run_dir.name == "checkpoints" else run_dir
    if args.export:
        return _export(run_dir, own, export_target(own, args.export, force=args.force), args.json)
    from hpc_ddp.checkpoint.format import CheckpointState, list_checkpoints
    from hpc_ddp.checkpoint.sharded import list_sharded

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


def export_target(run_dir: Path, export: str, *, force: bool) -> Path:
    """``--export``'s FILE once it may be written (checked before torch is imported): not in
    ``run_dir``'s checkpoints (even with ``force``: it would replace or sit among a
    checkpoint's own files), not a directory, in a directory that exists and is writable, and
    not there already unless ``force``; else :class:`ExportPathError` with a HINT."""
    out = Path(export)
    checkpoints = RunPaths(run_dir).checkpoints
    # Resolved, so that a symlink or `..` into the checkpoints is caught too.
    if out.resolve().is_relative_to(checkpoints.resolve()):
        raise ExportPathError(
            f"--export {export} is inside the run's checkpoints directory ({checkpoints}): an "
            "export never writes there, where it would replace a checkpoint's own file. HINT: "
            f"name a file outside it, e.g. --export {run_dir / 'model.pt'}."
        )
    if out.is_dir():
        raise ExportPathError(
            f"--export {export} is a directory. HINT: name the file to write in it, e.g. "
            f"--export {out / 'model.pt'}."
        )
    parent = out.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ExportPathError(
            f"--export {export}: its directory {parent} {what}. HINT: create the directory "
            f"first (`mkdir -p {parent}`), or name a file in one that exists."
        )
    if (out.exists() or out.is_symlink()) and not force:
        raise ExportPathError(
            f"--export {export} exists. HINT: pass --force to replace it, or name another file."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportPathError(
            f"--export {export}: cannot write into {parent} (permission denied). HINT: name a "
            "file in a directory you can write to."
        )
    return out


def _export(run_dir: Path, own: Path, out: Path, as_json: bool) -> int:
    from hpc_ddp.checkpoint.sharded import export_model

    try:
        exported = export_model(run_dir, out, run_id=recorded_run_id(RunPaths(own)))
    except OSError as exc:  # what the checks before could not foresee (a full disk, a race)
        raise ExportPathError(
            f"--export {out}: writing it failed ({exc.strerror or exc}). HINT: check free "
            "space and permissions where FILE goes, or name another file."
        ) from None
    if as_json:
        from hpc_ddp.output import CHECKPOINTS_EXPORT, document

        shown = {
            "run_dir": str(run_dir),
            "checkpoint": str(exported.path),
            "step": exported.step,
            "sharded": exported.path.is_dir(),
            "exported_to": str(out),
            "size_bytes": out.stat().st_size,
        }
        print(json.dumps(document(CHECKPOINTS_EXPORT, shown), indent=2))
    else:
        print(f"hpc-ddp checkpoints: the model of {exported.path.name} written to {out}")
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
