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
CHECKPOINTS_EXPORT = f"hpc-ddp.checkpoints-export/{SCHEMA_VERSION}"
CANCEL = f"hpc-ddp.cancel/{SCHEMA_VERSION}"
DOCTOR = f"hpc-ddp.doctor/{SCHEMA_VERSION}"
DEV_CLUSTER = f"hpc-ddp.dev-cluster/{SCHEMA_VERSION}"
NODES = f"hpc-ddp.nodes/{SCHEMA_VERSION}"
ERROR = f"hpc-ddp.error/{SCHEMA_VERSION}"
"""What any verb's ``--json`` prints instead when it fails with an error of hpc-ddp's
(:func:`error_document`)."""

_HINT = "HINT:"


def document(schema: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One ``--json`` object: ``schema`` first, then ``body``'s keys."""
    return {"schema": schema, **body}


def error_document(verb: str, message: str, exit_code: int) -> dict[str, Any]:
    """The ``--json`` object of a verb that failed: ``verb``, ``error`` (the message up to its
    HINT), ``hint`` (what follows ``HINT:``; null when it gives none) and ``exit_code``."""
    head, found, hint = message.partition(_HINT)
    if not found:
        return document(ERROR, {"verb": verb, "error": message.strip(), "hint": None,
                                "exit_code": exit_code})  # fmt: skip
    return document(
        ERROR,
        {
            "verb": verb,
            "error": head.rstrip(" (;"),
            "hint": hint.strip(),
            "exit_code": exit_code,
        },
    )
