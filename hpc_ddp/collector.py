"""Python's cyclic garbage collector, held off while an ``hpc-ddp`` process starts.

Starting makes a great many objects and next to no cyclic garbage: the modules of a verb (~20,000
objects for ``submit --dry-run``), and on a task torch, ``torch._dynamo`` (which every
optimizer imports) and the model (millions). The collector's passes over them are pure cost:
~8 ms of a 60 ms dry run, ~0.4 s of CPU in each rank's restart, and ~0.6 s as a rank exits,
when the interpreter's last pass walks everything torch made (which is what a Slurm stop waits
for). So :func:`hold` turns it off at the first line of the command, and :func:`release`, once
start-up is over, freezes what is alive (out of every later pass, that last one included) and
turns it back on: whatever runs after that (training, a user's entry point, ``logs -f``)
collects as usual.

What start-up leaves as cyclic garbage is frozen with the rest and never freed: ~2,000 small
objects on a resumed resnet18 rank (functions, cells and frames of import-time cycles; not one
tensor), against ~350,000 alive. A full collection to free them would cost ~0.25 s there.
"""

from __future__ import annotations

import gc

_held = False


def hold() -> None:
    """Turn the collector off until :func:`release` (nothing when it is off already)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release() -> None:
    """Freeze every object alive now and turn the collector back on, if :func:`hold` turned it
    off; otherwise nothing, so any caller may say start-up is over (the first one counts)."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def freeze_for_exit() -> None:
    """Freeze what is alive as the process ends: the interpreter's last collection then walks
    only what was made since, not every object torch and the model made."""
    release()
    gc.freeze()
