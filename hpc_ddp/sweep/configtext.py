"""Task configs' YAML for a whole sweep: ``dump_job_config``'s text, at a fraction of the cost.

Every piece of text comes from the config dialect's one writer,
:func:`hpc_ddp.config.yaml_dialect.dump_yaml`; what is saved is the number of calls. In block
YAML without line folding, the text of each top-level key and of each key of a section depends
on that key and its value alone, and the points of a sweep share most values: so each distinct
(section, key, value) is dumped once, all those of a section in one ``dump_yaml`` call, and
each config's text is assembled from those pieces. :func:`config_texts` checks a sample of
the results against ``dump_job_config`` and falls back to it.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_ddp.config.load import dump_job_config, to_plain
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.yaml_dialect import dump_yaml

log = logging.getLogger(__name__)


def config_texts(configs: Sequence[JobConfig]) -> list[str]:
    """``dump_job_config`` of each config, through :class:`ConfigTexts` when it agrees.

    A sample of the configs (the first, which has every section, the last, and a few evenly
    spaced between) is checked against ``dump_job_config``, so that a change of the YAML
    dialect falls back to the slow path rather than writing other text; the tests compare the
    two on many values of every kind.
    """
    try:
        texts = ConfigTexts().dump(configs)
    except TypeError:  # an unhashable value: not from a validated config, but stay correct
        texts = []
    if len(texts) != len(configs) or any(
        texts[i] != dump_job_config(configs[i]) for i in _sample(len(configs))
    ):
        log.warning("fast config dump disagrees with dump_job_config; using the slow one")
        texts = [dump_job_config(c) for c in configs]
    return texts


CHECKED_SAMPLE = 8
"""How many configs of a sweep :func:`config_texts` compares with ``dump_job_config``."""


def _sample(n: int) -> list[int]:
    """Up to :data:`CHECKED_SAMPLE` indices of ``range(n)``: the first, the last, evenly between."""
    if n <= CHECKED_SAMPLE:
        return list(range(n))
    step = (n - 1) / (CHECKED_SAMPLE - 1)
    return sorted({round(i * step) for i in range(CHECKED_SAMPLE)})


_Key = tuple[str, str, type, str]
"""(section, key, the value's type, its repr): one piece of text."""


def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are written alike: equal is not enough (1, 1.0 and True are equal; so are
    0.0 and -0.0), so the types and reprs must agree too."""
    return a is b or (type(a) is type(b) and a == b and repr(a) == repr(b))


@dataclass(eq=False)
class _Section:
    """A section's text as pieces; points that share it (by value) share this object."""

    name: str
    keys: list[_Key]
    text: str | None = None


class ConfigTexts:
    """``dump_job_config`` for many configs that share most values, at a fraction of the cost.

    In block YAML without line folding, the text of each top-level key and of each key of a
    section depends on that key and its value alone. So each section starts from the pieces of
    the last section of its name (reused whole when no value differs) and redoes only the keys
    whose values differ, and each distinct (section, key, value) is dumped once, in one
    ``dump_yaml`` call per section. :func:`config_texts` checks the result against
    ``dump_job_config``.
    """

    def __init__(self) -> None:
        self._pieces: dict[_Key, str] = {}
        self._last: dict[str, tuple[type, tuple[Any, ...], _Section]] = {}
        self._getters: dict[type, tuple[list[str], Callable[[Any], tuple[Any, ...]]]] = {}

    def dump(self, configs: Sequence[JobConfig]) -> list[str]:
        """The text of each config, as ``dump_job_config`` writes it."""
        slow: dict[str, dict[_Key, Any]] = {}
        plans: list[list[_Key | _Section]] = []
        for cfg in configs:
            names, values = self._values(cfg)
            parts: list[_Key | _Section] = []
            for name, value in zip(names, values, strict=True):
                if hasattr(value, "__dataclass_fields__"):
                    parts.append(self._section(name, value, slow))
                else:
                    parts.append(self._want("", name, value, slow))
            plans.append(parts)
        for section, missing in slow.items():
            self._dump_missing(section, missing)
        return ["".join(map(self._text, parts)) for parts in plans]

    def _values(self, obj: Any) -> tuple[list[str], tuple[Any, ...]]:
        cls = type(obj)
        if cls not in self._getters:
            names = [f.name for f in dataclasses.fields(obj)]
            get = operator.attrgetter(*names)
            self._getters[cls] = (
                names,
                get if len(names) > 1 else (lambda o: (get(o),)),
            )
        names, getter = self._getters[cls]
        return names, getter(obj)

    def _section(self, name: str, obj: Any, slow: dict[str, dict[_Key, Any]]) -> _Section:
        names, values = self._values(obj)
        last = self._last.get(name)
        if last is not None and last[0] is type(obj) and _same(last[1], values):
            return last[2]
        if last is None or last[0] is not type(obj):
            keys = [self._want(name, n, v, slow) for n, v in zip(names, values, strict=True)]
        else:
            keys = list(last[2].keys)
            for i, (value, old) in enumerate(zip(values, last[1], strict=True)):
                if not _same(value, old):
                    keys[i] = self._want(name, names[i], value, slow)
        section = _Section(name, keys)
        self._last[name] = (type(obj), values, section)
        return section

    def _text(self, part: _Key | _Section) -> str:
        if not isinstance(part, _Section):
            return self._pieces[part]
        if part.text is None:
            part.text = f"{part.name}:\n" + "".join(self._pieces[k] for k in part.keys)
        return part.text

    def _want(self, section: str, key: str, value: Any, slow: dict[str, dict[_Key, Any]]) -> _Key:
        ident: _Key = (section, key, type(value), repr(value))  # see _same
        if ident not in self._pieces:
            dotted = f"{section}.{key}" if section else key
            slow.setdefault(section, {})[ident] = to_plain(value, dotted)
        return ident

    def _dump_missing(self, section: str, missing: Mapping[_Key, Any]) -> None:
        idents = list(missing)
        body = {f"k{i}": missing[ident] for i, ident in enumerate(idents)}
        text = dump_yaml({section: body} if section else body)
        indent = "  " if section else ""
        if section:
            text = text.split("\n", 1)[1]
        chunks = re.split(rf"(?m)^{indent}k(\d+)(?=:)", text)
        # chunks: ["", "0", ": value\n", "1", ": value\n", ...]
        for number, rest in zip(chunks[1::2], chunks[2::2], strict=True):
            ident = idents[int(number)]
            self._pieces[ident] = f"{indent}{ident[1]}{rest}"
