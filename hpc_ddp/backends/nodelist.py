"""Node lists: ``n[1-3,7],gpu-[01-04]`` to the names they stand for.

Pure. An allocation's nodes are written in Slurm's compact hostlist syntax wherever hpc-ddp
keeps them (``SLURM_JOB_NODELIST``, an attempt's ``nodelist`` in the ledger, a queue's row), so
every backend reads them with :func:`parse_nodelist` (a plain ``a,b`` list is one too):

    n1                      one name
    n[1-3,7]                ranges and single numbers inside brackets
    gpu-[01-04]             zero padding kept: gpu-01 ... gpu-04
    a[1-2],b3,c[05-06]      several groups, separated by commas outside brackets
    rack[1-2]-node[01-02]   several bracket groups in one name: the cartesian product,
                            the leftmost group varying slowest

As ``scontrol show hostnames`` does, whitespace separates groups like a comma, empty groups are
skipped and the order (duplicates included) is kept. Slurm has no step syntax (``[1-9:2]``), so
none is accepted here.
"""

from __future__ import annotations

import itertools
import re

from hpc_ddp.errors import DistEnvError

MAX_NAMES = 65536
"""Refuse lists that expand to more names than this (Slurm's own hostlist limit is 64 Ki per
range); a typo such as ``n[1-99999999]`` fails fast instead of filling memory."""

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_HINT = "HINT: use Slurm's hostlist form, e.g. 'n1', 'n[1-3,7]' or 'gpu-[01-04],cpu7'."


def parse_nodelist(text: str) -> list[str]:
    """Expand a Slurm host list into node names, in Slurm's order.

    Raises :class:`DistEnvError` quoting ``text`` when it names no node or is malformed
    (unbalanced or nested brackets, an empty bracket, a range whose bounds are not numbers or
    run backwards).
    """
    stripped = text.strip()
    if not stripped:
        raise DistEnvError(f"node list {text!r} is empty. {_HINT}")
    names: list[str] = []
    groups = _split_groups(stripped, text)
    if not groups:
        raise DistEnvError(f"node list {text!r} names no node. {_HINT}")
    for group in groups:
        names.extend(_expand_group(group, text))
        if len(names) > MAX_NAMES:
            raise DistEnvError(
                f"node list {text!r} expands to more than {MAX_NAMES} names. {_HINT}"
            )
    return names


def _split_groups(text: str, original: str) -> list[str]:
    """Split on the commas that are outside brackets."""
    groups: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise DistEnvError(f"node list {original!r} has nested brackets. {_HINT}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise DistEnvError(f"node list {original!r} has a ']' without '['. {_HINT}")
        elif (ch == "," or ch.isspace()) and depth == 0:
            groups.append(text[start:i])
            start = i + 1
        elif ch.isspace():
            raise DistEnvError(f"node list {original!r} has a blank inside brackets. {_HINT}")
    if depth != 0:
        raise DistEnvError(f"node list {original!r} has a '[' without ']'. {_HINT}")
    groups.append(text[start:])
    return [g for g in groups if g]


def _expand_group(group: str, original: str) -> list[str]:
    """``rack[1-2]-node[01-02]`` -> the product of its literal parts and bracket sets."""
    # re.split with a capturing group alternates literal, bracket body, literal, ...
    parts = re.split(r"\[([^\]]*)\]", group)
    choices: list[list[str]] = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            choices.append([part])
        else:
            choices.append(_expand_brackets(part, original))
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_brackets(body: str, original: str) -> list[str]:
    """``1-3,7`` -> ``['1', '2', '3', '7']``; ``01-04`` keeps the width of its lower bound."""
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE_RE.match(item)
        if match is None:
            raise DistEnvError(
                f"node list {original!r}: {item!r} in '[{body}]' is not a number or a "
                f"range LO-HI. {_HINT}"
            )
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise DistEnvError(f"node list {original!r}: range {item!r} runs backwards. {_HINT}")
        if hi - lo + 1 > MAX_NAMES:
            raise DistEnvError(
                f"node list {original!r}: range {item!r} has more than {MAX_NAMES} names. {_HINT}"
            )
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out
