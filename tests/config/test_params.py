"""The free-form ``params:`` section: what it accepts, overrides of any name, ``{params.NAME}``
substitution in a command, and the resolved config round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.config.load import (
    apply_overrides,
    dump_job_config,
    job_config_from_dict,
    load_job_config,
    load_resolved_config,
    split_key,
)
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import Params, as_params, param_text, resolve_command, substitute
from hpc_ddp.config.values import Invalid
from hpc_ddp.errors import ConfigError, OverrideError


def _cfg(params: Any = None, command: list[str] | None = None) -> JobConfig:
    data: dict[str, Any] = {"name": "p"}
    if params is not None:
        data["params"] = params
    if command is not None:
        data["command"] = command
    return job_config_from_dict(data, "jobs/p.yaml")


def _error(params: Any = None, command: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        _cfg(params, command)
    return str(info.value)


# --- what params accepts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1),
        (-3, -3),
        (0.1, 0.1),
        (1e-5, 1e-5),
        (True, True),
        (False, False),
        (None, None),
        ("adamw", "adamw"),
        ("", ""),
        ("007", "007"),
        ({"lr": 0.1, "betas": {"b1": 0.9}}, {"lr": 0.1, "betas": {"b1": 0.9}}),
    ],
)
def test_params_hold_scalars_and_nested_mappings(value: Any, expected: Any) -> None:
    cfg = _cfg({"x": value})
    assert cfg.params == {"x": expected}
    assert type(cfg.params["x"]) is type(expected) or isinstance(cfg.params["x"], Params)


def test_params_default_to_empty_and_null_is_empty() -> None:
    assert _cfg().params == {}
    assert _cfg(None).params == Params()
    assert job_config_from_dict({"name": "p", "params": None}, "x").params == {}


def test_params_are_read_only_hashable_and_keep_file_order() -> None:
    cfg = _cfg({"b": 1, "a": {"y": 2, "x": 3}})
    assert list(cfg.params) == ["b", "a"]
    assert cfg.params.flat() == {"b": 1, "a.y": 2, "a.x": 3}
    with pytest.raises(TypeError):
        cfg.params["b"] = 2  # type: ignore[index]
    assert hash(cfg) == hash(_cfg({"b": 1, "a": {"y": 2, "x": 3}}))
    assert cfg != _cfg({"b": 2, "a": {"y": 2, "x": 3}})


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ([1, 2], "params: expected a mapping of names to values, got a list"),
        ("lr=0.1", "params: expected a mapping of names to values, got string"),
        (
            {"layers": [64, 128]},
            "params.layers: expected a number, string, boolean or null, got a list",
        ),
        ({"a": {"b": [1]}}, "params.a.b: expected a number, string, boolean or null"),
        ({"lr": float("nan")}, "params.lr: must be a finite number"),
        ({"lr": float("inf")}, "params.lr: must be a finite number"),
        ({"bad name": 1}, "'bad name' is not a valid param name"),
        ({"a.b": 1}, "'a.b' is not a valid param name. HINT:"),
        ({"1st": 1}, "'1st' is not a valid param name"),
        ({1: 1}, "1 is not a valid param name"),
        ({"n" * 129: 1}, "over hpc-ddp's limit of 128 characters for a param name"),
        ({"tag": "a\nb"}, "params.tag: 'a\\nb' contains a line break"),
        ({"tag": "x" * 8193}, "over hpc-ddp's limit of 8,192 characters for one value"),
    ],
)
def test_bad_params_name_the_key_and_say_why(params: Any, fragment: str) -> None:
    message = _error(params)
    assert message.startswith("jobs/p.yaml: params")
    assert fragment in message


def test_params_count_towards_the_size_of_a_whole_job() -> None:
    many = {f"p{i}": "x" * 8000 for i in range(9)}  # 72,000 characters of values
    assert "over hpc-ddp's limit of 65,536 for one job" in _error(many)


def test_names_with_dashes_and_underscores_are_accepted() -> None:
    assert _cfg({"batch-size": 1, "_private": 2}).params == {"batch-size": 1, "_private": 2}


# --- overrides: any name under params, typos elsewhere still caught ------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["params.lr=0.1"], {"lr": 0.1, "depth": 4}),
        (["params.new=hello"], {"lr": 0.01, "depth": 4, "new": "hello"}),
        (["params.opt.beta=0.9"], {"lr": 0.01, "depth": 4, "opt": {"beta": 0.9}}),
        (["params={depth: 5}"], {"lr": 0.01, "depth": 5}),
        (["params.depth=null"], {"lr": 0.01, "depth": None}),
        (["params.tag='0.1'"], {"lr": 0.01, "depth": 4, "tag": "0.1"}),
    ],
)
def test_overrides_set_any_param_even_one_not_in_the_file(
    tmp_path: Path, overrides: list[str], expected: dict[str, Any]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: p\nparams: {lr: 0.01, depth: 4}\n")
    assert load_job_config(job, overrides).params == expected


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("param.lr=0.1", "param: unknown key. HINT: did you mean 'params'?"),
        ("train.lrr=0.1", "train.lrr: unknown key. HINT: did you mean 'train.lr'?"),
        ("params.lr=[1, 2]", "params.lr: expected a number, string, boolean or null, got a list"),
        ("params..lr=1", "is not a dotted key"),
        ("params.bad name=1", "'bad name' is not a valid param name"),
    ],
)
def test_bad_param_overrides_are_override_errors(override: str, fragment: str) -> None:
    with pytest.raises(OverrideError) as info:
        apply_overrides({"name": "p"}, [override])
    assert fragment in str(info.value)


def test_split_key_splits_params_at_every_dot() -> None:
    assert split_key("params.opt.lr", "x") == ("params", "opt", "lr")
    assert split_key("env.vars.A.B", "x") == ("env", "vars", "A.B")  # a mapping: one free name


# --- substitution -------------------------------------------------------------------------------

_PARAMS = as_params(
    {
        "lr": 0.1,
        "tiny": 1e-5,
        "steps": 300,
        "amp": True,
        "off": False,
        "none": None,
        "tag": "a b; rm -rf / $(id) `id` 'q' \"d\"",
        "empty": "",
        "opt": {"name": "adamw", "beta": {"b1": 0.9}},
    },
    "params",
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{params.lr}", "0.1"),
        ("--lr={params.lr}", "--lr=0.1"),
        ("{params.tiny}", "1e-05"),
        ("{params.steps}", "300"),
        ("{params.amp}/{params.off}", "true/false"),
        ("{params.none}", "null"),
        ("{params.empty}", ""),
        ("{params.tag}", "a b; rm -rf / $(id) `id` 'q' \"d\""),
        ("{params.opt.name}-{params.opt.beta.b1}", "adamw-0.9"),
        ("{{params.lr}}", "{params.lr}"),
        ("{{params.nope}}", "{params.nope}"),
        ("{{{params.lr}}}", "{{params.lr}}"),  # left to right: "{", an escape, "}"
        ("${HOME}/{x}/{{y}}/{}", "${HOME}/{x}/{{y}}/{}"),
        ('{"lr": {params.lr}}', '{"lr": 0.1}'),
        ("no placeholders", "no placeholders"),
    ],
)
def test_substitution_table(text: str, expected: str) -> None:
    assert substitute(text, _PARAMS, "command[1]") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{params.lrr}", "{params.lrr} names a param that is not defined (defined: params.lr,"),
        ("{params.opt.nam}", "{params.opt.nam} names a param that is not defined"),
        ("{params.lr.x}", "{params.lr.x} names a param that is not defined"),
        ("{params.opt}", "{params.opt} is a mapping, not a value. HINT: name one of its values: "
         "params.opt.name, params.opt.beta.b1"),
        ("--lr={params.lr", "has a '{params.' with no closing '}'"),
        ("{params.a{b}", "has a '{params.' with no closing '}'"),
    ],
)  # fmt: skip
def test_bad_placeholders_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(Invalid) as info:
        substitute(text, _PARAMS, "command[1]")
    assert info.value.key == "command[1]"
    assert fragment in info.value.text


def test_a_value_stays_one_argument_whatever_it_holds() -> None:
    argv = resolve_command(("echo", "{params.tag}", "x{params.empty}y"), _PARAMS)
    assert argv == ("echo", "a b; rm -rf / $(id) `id` 'q' \"d\"", "xy")


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.1, "0.1"), (3e-4, "0.0003"), (1e20, "1e+20"), (2.0, "2.0"), (-7, "-7"), ("s", "s")],
)
def test_param_text_reads_back_as_the_same_value(value: object, text: str) -> None:
    assert param_text(value) == text
    if not isinstance(value, str):
        assert float(text) == value


def test_a_missing_param_fails_when_the_job_is_loaded_naming_it_and_the_defined_ones() -> None:
    message = _error(
        {"lr": 0.1, "opt": {"b1": 0.9}}, ["python", "train.py", "--lr", "{params.lrr}"]
    )
    assert message == (
        "jobs/p.yaml: command[3]: {params.lrr} names a param that is not defined (defined: "
        "params.lr, params.opt.b1). HINT: set params.lrr in the job file or as "
        "params.lrr=VALUE, or fix the name"
    )
    assert "(defined: none)" in _error(None, ["echo", "{params.lr}"])


def test_the_stored_command_keeps_its_placeholders() -> None:
    """The resolved config keeps the template, so a resume with params.lr=... changes the argv."""
    cfg = _cfg({"lr": 0.1}, ["echo", "{params.lr}"])
    assert cfg.command == ("echo", "{params.lr}")
    assert resolve_command(cfg.command, cfg.params) == ("echo", "0.1")


# --- the resolved config round trip -------------------------------------------------------------


def test_params_survive_the_resolved_config_round_trip(tmp_path: Path) -> None:
    params = {
        "lr": 0.1,
        "tiny": 1e-12,
        "n": 12345678901234567,
        "flag": True,
        "none": None,
        "looks_like_int": "007",
        "looks_like_bool": "yes",
        "time": "12:00:00",
        "opt": {"beta": {"b1": 0.9}, "name": "adamw"},
    }
    cfg = _cfg(params, ["echo", "{params.lr}", "{{params.lr}}"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_job_config(cfg))
    again = load_resolved_config(path)
    assert again == cfg
    assert again.params == params
    assert isinstance(again.params["opt"], Params)
    assert again.params["looks_like_int"] == "007"


def test_a_resolved_config_without_params_still_loads(tmp_path: Path) -> None:
    """config.yaml files written before params existed have no such key."""
    path = tmp_path / "config.yaml"
    path.write_text(dump_job_config(_cfg()).replace("params: {}\n", ""))
    assert "params" not in path.read_text()
    assert load_resolved_config(path).params == {}
