"""frozen: each class it makes behaves as the standard library's @dataclass(frozen=True) would
make it, down to the words of a refused call; what it does not cover is refused; and every
dataclass a dry run defines is made by it."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hpc_ddp.api import job
from hpc_ddp.backends import base, registry
from hpc_ddp.backends.slurm import render
from hpc_ddp.config import (
    elastic,
    images,
    leadtime,
    loginnode,
    model,
    preflight,
    schema,
    sweepfile,
)
from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir import layout
from hpc_ddp.submission import submit

MODULES = (
    model, elastic, images, leadtime, loginnode, preflight, schema, sweepfile,
    layout, base, render, submit, registry, job,
)  # fmt: skip
"""Every module whose dataclasses hpc_ddp.frozen makes: the config package's and the rest of
what a dry run defines."""
CONFIG = "hpc_ddp.config"
FROZEN = "hpc_ddp.frozen"
REPO = Path(__file__).parents[1]


def _twin(module: types.ModuleType) -> types.ModuleType:
    """``module`` executed again with the standard library's decorator."""
    name = f"_stdlib_twin_of_{module.__name__.replace('.', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    source = inspect.getsource(module)
    ours = f"from {FROZEN} import dataclass\n"
    assert source.count(ours) == 1
    twin = types.ModuleType(name)
    sys.modules[name] = twin  # dataclasses looks the module up by name
    exec(compile(source.replace(ours, "from dataclasses import dataclass\n"), name, "exec"),
         twin.__dict__)  # fmt: skip
    return twin


def _made_here(module: types.ModuleType) -> Iterator[type[Any]]:
    for value in vars(module).values():
        if (isinstance(value, type) and value.__module__ == module.__name__
                and dataclasses.is_dataclass(value)):  # fmt: skip
            yield value


PAIRS = [(cls, getattr(_twin(m), cls.__name__)) for m in MODULES for cls in _made_here(m)]


def test_every_frozen_dataclass_of_config_is_made_by_frozen() -> None:
    import pkgutil

    import hpc_ddp.config

    found = []
    for info in pkgutil.iter_modules(hpc_ddp.config.__path__):
        module = sys.modules.get(f"{CONFIG}.{info.name}") or __import__(
            f"{CONFIG}.{info.name}", fromlist=["_"]
        )
        for cls in _made_here(module):
            assert cls.__dataclass_params__.frozen, cls
            assert cls.__init__.__module__ == FROZEN, (
                f"{cls.__qualname__}: import dataclass from {FROZEN}"
            )
            found.append(cls)
    ours = {c.__qualname__ for c, _ in PAIRS if c.__module__.startswith(f"{CONFIG}.")}
    assert ours == {c.__qualname__ for c in found}
    assert len(found) >= 21


def test_every_dataclass_a_dry_run_defines_is_made_by_frozen(tmp_path: Path) -> None:
    """The standard library's costs ~0.8 ms a class to define, in every submit; each one here
    is also held to its standard library twin above (PAIRS)."""
    probe = (
        "import dataclasses, io, sys\n"
        "from contextlib import redirect_stdout\n"
        "from hpc_ddp.cli.main import main\n"
        "with redirect_stdout(io.StringIO()):\n"
        "    assert main(['submit', 'jobs/quickstart.yaml', '--dry-run', '--runs-dir',\n"
        "                 sys.argv[-1], '--backend', 'slurm']) == 0\n"
        "for name, module in sorted(sys.modules.items()):\n"
        "    for value in vars(module).values() if name.split('.')[0] == 'hpc_ddp' else ():\n"
        "        if (isinstance(value, type) and value.__module__ == name\n"
        "                and dataclasses.is_dataclass(value)):\n"
        "            print(name, value.__qualname__, value.__init__.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "runs")],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    defined = [line.split() for line in out.strip().splitlines()]
    assert len(defined) >= 27
    assert [(m, c) for m, c, made_by in defined if made_by != FROZEN] == []
    compared = {(cls.__module__, cls.__qualname__) for cls, _ in PAIRS}
    assert {(m, c) for m, c, _ in defined} <= compared


def _name(value: Any) -> Any:
    return getattr(value, "__qualname__", value)  # a class of the twin module: by its name


def _sample(cls: type[Any]) -> dict[str, Any]:
    """Values for the fields without a default (dataclasses check no types)."""
    return {
        f.name: f"<{f.name}>"
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


@pytest.mark.parametrize(("ours", "std"), PAIRS, ids=lambda c: c.__qualname__)
def test_the_class_is_the_standard_librarys(ours: type[Any], std: type[Any]) -> None:
    def described(cls: type[Any]) -> list[tuple[Any, ...]]:
        return [
            (f.name, f.type, f.default, _name(f.default_factory), f.init, f.repr, f.compare,
             f.hash, f.kw_only, getattr(cls, f.name, "no class attribute"))
            for f in dataclasses.fields(cls)
        ]  # fmt: skip

    assert described(ours) == described(std)
    params = ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
    assert [getattr(ours.__dataclass_params__, p) for p in params] == [
        getattr(std.__dataclass_params__, p) for p in params
    ]
    assert ours.__match_args__ == std.__match_args__
    assert ours.__doc__ == std.__doc__
    assert str(inspect.signature(ours)) == str(inspect.signature(std))
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        assert getattr(ours, name).__qualname__ == f"{ours.__qualname__}.{name}"


@pytest.mark.parametrize(("ours", "std"), PAIRS, ids=lambda c: c.__qualname__)
def test_an_instance_is_the_standard_librarys(ours: type[Any], std: type[Any]) -> None:
    kwargs = _sample(ours)
    a, b = ours(**kwargs), std(**kwargs)
    assert repr(a) == repr(b)
    assert list(vars(a)) == list(vars(b)) == [f.name for f in dataclasses.fields(ours)]
    assert _outcome(hash, a) == _outcome(hash, b)  # a dict field: unhashable in both
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    positional = ours(*(getattr(a, f.name) for f in dataclasses.fields(ours)))
    assert positional == a
    assert _outcome(hash, positional) == _outcome(hash, a)
    assert ours(**kwargs) == a
    assert not ours(**kwargs) != a  # noqa: SIM202  # != is __eq__ negated
    assert a.__eq__(object()) is NotImplemented
    first = dataclasses.fields(ours)[0].name
    other, other_std = (dataclasses.replace(x, **{first: "<another>"}) for x in (a, b))
    assert (other != a) is (other_std != b) is dataclasses.fields(ours)[0].compare
    assert repr(other) == repr(other_std)
    for x in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert x == a
        assert list(vars(x)) == list(vars(a))


@pytest.mark.parametrize(("ours", "std"), PAIRS, ids=lambda c: c.__qualname__)
def test_it_is_frozen_as_the_standard_librarys(ours: type[Any], std: type[Any]) -> None:
    a, b = ours(**_sample(ours)), std(**_sample(std))
    first = dataclasses.fields(ours)[0].name
    for name in (first, "not_a_field"):
        assert _refusal(setattr, a, name, 1) == _refusal(setattr, b, name, 1)
        assert _refusal(delattr, a, name) == _refusal(delattr, b, name)
    assert _refusal(setattr, a, first, 1)[0] is dataclasses.FrozenInstanceError


@pytest.mark.parametrize(("ours", "std"), PAIRS, ids=lambda c: c.__qualname__)
def test_a_call_is_refused_in_the_standard_librarys_words(ours: type[Any], std: type[Any]) -> None:
    kwargs = _sample(ours)
    n = len(dataclasses.fields(ours))
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {**kwargs, "unknown": 1}),
        ((), {"unknown": 1, **kwargs}),
        (tuple(range(n + 1)), {}),
        (tuple(range(n + 2)), {}),
        ((1,), {dataclasses.fields(ours)[0].name: 2}),
        ((1,), {"unknown": 2}),
    ]
    if kwargs:
        calls.append(((), {}))  # every field without a default missing: one, two, four...
    if len(kwargs) > 1:
        calls.append(((), {next(iter(kwargs)): 1}))
    for args, kw in calls:
        mine, theirs = _refusal(ours, *args, **kw), _refusal(std, *args, **kw)
        assert mine[0] is theirs[0] is TypeError
        # Python names the generated function __create_fn__.<locals>.__init__: the words after
        assert mine[1].startswith(f"{ours.__qualname__}.__init__() ")
        assert mine[1].partition("__init__() ")[2] == theirs[1].partition("__init__() ")[2]


def _outcome(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except TypeError as exc:
        return str(exc)


def _refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[type[BaseException], str]:
    try:
        call(*args, **kwargs)
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError(f"{call}{args}{kwargs} was not refused")


def test_a_default_factory_runs_for_each_instance() -> None:
    a, b = model.JobConfig(name="a"), model.JobConfig(name="a")
    assert a.slurm == b.slurm
    assert a.slurm is not b.slurm
    assert model.JobConfig(name="a", slurm=a.slurm).slurm is a.slurm


def test_a_cached_property_still_works_on_a_frozen_instance() -> None:
    slurm = model.SlurmConfig(time="01:30:00")
    assert slurm.time_s == 5400
    assert vars(slurm)["time_s"] == 5400
    assert slurm == model.SlurmConfig(time="01:30:00")  # not a field: neither eq nor hash


def test_a_repr_of_itself_is_cut_short() -> None:
    @dataclass(frozen=True)
    class Node:
        """A node that may hold itself."""

        children: list[Any]

    node = Node([])
    node.children.append(node)
    assert repr(node) == "test_a_repr_of_itself_is_cut_short.<locals>.Node(children=[...])"


def test_what_it_does_not_make_the_standard_librarys_way_is_refused() -> None:
    def refused(body: dict[str, Any], bases: tuple[type, ...] = ()) -> str:
        namespace = {"__doc__": "A probe.", "__annotations__": {"a": "int"}, **body}
        with pytest.raises(TypeError, match=r"HINT: use dataclasses\.dataclass") as info:
            dataclass(frozen=True)(type("Probe", bases, namespace))
        return str(info.value)

    assert "no docstring" in refused({"__doc__": None})
    assert "defines __post_init__" in refused({"__post_init__": lambda self: None})
    assert "defines __repr__" in refused({"__repr__": lambda self: ""})
    assert "defines __slots__" in refused({"__slots__": ()})
    assert "ClassVar" in refused({"__annotations__": {"a": "int", "b": ClassVar[int]}})
    assert "kw_only" in refused({"a": dataclasses.field(kw_only=True)})
    assert "init=False" in refused({"a": dataclasses.field(init=False, default=1)})
    assert "named 'self'" in refused({"__annotations__": {"self": "int"}})
    parent: type[Any] = dataclasses.dataclass(frozen=True)(
        type("Base", (), {"__annotations__": {"z": "int"}})
    )
    assert "dataclass base" in refused({}, (parent,))
    with pytest.raises(TypeError, match="frozen=True"):
        dataclass(type("Probe", (), {"__doc__": "A probe."}))
    with pytest.raises(TypeError, match="frozen=True"):
        dataclass(frozen=False)


def test_a_field_without_a_default_after_one_with_is_refused_as_the_standard_library_does() -> None:
    def probe() -> type[Any]:
        return type(
            "Probe",
            (),
            {"__doc__": "A probe.", "__annotations__": {"a": "int", "b": "int"}, "a": 1},
        )

    with pytest.raises(TypeError) as std:
        dataclasses.dataclass(frozen=True)(probe())
    with pytest.raises(TypeError) as ours:
        dataclass(frozen=True)(probe())
    assert str(ours.value) == str(std.value) == "non-default argument 'b' follows default argument"
