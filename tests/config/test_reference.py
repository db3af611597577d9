"""The config reference: every key documented, and docs/config-reference.md current."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpc_ddp.config import model
from hpc_ddp.config import sweepfile as sweep_model
from hpc_ddp.config.reference import config_reference, field_docs, undocumented_keys
from hpc_ddp.config.schema import JOB_SCHEMA
from hpc_ddp.config.sweepfile import SWEEP_SCHEMA

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"
REGENERATE = ".venv/bin/python -m hpc_ddp.config.reference > docs/config-reference.md"


def test_every_key_has_an_attribute_docstring() -> None:
    assert undocumented_keys() == [], "add a docstring under each of these fields"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert DOCS.read_text(encoding="utf-8") == config_reference(), (
        f"docs/config-reference.md is out of date. Regenerate it with: {REGENERATE}"
    )


def test_the_reference_has_one_row_per_key_with_its_type_and_default() -> None:
    text = config_reference().split("## Sweep files")[0]
    assert "| `params` | mapping | {} | Your script's own values, free-form:" in text
    assert "| `name` | str | **required** |" in text
    assert "| `slurm.time` | str | `01:00:00` |" in text
    assert "| `env.vars` | mapping | {} |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    fields = sum(len(dataclasses.fields(c)) for c in (
        model.JobConfig, model.SlurmConfig, model.EnvConfig, model.ContainerConfig,
        model.DistConfig, model.TrainConfig, model.KeepBestConfig, model.RequeueConfig,
        model.FaultConfig))  # fmt: skip
    assert len(rows) == fields


def test_undocumented_keys_notices_a_missing_docstring() -> None:
    @dataclasses.dataclass(frozen=True)
    class Probe:
        documented: int = 1
        """Says something."""
        bare: int = 2

    assert field_docs(Probe) == {"documented": "Says something."}


def _sweep_rows() -> list[str]:
    _, _, sweep_part = config_reference().partition("\n## Sweep files\n")
    return [line for line in sweep_part.splitlines() if line.startswith("| `")]


def test_the_reference_has_a_sweep_files_section_with_every_sweep_key() -> None:
    rows = _sweep_rows()
    keys = [row.split("`")[1] for row in rows]
    assert keys == list(SWEEP_SCHEMA.key_kinds)  # every key, in file order, and nothing else
    assert "| `base` | str \\| mapping | **required** |" in rows[0]
    assert "| `sweep.list` | list of mapping or null | null |" in "\n".join(rows)
    assert "| `sweep.random.seed` | int | `0` | Seed of `random.Random`" in "\n".join(rows)
    assert "| `sweep.metric.mode` | min \\| max | `min` |" in "\n".join(rows)
    assert "| `sweep.max_parallel` | int or null | null |" in "\n".join(rows)


def test_sweep_keys_and_job_keys_are_separate_namespaces_in_the_reference() -> None:
    job_part = config_reference().partition("\n## Sweep files\n")[0]
    assert "| `sweep" not in job_part
    assert "| `base`" not in job_part
    assert not set(SWEEP_SCHEMA.key_kinds) & set(JOB_SCHEMA.key_kinds)


def test_undocumented_keys_covers_the_sweep_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # A sweep field without a docstring is reported under the sweep file's root.
    monkeypatch.setattr(
        "hpc_ddp.config.reference.field_docs", lambda cls: {} if cls is sweep_model.MetricSpec
        else field_docs(cls),
    )  # fmt: skip
    assert undocumented_keys() == ["SweepFile: sweep.metric.name", "SweepFile: sweep.metric.mode"]
