"""Params and the sbatch script: no param value can put shell into a rendered script.

The default script never holds a param (each task reads them from its own config.yaml and
substitutes them into the argv of ``command`` without a shell); a user template that renders
one gets it through the ``q`` filter like any value, and a line break is refused outright.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess

import pytest

from hpc_ddp.backends.slurm.render import RenderContext, default_template_text, render_sbatch
from hpc_ddp.config.load import job_config_from_dict
from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import Params, resolve_command
from hpc_ddp.errors import RenderError

CTX = RenderContext(
    run_dir="/scratch/alice/runs/p-20260101-120000",
    python="/usr/bin/python3",
    config_source="jobs/p.yaml",
    submit_command="hpc-ddp submit jobs/p.yaml",
    generated_at="2026-01-01T12:00:00+00:00",
    version="0.1.0",
)
HOSTILE = [
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "'; touch /tmp/pwned; echo '",
    '"; touch /tmp/pwned; echo "',
    "a b\tc",
    "${HOME}",
    "x && y || z | w > /tmp/f < /etc/passwd &",
    "#SBATCH --partition=evil",
    "\\",
]


def _job(params: dict[str, object]) -> JobConfig:
    data = {"name": "p", "command": ["python", "train.py", "--tag", "{params.tag}"]}
    return job_config_from_dict({**data, "params": params}, "jobs/p.yaml")


@pytest.mark.parametrize("value", HOSTILE)
def test_a_param_never_reaches_the_default_script(value: str) -> None:
    plain = render_sbatch(_job({"tag": "plain"}), CTX)
    hostile = render_sbatch(_job({"tag": value}), CTX)
    assert hostile == plain
    assert "pwned" not in hostile


@pytest.mark.parametrize("value", HOSTILE)
def test_a_param_in_a_command_is_exactly_one_argument(value: str) -> None:
    cfg = _job({"tag": value})
    assert cfg.command is not None
    assert resolve_command(cfg.command, cfg.params) == ("python", "train.py", "--tag", value)


@pytest.mark.parametrize("value", HOSTILE)
def test_a_user_template_renders_a_param_as_one_quoted_word(value: str) -> None:
    template = default_template_text() + "\necho {{ cfg.params.tag | q }}\n"
    script = render_sbatch(_job({"tag": value}), CTX, template)
    last = script.rstrip("\n").splitlines()[-1]
    assert shlex.split(last) == ["echo", value]
    echoed = subprocess.run(["bash", "-c", last], capture_output=True, text=True, check=True)
    assert echoed.stdout == value + "\n"


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b"])
def test_a_line_break_in_a_param_is_refused_even_past_the_loader(value: str) -> None:
    cfg = dataclasses.replace(_job({"tag": "x"}), params=Params({"opt": Params({"tag": value})}))
    with pytest.raises(RenderError, match=r"params\.opt\.tag value .* line break or NUL"):
        render_sbatch(cfg, CTX)
