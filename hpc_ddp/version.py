"""The version of hpc-ddp, in a module of its own.

Kept apart from ``hpc_ddp/__init__.py`` so that anything (checkpoint metadata, rendered
scripts, packaging checks) can read it without importing the package's public namespace. It
must equal ``[project] version`` in ``pyproject.toml``; ``tests/test_layers.py`` checks that.
"""

from __future__ import annotations

__version__ = "0.1.0"
