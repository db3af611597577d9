"""Frozen dataclasses made without compiling code: ``@dataclass(frozen=True)`` for the config
model, the values derived from it and the rest of what ``submit --dry-run`` defines (the run
directory's paths, a backend's plan, the rendered script's context), as the standard
library's, cheaper to define. Pure, and it imports nothing of hpc_ddp: the bottom layer.

The standard library writes a dataclass's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it when the class is defined,
in every process: ~0.8 ms a class, ~8 ms for the job config's nine sections, paid by every
``hpc-ddp submit`` before it reads a line. Here the standard library makes the class a
dataclass without writing code (its fields, defaults, ``__dataclass_fields__``,
``__match_args__``), and each of those methods is a function of this module closed over the
class's field names: compiled once, into this module's bytecode (~0.2 ms a class). An
instance is made faster too (its dict is filled by two updates, not one call per field);
equality and hashing, rarer, take about twice as long (microseconds).

The class is a frozen dataclass as the standard library's: ``dataclasses.fields``,
``replace``, ``asdict``, ``is_dataclass``; ``__dataclass_params__`` as ``@dataclass(frozen=True)``
leaves it; assigning or deleting a field raises ``FrozenInstanceError``; the same repr, the same
equality (tuples of the fields, the same class only) and the same hash; the same instance
``__dict__``, in field order (copies and pickles alike). Its ``__init__`` takes the fields by
position or name, with their defaults and default factories, and refuses what the generated
one refuses; the class's ``__signature__`` is what ``inspect.signature`` would give for the
generated one.

Type checkers see ``dataclasses.dataclass`` itself (this module passes it through for them).
What this does not cover the standard library's way is refused when the class is defined, with
a TypeError that says to use ``dataclasses.dataclass``: a dataclass base, a ``ClassVar`` or
``InitVar``, ``kw_only`` or ``init=False`` fields, ``__post_init__``, ``__slots__``, a field
named ``self``, a method of its own that a dataclass would write, or a class without a
docstring (the standard library writes one from the signature).
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from collections.abc import Callable
from dataclasses import MISSING
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass"]

_WRITTEN = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")
"""The methods ``@dataclass(frozen=True)`` writes, here shared functions."""

if TYPE_CHECKING:
    from dataclasses import dataclass
else:

    def dataclass(cls: type[Any] | None = None, /, *, frozen: bool = False) -> Any:
        """``@dataclass(frozen=True)``, as the standard library's (see the module docstring)."""
        if not frozen:
            raise TypeError("hpc_ddp.frozen makes frozen dataclasses: pass frozen=True")
        return _make if cls is None else _make(cls)


def _refuse(cls: type[Any], what: str) -> TypeError:
    return TypeError(
        f"{cls.__qualname__}: {what}, which hpc_ddp.frozen does not make. HINT: use "
        "dataclasses.dataclass(frozen=True) for this class"
    )


def _make(cls: type[Any]) -> type[Any]:
    own = cls.__dict__
    for name in (*_WRITTEN, "__post_init__", "__slots__"):
        if name in own:
            raise _refuse(cls, f"it defines {name}")
    if not own.get("__doc__"):
        raise _refuse(cls, "it has no docstring")
    if any(dataclasses.is_dataclass(base) for base in cls.__mro__[1:]):
        raise _refuse(cls, "it has a dataclass base")
    # The standard library finds the fields and sets their defaults; it writes no method.
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    fields = dataclasses.fields(cls)
    if len(fields) != len(cls.__dataclass_fields__):
        raise _refuse(cls, "it has a ClassVar or InitVar")
    for f in fields:
        if f.kw_only or not f.init:
            raise _refuse(cls, f"its field {f.name!r} is kw_only or init=False")
    if "self" in own.get("__annotations__", {}):
        raise _refuse(cls, "it has a field named 'self'")
    params = cls.__dataclass_params__
    params.init = params.repr = params.eq = params.frozen = True  # as @dataclass(frozen=True)
    for method in (
        _init(cls, fields),
        reprlib.recursive_repr("...")(_repr(tuple(f.name for f in fields if f.repr))),
        _eq(tuple(f.name for f in fields if f.compare)),
        _hash(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))),
        *_frozen(cls, frozenset(f.name for f in fields)),
    ):
        method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
        setattr(cls, method.__name__, method)
    cls.__signature__ = _Signature()
    return cls


def _init(cls: type[Any], fields: tuple[dataclasses.Field[Any], ...]) -> Any:
    spec = _Arguments(cls, fields)
    known, factories = spec.known, spec.factories
    # Every field in order, its default or _UNSET: the instance's dict starts as a copy, in
    # the order the generated __init__ sets them.
    start = {name: spec.defaults.get(name, _UNSET) for name in spec.names}
    unset = tuple(name for name in spec.names if name not in spec.defaults)

    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:
        if args:
            kwargs = spec.bind(args, kwargs)
        elif not known.issuperset(kwargs):
            raise spec.unexpected(kwargs)
        state = self.__dict__
        state.update(start)
        state.update(kwargs)
        for name in unset:
            if state[name] is _UNSET:
                if name not in factories:
                    state.clear()
                    raise spec.missing([n for n in unset if n not in kwargs and n not in factories])
                state[name] = factories[name]()

    return __init__


_UNSET: Any = object()
"""A field not given yet (no default: a default factory's, or required)."""


class _Arguments:
    """What a class's ``__init__`` takes, and Python's words for a call it refuses."""

    def __init__(self, cls: type[Any], fields: tuple[dataclasses.Field[Any], ...]) -> None:
        self.names = tuple(f.name for f in fields)
        self.known = frozenset(self.names)
        self.defaults = {f.name: f.default for f in fields if f.default is not MISSING}
        self.factories = {
            f.name: f.default_factory for f in fields if f.default_factory is not MISSING
        }
        optional = [name in self.defaults or name in self.factories for name in self.names]
        if any(optional) and not all(optional[optional.index(True) :]):
            late = self.names[optional.index(False, optional.index(True))]
            raise TypeError(f"non-default argument {late!r} follows default argument")
        self.where = f"{cls.__qualname__}.__init__()"
        least = 1 + optional.count(False)  # self counts, as Python counts
        most = 1 + len(self.names)
        self.takes = str(most) if least == most else f"from {least} to {most}"

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with ``args`` bound to the first fields; refused as Python refuses it
        (the keywords first, then the count)."""
        bound = dict(zip(self.names, args, strict=False))
        for name in kwargs:
            if name not in self.known:
                raise self.unexpected(kwargs)
            if name in bound:
                raise TypeError(f"{self.where} got multiple values for argument {name!r}")
        if len(args) > len(self.names):
            raise TypeError(
                f"{self.where} takes {self.takes} positional arguments but {len(args) + 1} "
                "were given"
            )
        bound.update(kwargs)
        return bound

    def unexpected(self, kwargs: dict[str, Any]) -> TypeError:
        """``got an unexpected keyword argument 'x'``, for the first one."""
        name = next(n for n in kwargs if n not in self.known)
        return TypeError(f"{self.where} got an unexpected keyword argument {name!r}")

    def missing(self, names: list[str]) -> TypeError:
        """``missing 2 required positional arguments: 'a' and 'b'``, as Python says it."""
        quoted = [repr(n) for n in names]
        listed = " and ".join(quoted[-2:])
        if len(quoted) > 2:
            listed = ", ".join(quoted[:-1]) + ", and " + quoted[-1]
        s = "s" if len(names) > 1 else ""
        return TypeError(
            f"{self.where} missing {len(names)} required positional argument{s}: {listed}"
        )


def _repr(names: tuple[str, ...]) -> Any:
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _values(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of the named fields of an instance (C's speed: an attrgetter)."""
    if len(names) == 1:
        (name,) = names
        return lambda self: (getattr(self, name),)
    return operator.attrgetter(*names) if names else lambda self: ()


def _eq(names: tuple[str, ...]) -> Any:
    values = _values(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:  # tuples, as the generated one: `is` counts
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(names: tuple[str, ...]) -> Any:
    values = _values(names)

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen(cls: type[Any], names: frozenset[str]) -> tuple[Any, Any]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


class _Signature:
    """``cls.__signature__``: the generated ``__init__``'s signature, made when first asked
    for (by ``inspect.signature`` or ``help``), never on import."""

    def __get__(self, instance: Any, owner: type[Any]) -> Any:
        import inspect

        params = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=(
                    f.default
                    if f.default is not MISSING
                    else _HasDefaultFactory()
                    if f.default_factory is not MISSING
                    else inspect.Parameter.empty
                ),
                annotation=f.type,
            )
            for f in dataclasses.fields(owner)
        ]
        return inspect.Signature(params, return_annotation=None)


class _HasDefaultFactory:
    """What the generated ``__init__`` shows as the default of a field with a factory."""

    def __repr__(self) -> str:
        return "<factory>"
