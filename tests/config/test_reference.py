"""The config reference: every key documented, and docs/config-reference.md current."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpc_ddp.config import model
from hpc_ddp.config.reference import config_reference, field_docs, undocumented_keys

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"
REGENERATE = ".venv/bin/python -m hpc_ddp.config.reference > docs/config-reference.md"


def test_every_key_has_an_attribute_docstring() -> None:
    assert undocumented_keys() == [], "add a docstring under each of these fields in model.py"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert DOCS.read_text(encoding="utf-8") == config_reference(), (
        f"docs/config-reference.md is out of date. Regenerate it with: {REGENERATE}"
    )


def test_the_reference_has_one_row_per_key_with_its_type_and_default() -> None:
    text = config_reference()
    assert "| `params` | mapping | {} | Your script's own values, free-form:" in text
    assert "| `name` | str | **required** |" in text
    assert "| `slurm.time` | str | `01:00:00` |" in text
    assert "| `env.vars` | mapping | {} |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    fields = sum(len(dataclasses.fields(c)) for c in (
        model.JobConfig, model.SlurmConfig, model.EnvConfig, model.ContainerConfig,
        model.DistConfig, model.TrainConfig, model.RequeueConfig))  # fmt: skip
    assert len(rows) == fields


def test_undocumented_keys_notices_a_missing_docstring() -> None:
    @dataclasses.dataclass(frozen=True)
    class Probe:
        documented: int = 1
        """Says something."""
        bare: int = 2

    assert field_docs(Probe) == {"documented": "Says something."}
