"""The one shape of hpc-ddp's machine-readable output: every verb's ``--json`` and the API's
``to_dict()`` (docs/json.md describes it for users).

Every ``--json`` prints one JSON object whose ``schema`` names what it is and its version,
``hpc-ddp.<verb>/<n>``: a script checks that before it reads anything else, and ``<n>`` goes up
only when a key changes meaning or goes away (new keys may appear in any version). Within it,
the same rules everywhere:

- keys are snake_case; ids are ``job_id``, directories ``run_dir`` / ``sweep_dir``;
- durations are numbers of seconds, named ``*_s`` (``elapsed_s``); times ISO 8601 text;
- what is not known or does not apply is ``null``, never ``"-"`` or ``""``;
- what is several is a list (``causes``), never one joined string.

The API returns the same objects (:meth:`hpc_ddp.api.status.RunStatus.to_dict`,
:meth:`hpc_ddp.api.sweep.Sweep.results`), so a script and the command line read one thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1
"""The version every ``schema`` below carries today."""
STATUS = f"hpc-ddp.status/{SCHEMA_VERSION}"
RESULTS = f"hpc-ddp.results/{SCHEMA_VERSION}"
SWEEP = f"hpc-ddp.sweep/{SCHEMA_VERSION}"
SUBMIT = f"hpc-ddp.submit/{SCHEMA_VERSION}"
CHECKPOINTS = f"hpc-ddp.checkpoints/{SCHEMA_VERSION}"
CANCEL = f"hpc-ddp.cancel/{SCHEMA_VERSION}"
DOCTOR = f"hpc-ddp.doctor/{SCHEMA_VERSION}"
DEV_CLUSTER = f"hpc-ddp.dev-cluster/{SCHEMA_VERSION}"


def document(schema: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One ``--json`` object: ``schema`` first, then ``body``'s keys."""
    return {"schema": schema, **body}
