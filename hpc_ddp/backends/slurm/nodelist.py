"""Slurm host lists: ``n[1-3,7],gpu-[01-04]`` to the names they stand for.

Pure. Slurm writes node lists (``SLURM_JOB_NODELIST``, ``SLURM_STEP_NODELIST``) in its compact
hostlist syntax:

    n1                      one name
    n[1-3,7]                ranges and single numbers inside brackets
    gpu-[01-04]             zero padding kept: gpu-01 ... gpu-04
    a[1-2],b3,c[05-06]      several groups, separated by commas outside brackets
    rack[1-2]-node[01-02]   several bracket groups in one name: the cartesian product,
                            the leftmost group varying slowest

As ``scontrol show hostnames`` does, whitespace separates groups like a comma, empty groups are
skipped and the order (duplicates included) is kept. Slurm has no step syntax (``[1-9:2]``), so
none is accepted here.

Tasks per node (``SLURM_TASKS_PER_NODE``, ``SLURM_STEP_TASKS_PER_NODE``) use a second compact
form, ``2(x3),1``: a count, repeated for several nodes. :func:`parse_tasks_per_node` expands it.
"""

from __future__ import annotations

import itertools
import re

from hpc_ddp.errors import DistEnvError

MAX_NAMES = 65536
"""Refuse lists that expand to more names than this (Slurm's own hostlist limit is 64 Ki per
range); a typo such as ``n[1-99999999]`` fails fast instead of filling memory."""

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TPN_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
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


def parse_tasks_per_node(text: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's tasks-per-node form (``2``, ``2(x3)``, ``2(x2),1``) to one count per node."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TPN_ITEM.match(item.strip())
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise DistEnvError(
                f"{name}={text!r}: {item!r} is not N or N(xK). HINT: Slurm writes e.g. "
                "'2', '2(x3)' or '2(x2),1'; do not set this variable by hand."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
