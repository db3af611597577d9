"""The config reference (``docs/config-reference.md``), generated from the model itself.

Every key, its type and default come from the dataclasses in :mod:`hpc_ddp.config.model` (job
files) and :mod:`hpc_ddp.config.sweepfile` (sweep files); the one-line meaning is the class's
attribute docstring (the string right under a field). A test
compares the committed file with :func:`config_reference`, so the reference cannot drift from
the code. Regenerate with ``python -m hpc_ddp.config.reference > docs/config-reference.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any

from hpc_ddp.config import model
from hpc_ddp.config.sweepfile import SweepFile


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of ``cls``: field name -> the string literal right under it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))  # a class may be nested
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            # The docstrings are reStructuredText; the reference is Markdown.
            docs[node.target.id] = " ".join(after.value.value.split()).replace("``", "`")
    return docs


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", "") for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        optional = " or null" if type(None) in args else ""
        return " \\| ".join(names) + optional
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = args[0]
            if typing.get_origin(inner) is tuple and Ellipsis not in typing.get_args(inner):
                return "mapping"  # (name, value) pairs
            return f"list of {_type_name(inner)}"
        return "list"
    mapping = origin if isinstance(origin, type) else hint
    if isinstance(mapping, type) and issubclass(mapping, Mapping):
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _default(f: dataclasses.Field[Any], kind: str) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "**required**"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == () or (isinstance(value, Mapping) and not value):
        return "{}" if kind == "mapping" else "[]"
    return f"`{value}`"


def _rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows: list[tuple[str, str, str, str]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nested = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        if nested and isinstance(nested[0], type):
            sub = nested[0]
            rows.append((f"{prefix}{f.name}", "section", _default(f, ""), _first_line(sub)))
            rows.extend(_rows(sub, f"{prefix}{f.name}."))
            continue
        kind = _type_name(hint)
        rows.append((f"{prefix}{f.name}", kind, _default(f, kind), docs.get(f.name, "")))
    return rows


def _first_line(cls: type) -> str:
    return (inspect.getdoc(cls) or "").splitlines()[0].replace("``", "`")  # RST to Markdown


ROOTS: tuple[type, ...] = (model.JobConfig, SweepFile)
"""The dataclass of each kind of file the reference covers: job files, sweep files."""


def undocumented_keys() -> list[str]:
    """Keys whose field has no attribute docstring, as ``Root: key`` (a test keeps this
    empty)."""
    return [
        f"{root.__name__}: {key}" for root in ROOTS for key, _, _, doc in _rows(root, "") if not doc
    ]


def _table(root: type) -> list[str]:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, kind, default, doc in _rows(root, ""):
        escaped = doc.replace("|", "\\|")
        lines.append(f"| `{key}` | {kind} | {default} | {escaped} |")
    return lines


def config_reference() -> str:
    """The Markdown reference of every job-config key, then of every sweep-file key."""
    lines = [
        "# Job config reference",
        "",
        "Generated from `hpc_ddp/config/model.py` by `python -m hpc_ddp.config.reference`;",
        "do not edit by hand. Any key can also be set on the command line as `KEY=VALUE`",
        "(`train.lr=0.1`), in a site profile, or varied by a sweep.",
        "",
        *_table(model.JobConfig),
        "",
        "## Sweep files",
        "",
        "Generated from `hpc_ddp/sweep/model.py`. `hpc-ddp sweep FILE` reads one; these keys are",
        "valid only there (not in a job file, not as `KEY=VALUE`). The keys under `sweep.grid`,",
        "`sweep.list` and `sweep.random.params` are the job keys above, dotted (`train.lr`), and",
        "each point is a whole job config checked like a job file.",
        "",
        *_table(SweepFile),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
