"""hpc-ddp's YAML dialect: how job files, overrides and resolved configs are read and written.

The dialect is the YAML 1.2 core schema, not PyYAML's 1.1 default: ``12:00:00`` stays a string
(1.1 reads it as the sexagesimal integer 43200), ``yes``/``no``/``on``/``off`` and dates stay
strings, ``1e-3`` is a float, ``007`` is a string, and a key given twice in one mapping is an
error. :func:`dump_yaml` quotes every string that either dialect could misread.

Reading is bounded, so a hostile or mistaken file fails fast with a :class:`ConfigError` that
names the limit instead of eating the login node's memory ("billion laughs": a few lines of
nested aliases that expand to billions of values):

- a file is at most :data:`MAX_FILE_BYTES` long, checked before it is parsed;
- one scalar is at most :data:`MAX_SCALAR_CHARS` characters, an integer at most
  :data:`MAX_INT_DIGITS` digits;
- with every alias (``*name``) expanded in full, a document holds at most
  :data:`MAX_EXPANDED_VALUES` values and :data:`MAX_EXPANDED_CHARS` characters of scalar text,
  nests at most :data:`MAX_DEPTH` levels deep, and no alias may contain itself.

The expansion is measured on the composed node graph, where each anchor is one node however
often it is used, so measuring costs as much as the file is long, never as much as it expands.

Imports only the standard library, PyYAML and :mod:`hpc_ddp.errors`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpc_ddp.errors import ConfigError

MAX_FILE_BYTES = 1024 * 1024
"""A job, site-profile or sweep file is at most 1 MiB (a 10,000-point sweep list is ~650 KB)."""
MAX_SCALAR_CHARS = 8192
"""One value is at most 8192 characters: every value ends up on one line of an sbatch script."""
MAX_INT_DIGITS = 20
"""An integer has at most 20 digits (64 bits); Python refuses to read one past 4300 digits."""
MAX_EXPANDED_VALUES = 250_000
"""Values (scalars, lists, mappings) in one document with its aliases expanded."""
MAX_EXPANDED_CHARS = 4 * 1024 * 1024
"""Characters of scalar text in one document with its aliases expanded."""
MAX_DEPTH = 32
"""Levels of nested lists and mappings (a job file needs 4)."""

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


class YamlLimitError(yaml.MarkedYAMLError):
    """A document is over one of this module's limits; ``hint`` says what to do instead."""

    def __init__(self, problem: str, mark: yaml.Mark | None, hint: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.hint = hint


def _over(what: str, size: int, limit: int, unit: str) -> str:
    return f"{what} has {size:,} {unit}, over hpc-ddp's limit of {limit:,} {unit}"


def _too_deep(node: yaml.Node) -> YamlLimitError:
    return YamlLimitError(
        f"values are nested more than {MAX_DEPTH} levels deep, over hpc-ddp's limit",
        node.start_mark,
        "flatten the structure: a job file needs only section: {key: value}",
    )


class _Expansion:
    """Measures a composed node graph as if every alias were expanded, without expanding it."""

    def __init__(self, anchors: dict[str, yaml.Node]) -> None:
        self.names = {id(node): name for name, node in anchors.items()}
        self.sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (values, chars, height)
        self.open: set[int] = set()

    def measure(self, node: yaml.Node, depth: int = 1) -> tuple[int, int, int]:
        """(values, characters, height) of ``node`` expanded; raises past a limit."""
        if depth > MAX_DEPTH:
            raise _too_deep(node)
        key = id(node)
        known = self.sizes.get(key)
        if known is None and key in self.open:
            name = self.names.get(key, "?")
            raise YamlLimitError(
                f"the alias *{name} is used inside its own anchor &{name}, so it never ends",
                node.start_mark,
                f"write the values of &{name} out instead of referring to it from within",
            )
        if known is None:
            known = self._measure_new(node, key, depth)
        if depth - 1 + known[2] > MAX_DEPTH:  # an alias to something deep, used deep down
            raise _too_deep(node)
        return known

    def _measure_new(self, node: yaml.Node, key: int, depth: int) -> tuple[int, int, int]:
        if isinstance(node, yaml.ScalarNode):
            size = (1, len(node.value), 1)
        else:
            self.open.add(key)
            children: list[yaml.Node] = (
                [n for pair in node.value for n in pair]
                if isinstance(node, yaml.MappingNode)
                else list(node.value)
            )
            values, chars, height = 1, 0, 1
            for child in children:
                v, c, h = self.measure(child, depth + 1)
                values, chars, height = values + v, chars + c, max(height, h + 1)
                if values > MAX_EXPANDED_VALUES or chars > MAX_EXPANDED_CHARS:
                    break  # over already: the caller reports it
            self.open.discard(key)
            size = (values, chars, height)
        self.sizes[key] = size
        return size

    def check(self, root: yaml.Node) -> None:
        """Raise if ``root`` expanded is over a limit (measuring stops soon after it is)."""
        values, chars, _ = self.measure(root)
        over = _expanded_over(values, chars)
        if over is None:
            return
        anchors = [(self.sizes[k][:2], name) for k, name in self.names.items() if k in self.sizes]
        if not anchors:
            raise YamlLimitError(
                f"the document holds {over}, over hpc-ddp's limit",
                root.start_mark,
                "is it the right file? Split a very large sweep into several sweep files",
            )
        by_chars = values <= MAX_EXPANDED_VALUES  # the characters are what is over
        (a_values, a_chars), name = max(anchors, key=lambda a: a[0][::-1] if by_chars else a[0])
        size = _expanded_over(a_values, a_chars) or (
            f"{a_chars:,} characters" if by_chars else f"{a_values:,} values"
        )
        raise YamlLimitError(
            f"with its aliases expanded, the document holds {over}, over hpc-ddp's limit",
            root.start_mark,
            f"the anchor &{name} alone expands to {size}; use fewer or smaller aliases (each "
            "use counts in full), or split the sweep into several files",
        )


def _expanded_over(values: int, chars: int) -> str | None:
    if values > MAX_EXPANDED_VALUES:
        return f"more than {MAX_EXPANDED_VALUES:,} values"
    if chars > MAX_EXPANDED_CHARS:
        return f"more than {MAX_EXPANDED_CHARS:,} characters"
    return None


class _Loader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core scalars that refuses duplicate keys and measures what it
    composes against the limits above."""

    def compose_document(self) -> yaml.Node | None:
        self.get_event()  # type: ignore[no-untyped-call]  # DOCUMENT-START
        node = self.compose_node(None, None)  # type: ignore[arg-type]  # PyYAML passes None
        self.get_event()  # type: ignore[no-untyped-call]  # DOCUMENT-END
        if node is not None:
            _Expansion(self.anchors).check(node)
        self.anchors = {}
        return node

    def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:  # the anchor's name or None
        node = super().compose_scalar_node(anchor)
        if len(node.value) > MAX_SCALAR_CHARS:
            raise YamlLimitError(
                _over("a value", len(node.value), MAX_SCALAR_CHARS, "characters")
                + f" ({node.value[:40]!r}...)",
                node.start_mark,
                "values go into the generated sbatch script; keep large data in a file and "
                "give its path",
            )
        digits = len(node.value.lstrip("+-"))
        if node.tag.endswith(":int") and digits > MAX_INT_DIGITS:
            raise YamlLimitError(
                _over("an integer", digits, MAX_INT_DIGITS, "digits"),
                node.start_mark,
                "no setting takes so large a number; quote it if it is meant as text",
            )
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep)


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
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


class _Fallback(Exception):
    """The fast loader leaves this document to :class:`_Loader`, whose messages are the ones
    users see (an error, or a limit reached)."""


if yaml.__with_libyaml__:

    class _FastLoader(yaml.CSafeLoader):
        """libyaml's parser and composer (in C, ~5x faster than PyYAML's on a job file) with
        :class:`_Loader`'s resolvers and duplicate-key check. libyaml composes the whole
        document without calling back, so the limits are checked on the composed graph
        afterwards; any error or limit falls back to :class:`_Loader` for its exact message."""

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            _refuse_duplicate_keys(node)
            return super().construct_mapping(node, deep)

    _FastLoader.yaml_implicit_resolvers = _resolver_table()


def _load_fast(text: str) -> Any:
    """``text`` read by :class:`_FastLoader`; :class:`_Fallback` for anything but a document
    within every limit."""
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_scalars(node)
            _Expansion({}).check(node)
        return None if node is None else loader.construct_document(node)
    except (yaml.YAMLError, RecursionError) as exc:
        raise _Fallback from exc
    finally:
        loader.dispose()


def _check_scalars(root: yaml.Node) -> None:
    """What :meth:`_Loader.compose_scalar_node` checks, over a composed graph (each node once)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            too_long = len(node.value) > MAX_SCALAR_CHARS
            if too_long or (node.tag.endswith(":int") and len(node.value) > MAX_INT_DIGITS):
                raise YamlLimitError("over a limit", node.start_mark, "")  # _Loader says which
        elif isinstance(node, yaml.MappingNode):
            todo.extend(n for pair in node.value for n in pair)
        else:
            todo.extend(node.value)


# libyaml's emitter when PyYAML was built with it: the same text as PyYAML's Python emitter (a
# port of libyaml's; tests/config/test_load.py compares the two), 4x faster, which is
# most of writing a thousand task configs for a sweep.
_SafeDumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper


class _Dumper(_SafeDumper):  # type: ignore[misc,valid-type]
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
    """Parse YAML text in hpc-ddp's dialect; a syntax error names ``source:line:column``.

    A document over one of the limits (see the module docstring) is a :class:`ConfigError`
    naming the limit.
    """
    try:
        return load_yaml_value(text)
    except YamlLimitError as exc:
        raise ConfigError(f"{_where(exc, source)}: {exc.problem}. HINT: {exc.hint}") from None
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "syntax error"
        hint = (
            "remove one of the two entries"
            if "duplicate key" in problem
            else "check the indentation and quoting on that line (quote values containing "
            "': ', ' #', '{' or '[')"
        )
        raise ConfigError(f"{_where(exc, source)}: invalid YAML: {problem}. HINT: {hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}. HINT: check the file's syntax") from None


def _where(exc: yaml.MarkedYAMLError, source: str) -> str:
    mark = exc.problem_mark or exc.context_mark
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source


def read_yaml(path: Path, what: str = "job file") -> Any:
    """Read and parse one YAML file; a missing, unreadable or too large file (over
    :data:`MAX_FILE_BYTES`) is a :class:`ConfigError`."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never more, whatever the file is (a FIFO...)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such {what}. HINT: check the path (relative paths start from the "
            "current directory)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory, not a {what}. HINT: give the path of a YAML file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read {what}: {exc}. HINT: it must be a readable UTF-8 file"
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{path}: the {what} is larger than {MAX_FILE_BYTES:,} bytes, hpc-ddp's limit for "
            "a YAML file. HINT: is it the right file? Keep data in files the job reads and "
            "give their paths; split a very large sweep into several sweep files"
        )
    return parse_yaml(text, str(path))


def load_yaml_value(text: str) -> Any:
    """Read one document (an override's ``VALUE``) in the dialect, within the limits.

    Raises :class:`yaml.YAMLError`; a :class:`YamlLimitError` (with a ``hint``) past a limit.
    """
    if yaml.__with_libyaml__:
        try:
            return _load_fast(text)
        except _Fallback:
            pass
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:  # nested deeper than PyYAML's recursive composer can go
        raise YamlLimitError(
            f"values are nested more than {MAX_DEPTH} levels deep, over hpc-ddp's limit",
            None,
            "flatten the structure: a job file needs only section: {key: value}",
        ) from None


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
