"""The schema's reading of the dataclasses' type hints."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from hpc_ddp.config import model, sweepfile
from hpc_ddp.config.schema import _type_hints

SECTIONS = [
    c
    for m in (model, sweepfile)
    for c in vars(m).values()
    if isinstance(c, type) and c.__module__ == m.__name__ and dataclasses.is_dataclass(c)
]


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__qualname__)
def test_the_type_hints_are_typings(cls: type[Any]) -> None:
    assert _type_hints(cls) == typing.get_type_hints(cls)


def test_names_are_found_where_typing_finds_them() -> None:
    @dataclasses.dataclass(frozen=True)
    class Probe:
        Alias = int  # the class's own name, not the module's
        alias: Alias  # type: ignore[valid-type]  # (found at run time, as typing finds it)
        anything: Any
        items: list[int]
        nothing: None

    hints = _type_hints(Probe)
    assert hints == typing.get_type_hints(Probe)
    assert hints["alias"] is int
    assert hints["nothing"] is type(None)
