"""The Charliecloud image's pure parts: what names a cached layer, which files it holds, and the
command line a task runs it with is hpc-ddp's own (``env.container.runtime: charliecloud``,
tests/backends/slurm/test_render.py). Building it for real:
tests/backends/slurm/test_container_charliecloud.py."""

from __future__ import annotations

import dataclasses

from hpc_ddp.devcluster.image import (
    ImageSpec,
    base_key,
    dependencies,
    deps_key,
    image_key,
    source_files,
    source_root,
)


def test_the_base_key_follows_every_input() -> None:
    spec = ImageSpec()
    assert base_key(spec) == base_key(ImageSpec())
    for change in (
        {"suite": "trixie"},
        {"local_requirements": ("torch==2.14.1",)},
        {"python_requirements": ("numpy",)},
        {"skip": ("torch",)},
        {"debian_packages": ("python3",)},
        {"mount_points": ("/work",)},
    ):
        assert base_key(dataclasses.replace(spec, **change)) != base_key(spec), change


def test_the_dependency_layer_takes_pyprojects_requirements_but_torch_and_torchvision() -> None:
    pyproject = """
[build-system]
requires = ["setuptools>=77"]
[project]
dependencies = [
    "torch>=2.3,<2.15",
    "TorchVision >=0.18",
    "submitit>=1.5,<2",
    "PyYAML>=6",
    "jinja2[i18n]>=3.1; python_version >= '3.10'",
]
[project.optional-dependencies]
dev = ["pytest"]
"""
    assert dependencies(pyproject, ("torch", "torchvision")) == (
        "submitit>=1.5,<2",
        "PyYAML>=6",
        "jinja2[i18n]>=3.1; python_version >= '3.10'",
        "setuptools>=77",
    )
    assert dependencies("[project]\nname = 'x'\n", ("torch",)) == ()
    # This checkout's own list: what the image installs from the registry.
    ours = dependencies((source_root() / "pyproject.toml").read_text(), ImageSpec().skip)
    assert not [r for r in ours if r.lower().startswith(("torch", "torchvision"))]
    assert any(r.startswith("pyyaml") for r in ours)
    assert deps_key("base-1", ours) != deps_key("base-1", (*ours, "extra"))
    assert deps_key("base-1", ours) != deps_key("base-2", ours)


def test_the_image_key_follows_the_base_and_every_source_byte_and_name() -> None:
    sources = {"pyproject.toml": b"[project]\n", "hpc_ddp/a.py": b"x = 1\n"}
    key = image_key("base1", sources)
    assert key == image_key("base1", dict(reversed(sources.items())))  # order does not matter
    assert image_key("base2", sources) != key
    assert image_key("base1", {**sources, "hpc_ddp/a.py": b"x = 2\n"}) != key
    assert image_key("base1", {"pyproject.toml": b"[project]\n", "hpc_ddp/b.py": b"x = 1\n"}) != key
    # A byte moved between two files is a different tree.
    assert image_key("b", {"a": b"xy", "b": b""}) != image_key("b", {"a": b"x", "b": b"y"})


def test_the_sources_are_the_distribution_without_caches() -> None:
    files = [str(p) for p in source_files(source_root())]
    assert "pyproject.toml" in files
    assert "README.md" in files  # pyproject's readme: the build needs it
    assert "hpc_ddp/__init__.py" in files
    assert "hpc_ddp/devcluster/image.py" in files
    assert "slurm_templates/default.sbatch.j2" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in files if f.startswith(("tests/", "benchmarks/", ".venv/"))]
    assert files == sorted(files)
