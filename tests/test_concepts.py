"""docs/concepts.md names only what exists: config keys, session calls, modules and functions,
CLI verbs and their options, public classes.

The guide is checked like the config reference: every name in backticks that looks like one
of hpc-ddp's must resolve, so a rename breaks this test, not a reader's trust.
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import hpc_ddp
from hpc_ddp.cli.main import COMMANDS, build_parser
from hpc_ddp.config.reference import config_reference
from hpc_ddp.sessions.session import Session

DOC = Path(__file__).resolve().parents[1] / "docs" / "concepts.md"
SECTIONS = ("slurm", "env", "dist", "train", "requeue", "fault", "params")
_CODE = re.compile(r"`([^`\n]+)`")


def spans(text: str) -> list[str]:
    """Everything in single backticks."""
    return _CODE.findall(text)


def config_keys() -> set[str]:
    """Every dotted key of a job file, as the generated reference lists them."""
    return set(re.findall(r"^\| `([a-z_.]+)` \|", config_reference(), re.MULTILINE))


def resolve_dotted(path: str) -> Any:
    """``hpc_ddp.runtime.sampler.ResumableLoader``: the longest importable module, then
    attributes; raises if any part does not exist."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(path)


def _verb_options(verb: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o for action in sub.choices[verb]._actions for o in action.option_strings}


def check_span(span: str, keys: set[str]) -> str | None:
    """Why ``span`` names something that does not exist, or None."""
    head = span.split(maxsplit=1)[0].split("(", maxsplit=1)[0].rstrip(":,")
    if head.split(".")[0] in SECTIONS and "." in head:
        return None if head in keys else f"no config key {head!r}"
    if head.startswith("s.") and head.count(".") == 1:
        known = hasattr(Session, head[2:]) or head[2:] in Session.__annotations__
        return None if known else f"Session has no {head[2:]!r}"
    if head.startswith("hpc_ddp."):
        try:
            resolve_dotted(head)
        except (ImportError, AttributeError):
            return f"{head!r} does not exist"
        return None
    if span.startswith("hpc-ddp "):
        words = span.split()
        verb = words[1]
        if verb not in COMMANDS:
            return f"no verb {verb!r}"
        missing = [w for w in words[2:] if w.startswith("--") and w not in _verb_options(verb)]
        return f"hpc-ddp {verb} has no {missing}" if missing else None
    return None


def test_every_name_the_concepts_guide_gives_exists() -> None:
    keys = config_keys()
    problems = [f"`{s}`: {why}" for s in spans(DOC.read_text()) if (why := check_span(s, keys))]
    assert problems == []


def test_hpc_ddp_classes_it_names_are_public() -> None:
    named = {s for s in spans(DOC.read_text()) if s in ("PeerError", "Progress")}
    assert named == {"PeerError", "Progress"}
    for name in named:
        assert name in hpc_ddp.__all__


@pytest.mark.parametrize(
    ("span", "wrong"),
    [
        ("train.grad_acum", "no config key"),
        ("s.main_frist()", "Session has no"),
        ("hpc_ddp.runtime.sampler.NoSuchLoader", "does not exist"),
        ("hpc_ddp.runtime.no_such_module", "does not exist"),
        ("hpc-ddp resum RUN_DIR", "no verb"),
        ("hpc-ddp resume RUN_DIR --elastik", "has no"),
    ],
)
def test_the_check_catches_a_name_that_does_not_exist(span: str, wrong: str) -> None:
    assert wrong in (check_span(span, config_keys()) or "")


def test_the_check_passes_names_that_exist() -> None:
    keys = config_keys()
    for span in ("dist.init_method", "train.dataset: synthetic", "s.loader(dataset, ...)",
                 "hpc_ddp.job.task.run_job", "hpc-ddp resume RUN_DIR --elastic",
                 "hpc-ddp checkpoints RUN_DIR --verify"):  # fmt: skip
        assert check_span(span, keys) is None, span
