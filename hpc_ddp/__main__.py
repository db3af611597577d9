"""``python -m hpc_ddp`` is the ``hpc-ddp`` command."""

from __future__ import annotations

from hpc_ddp.cli.main import entrypoint

entrypoint()
