"""hpc-ddp's YAML dialect: how job files, overrides and resolved configs are read and written.

The dialect is the YAML 1.2 core schema, not PyYAML's 1.1 default: ``12:00:00`` stays a string
(1.1 reads it as the sexagesimal integer 43200), ``yes``/``no``/``on``/``off`` and dates stay
strings, ``1e-3`` is a float, ``007`` is a string, and a key given twice in one mapping is an
error. :func:`dump_yaml` quotes every string that either dialect could misread.

Imports only the standard library, PyYAML and :mod:`hpc_ddp.errors`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpc_ddp.errors import ConfigError

_RESOLVERS: list[tuple[str, str, list[str]]] = [
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    # No leading zeros (PyYAML would read 010 as octal and crash on 08), no underscores.
    ("int", r"^[-+]?(?:0|[1-9][0-9]*)$", list("-+0123456789")),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
    ("merge", r"^(?:<<)$", ["<"]),
]


def _resolver_table() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    table: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for name, pattern, firsts in _RESOLVERS:
        for first in firsts:
            table.setdefault(first, []).append((f"tag:yaml.org,2002:{name}", re.compile(pattern)))
    return table


class _Loader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core scalars that refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":merge"):
                continue
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that quotes strings our loader or a YAML 1.1 reader could misread."""


_Loader.yaml_implicit_resolvers = _resolver_table()
_Dumper.yaml_implicit_resolvers = _resolver_table()
_YAML11 = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    tag = _YAML11.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    ambiguous = tag != _STR_TAG
    return dumper.represent_scalar(_STR_TAG, value, style="'" if ambiguous else None)


_Dumper.add_representer(str, _represent_str)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text in hpc-ddp's dialect; a syntax error names ``source:line:column``."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or exc.context or "syntax error"
        hint = (
            "remove one of the two entries"
            if "duplicate key" in problem
            else "check the indentation and quoting on that line (quote values containing "
            "': ', ' #', '{' or '[')"
        )
        raise ConfigError(f"{where}: invalid YAML: {problem}. HINT: {hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}. HINT: check the file's syntax") from None


def read_yaml(path: Path, what: str = "job file") -> Any:
    """Read and parse one YAML file; a missing or unreadable file is a :class:`ConfigError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such {what}. HINT: check the path (relative paths start from the "
            "current directory)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read {what}: {exc}. HINT: it must be a readable UTF-8 file"
        ) from None
    return parse_yaml(text, str(path))


def load_yaml_value(text: str) -> Any:
    """Read one value (an override's ``VALUE``) in the dialect; raises :class:`yaml.YAMLError`."""
    return yaml.load(text, Loader=_Loader)


def dump_yaml(data: Any) -> str:
    """Plain data as block-style YAML, keys in order, that the dialect reads back unchanged."""
    text: str = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=2**16,
    )
    return text
