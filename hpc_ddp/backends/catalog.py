"""The backends' catalog: one row per backend, its name, the login command that ``auto`` looks
for, and where its two faces live. Pure.

Everything that names a backend asks here, so a backend is named once: what a run's manifest may
record (:mod:`hpc_ddp.rundir.manifest`), ``--backend``'s choices, ``auto``
(:func:`auto_backend`), whether a task's place came from a scheduler's own launcher, and the two
registries that make a backend's faces (:mod:`hpc_ddp.backends.registry`, the login face by name;
:mod:`hpc_ddp.backends.node_registry`, the node face by the environment). A row names each face by
its module's dotted path, as a package's entry points do: this table imports no backend, so it
sits below every layer that reads it, and each registry imports a face only when it is picked
(``tests/test_layers.py`` checks that each face sits at or below its registry's layer).

A new backend adds its package under ``hpc_ddp/backends/`` and one row to :data:`CATALOG`.
"""

from __future__ import annotations

from collections.abc import Callable

BackendName = str
"""A backend's name as its row gives it (``slurm``, ``local``); a run's manifest records it."""


class Row:
    """One backend. A plain class, not a dataclass: every command reads the table, and a
    dataclass costs a dry run ~0.3 ms to define."""

    __slots__ = ("login_face", "name", "node_face", "submit_command")

    def __init__(
        self, name: BackendName, *, submit_command: str | None, login_face: str, node_face: str
    ) -> None:
        self.name = name
        self.submit_command = submit_command
        """The login command whose presence on PATH makes ``auto`` pick this backend (``sbatch``);
        None: this machine, no scheduler, what ``auto`` picks when no command is found."""
        self.login_face = login_face
        """The module that makes its login faces (``backend``, ``sweeps``, ``postmortem``, and
        ``held`` and ``kill_wait_s`` for jobs this process holds):
        :class:`hpc_ddp.backends.registry.LoginFace`."""
        self.node_face = node_face
        """The module of its node face (``owns_env``, ``allocation_of``,
        ``supervise_launcher``): :class:`hpc_ddp.backends.allocation.NodeFace`."""

    def __repr__(self) -> str:
        return f"Row({self.name!r}, submit_command={self.submit_command!r})"


CATALOG: tuple[Row, ...] = (
    Row(
        "slurm",
        submit_command="sbatch",
        login_face="hpc_ddp.backends.slurm.login_face",
        node_face="hpc_ddp.backends.slurm.allocation",
    ),
    Row(
        "local",
        submit_command=None,
        login_face="hpc_ddp.backends.local.login_face",
        node_face="hpc_ddp.backends.local.allocation",
    ),
)
"""Every backend. The order is the node side's and ``auto``'s: the first whose variables an
environment carries, or whose command is on PATH, is picked; the row without a command (this
machine) comes last and takes what no other does."""


def backend_names() -> tuple[BackendName, ...]:
    """Every backend's name, in the catalog's order."""
    return tuple(row.name for row in CATALOG)


def is_backend(name: object) -> bool:
    """Whether ``name`` names a backend of the catalog."""
    return any(row.name == name for row in CATALOG)


def row_of(name: BackendName) -> Row:
    """The row of the backend ``name``; a :class:`KeyError` naming the backends there are."""
    for row in CATALOG:
        if row.name == name:
            return row
    raise KeyError(unknown_backend(name))


def unknown_backend(name: object, *, auto: bool = False) -> str:
    """The words for a backend name the catalog lacks (``auto``: offered as a choice too)."""
    names = ", ".join((*(("auto",) if auto else ()), *backend_names()))
    return f"backend {name!r:.80} is not one of {names}"


def auto_backend(on_path: Callable[[str], str | None]) -> BackendName:
    """What ``auto`` means on this machine: the first backend whose login command ``on_path``
    finds (``shutil.which``), else the one without a scheduler."""
    for row in CATALOG:
        if row.submit_command is not None and on_path(row.submit_command):
            return row.name
    return next(row.name for row in CATALOG if row.submit_command is None)


def is_scheduler(name: object) -> bool:
    """Whether ``name`` is a backend with a scheduler (not this machine's processes): a task it
    placed got its rank from the scheduler's own launcher (``srun``)."""
    return any(row.name == name and row.submit_command is not None for row in CATALOG)
