"""The package's layers, declared once here, and the rules that keep them honest.

:data:`LAYERS` lists hpc-ddp's packages and top-level modules from the bottom up, each with the
modules in it that are *pure*. The README's architecture section describes the same order.

* **Direction.** A module imports only modules of its own layer or of a layer below it: never
  an arrow up (checked from every module's source, function-level imports included).
* **Purity.** A pure module never runs a command, never reads the environment, never writes a
  file and never imports torch; it imports only other pure modules. It takes what it needs as
  arguments (config parsing reads the file it is given), so it is testable and cheap on a login
  node. Checked two ways: the source of each pure module (``subprocess``, ``os.environ`` and
  friends however ``os`` is imported, and every call that writes, renames or removes a file), and
  what importing it loads (only pure modules of hpc_ddp, and neither torch nor ``subprocess``).
* ``config/preflight`` (with ``loginnode``, ``programs`` and ``images``) inspects the login
  node (PATH, files, the environment) but still runs nothing and imports no torch.
* ``import hpc_ddp`` exposes the exception tree and ``JobConfig`` without importing torch.
* The package's version agrees with ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import hpc_ddp
from hpc_ddp import errors
from hpc_ddp.version import __version__

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hpc_ddp"


@dataclass(frozen=True)
class Layer:
    """One layer: its packages and top-level modules, and which of their modules are pure."""

    units: tuple[str, ...]
    pure: tuple[str, ...] = ()
    """Pure modules, by name relative to ``hpc_ddp`` (``config.model``); ``config.*``: every
    module of the package ``config`` but those listed in :attr:`impure`."""
    impure: tuple[str, ...] = ()


LAYERS: tuple[Layer, ...] = (
    Layer(
        ("errors", "version", "exitcodes", "collector", "output", "frozen", "history"),
        pure=("errors", "version", "exitcodes", "output", "frozen", "history"),
    ),
    Layer(
        ("durable", "rundir.layout", "backends.catalog"),
        pure=("rundir.layout", "backends.catalog"),
    ),
    Layer(("lemons",), pure=("lemons", "lemons.record")),
    Layer(("config",), pure=("config.*",), impure=("preflight", "loginnode", "programs", "images")),
    Layer(
        ("rundir",),
        pure=(
            "rundir.attempt",
            "rundir.endcause",
            "rundir.ledger",
            "rundir.ledger_events",
            "rundir.live_progress",
        ),
    ),
    Layer(("doctor.judgement",), pure=("doctor.judgement",)),
    Layer(("devcluster",), pure=("devcluster.conf",)),
    Layer(
        ("backends", "backends.base", "backends.slurm", "backends.local"),
        pure=(
            "backends.base",
            "backends.allocation",
            "backends.ports",
            "backends.jobs",
            "backends.nodelist",
            "backends.slurm.render",
            "backends.slurm.default_script",
            "backends.slurm.nodelist",
            "backends.slurm.jobstate",
        ),
    ),
    Layer(("runtime",), pure=("runtime.distenv", "runtime.progress", "runtime.handoff")),
    Layer(("checkpoint",), pure=("checkpoint.interval",)),
    Layer(("fault",), pure=("fault.blame", "fault.plan", "fault.requeue", "fault.interruptions")),
    Layer(("sessions",)),
    Layer(("train",)),
    Layer(("doctor",)),
    Layer(("job",), pure=("job.torchrun",)),
    Layer(
        (
            "backends.local.backend",
            "backends.local.controller",
            "backends.local.stop",
            "backends.local.outcome",
            "backends.slurm.backend",
            "backends.slurm.cancel",
        )
    ),
    Layer(("state",), pure=("state.verdict", "state.task", "state.resumable", "state.goodput")),
    Layer(("submission",)),
    Layer(("sweep",), pure=("sweep.spec",)),
    Layer(("backends.slurm.sweeps", "backends.local.sweeps", "backends.local.sweep_controller")),
    Layer(("backends.registry", "backends.slurm.login_face", "backends.local.login_face")),
    Layer(("api",)),
    Layer(("cli",)),
    Layer(("__init__", "__main__")),
)
"""hpc-ddp from the bottom up: the shared ground (errors, the run directory, config, the
backends' common parts), the node side (the rank's runtime, checkpoints, the fault model, the
trainer, the task), then the login side that submits runs and reads them back, the Python API
over it, and the CLI over that. A module belongs to the layer of the longest unit that names
it (``backends.local.backend`` is not ``backends.local``)."""

NODE: tuple[str, ...] = (
    "runtime",
    "checkpoint",
    "fault",
    "sessions",
    "doctor.exam",
    "train",
    "job",
    "backends.local.launcher",
    "cli.cmd_run",
    "cli.cmd_supervise",
)
"""What runs on the nodes (the tasks, their ranks, the supervisor), and the CLI's node verbs."""
LOGIN: tuple[str, ...] = (
    "backends.local.backend",
    "backends.local.controller",
    "backends.local.stop",
    "backends.local.outcome",
    "backends.slurm.backend",
    "backends.slurm.cancel",
    "backends.slurm.sweeps",
    "backends.local.sweeps",
    "backends.local.sweep_controller",
    "backends.slurm.login_face",
    "backends.local.login_face",
    "backends.registry",
    "state",
    "submission",
    "sweep",
    "api",
    "cli",
)
"""What runs on the login node. It shares only the run directory, config and the backends'
common parts with the node side: it never imports the node side (:data:`CROSSINGS` aside)."""
CROSSINGS: dict[tuple[str, str], str] = {
    ("backends.local.controller", "job.local_task"): (
        "submitit pickles the local tasks' entry points by name and runs them in the tasks"
    ),
    ("cli.cmd_checkpoints", "checkpoint.format"): (
        "`hpc-ddp checkpoints` reads the files with torch on purpose, after its argument checks"
    ),
    ("cli.cmd_checkpoints", "checkpoint.sharded"): (
        "`hpc-ddp checkpoints` lists an FSDP run's shard sets the same way, with torch"
    ),
}
"""The login->node imports allowed, each inside a function and each with its reason."""

PREFLIGHT = (
    "hpc_ddp.config.preflight",
    "hpc_ddp.config.loginnode",
    "hpc_ddp.config.programs",
    "hpc_ddp.config.images",
)
"""The submit-time checks: they look at this machine (PATH, files, the environment)."""
HEAVY = ("torch", "subprocess")


def _all_modules() -> list[str]:
    """Every module of the package, dotted (``hpc_ddp.config.model``, ``hpc_ddp``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _all_modules()


def _unit_of(module: str, units: dict[str, int]) -> str | None:
    rest = module.removeprefix("hpc_ddp").removeprefix(".") or "__init__"
    found = [u for u in units if rest == u or rest.startswith(u + ".")]
    return max(found, key=len) if found else None


_UNITS = {unit: index for index, layer in enumerate(LAYERS) for unit in layer.units}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer that holds ``module``."""
    unit = _unit_of(module, _UNITS)
    if unit is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return _UNITS[unit]


_SIDES = {**dict.fromkeys(LOGIN, "login"), **dict.fromkeys(NODE, "node")}


def side_of(module: str) -> str:
    """``login``, ``node`` or ``shared``: the longest unit of :data:`NODE` or :data:`LOGIN`
    that names ``module`` decides."""
    unit = _unit_of(module, dict.fromkeys(_SIDES, 0))
    return "shared" if unit is None else _SIDES[unit]


def _is_pure(module: str) -> bool:
    rest = module.removeprefix("hpc_ddp.")
    layer = LAYERS[layer_of(module)]
    package, _, name = rest.partition(".")
    for entry in layer.pure:
        if entry == rest:
            return True
        if entry == f"{package}.*" and name and name not in layer.impure:
            return True
    return False


PURE_MODULES = sorted(m for m in MODULES if m != "hpc_ddp" and _is_pure(m))


def test_every_module_is_in_a_layer_and_every_declared_name_exists() -> None:
    for module in MODULES:
        layer_of(module)
    for layer in LAYERS:
        for entry in layer.pure:
            name = entry.removesuffix(".*")
            assert any(m == f"hpc_ddp.{name}" for m in MODULES), f"no module {name}"
        for name in layer.impure:
            assert any(m.endswith(f".{name}") for m in MODULES), f"no module {name}"
    assert "hpc_ddp.config.model" in PURE_MODULES
    assert "hpc_ddp.config.preflight" not in PURE_MODULES


def _imports(module: str) -> list[tuple[str, int]]:
    """``(imported hpc_ddp module, line)`` for every import in ``module``'s source."""
    tree = _source(module)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("hpc_ddp")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("hpc_ddp"):
                continue
            for alias in node.names:  # `from hpc_ddp.submission import wait` imports a module
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in MODULES else node.module, node.lineno))
    return out


def upward_imports(module: str) -> list[str]:
    """Every import in ``module`` that points to a higher layer."""
    mine = layer_of(module)
    return [
        f"{module}:{line} imports {target} (layer {layer_of(target)} > {mine})"
        for target, line in _imports(module)
        if target in MODULES and layer_of(target) > mine
    ]


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_only_down_the_layers(module: str) -> None:
    assert upward_imports(module) == []


def test_the_direction_check_sees_an_arrow_up() -> None:
    # The runtime may not call back into the CLI, not even from inside a function.
    assert layer_of("hpc_ddp.sessions.session") < layer_of("hpc_ddp.cli.main")
    assert layer_of("hpc_ddp.cli.main") == len(LAYERS) - 2
    assert _imports("hpc_ddp.cli.cmd_run")  # it imports the job's entry, below it


def login_to_node_imports(module: str) -> list[str]:
    """Every import in a login-side ``module`` of a node-side module, function-level ones
    included, but the declared :data:`CROSSINGS`."""
    if side_of(module) != "login":
        return []
    short = module.removeprefix("hpc_ddp.")
    return [
        f"{module}:{line} imports {target} (node side)"
        for target, line in _imports(module)
        if target in MODULES
        and side_of(target) == "node"
        and (short, target.removeprefix("hpc_ddp.")) not in CROSSINGS
    ]


@pytest.mark.parametrize("module", MODULES)
def test_the_login_side_never_imports_the_node_side(module: str) -> None:
    assert login_to_node_imports(module) == []


def test_the_sides_are_what_the_layers_say() -> None:
    assert side_of("hpc_ddp.backends.local.backend") == "login"
    assert side_of("hpc_ddp.backends.local.launcher") == "node"
    assert side_of("hpc_ddp.backends.local.process") == "shared"
    assert side_of("hpc_ddp.backends.base") == "shared"  # both faces' types
    assert side_of("hpc_ddp.backends.slurm.backend") == "login"
    assert side_of("hpc_ddp.cli.cmd_run") == "node"
    assert side_of("hpc_ddp.cli.cmd_status") == "login"
    assert side_of("hpc_ddp.rundir.ledger") == "shared"
    assert side_of("hpc_ddp.doctor.exam") == "node"
    assert side_of("hpc_ddp.doctor.judgement") == "shared"
    # Every declared crossing is still one: a stale entry would hide the next real one.
    for source, target in CROSSINGS:
        imported = [t for t, _ in _imports(f"hpc_ddp.{source}")]
        assert f"hpc_ddp.{target}" in imported, (source, target)
        assert side_of(f"hpc_ddp.{source}") == "login"
        assert side_of(f"hpc_ddp.{target}") == "node"
    # The node side sits below the login side, so no arrow may point up from it either.
    node_top = max(layer_of(m) for m in MODULES if side_of(m) == "node" and ".cli." not in m)
    login_bottom = min(layer_of(m) for m in MODULES if side_of(m) == "login")
    assert node_top < login_bottom


BACKEND_PACKAGES = tuple(
    sorted(p.parent.name for p in (PACKAGE / "backends").glob("*/__init__.py"))
)
"""Each backend's own package under ``hpc_ddp/backends/`` (``local``, ``slurm``)."""
BACKEND_PICKERS: dict[str, str] = {
    "hpc_ddp.backends.registry": "the login side's registry: each backend's login face and its "
    "sweep runner, made by name (and the type of the API's deprecated slurm=)",
    "hpc_ddp.backends.node_registry": "the node side's: each backend's node face (allocation, "
    "launcher), picked by the environment; the node side may not import the login side's; "
    "and the local backend's own tasks' launcher",
}
"""The modules outside a backend's package that import it, one per side, each with its reason.
Both reach each backend's faces through the module its catalog row names
(:data:`hpc_ddp.backends.catalog.CATALOG`), which no import statement shows: see
:func:`test_each_catalog_row_names_faces_its_registry_may_import`."""
SEAM_PENDING: dict[str, str] = {}
"""Modules outside a backend's package still reaching it directly, each with its reason (none:
the local tasks reach theirs through the node registry too)."""


def backend_reaches(module: str) -> list[str]:
    """Every import in ``module`` of a backend's own package (``hpc_ddp.backends.<name>``),
    function-level ones included, unless ``module`` is in that package or is the registry."""
    if module in BACKEND_PICKERS:
        return []
    own = [f"hpc_ddp.backends.{name}" for name in BACKEND_PACKAGES]
    home = next((p for p in own if module == p or module.startswith(p + ".")), None)
    return [
        f"{module}:{line} imports {target} (only the registries may)"
        for target, line in _imports(module)
        for package in own
        if package != home and (target == package or target.startswith(package + "."))
    ]


@pytest.mark.parametrize("module", MODULES)
def test_only_the_registry_imports_a_backends_own_package(module: str) -> None:
    """Code that works with any backend reaches one through :mod:`hpc_ddp.backends.registry`
    and the shared types (:mod:`hpc_ddp.backends.base`, ``jobs``, ``arrays``): a PBS backend
    then adds a package and a registry line, and changes nothing else."""
    if module in SEAM_PENDING:
        return
    assert backend_reaches(module) == []


def test_the_backend_check_sees_a_reach_and_every_pending_entry_is_one() -> None:
    assert backend_reaches("hpc_ddp.backends.slurm.backend") == []  # its own package
    assert all(backend_reaches(picker) == [] for picker in BACKEND_PICKERS)
    assert side_of("hpc_ddp.backends.node_registry") != "login"  # the node side may import it
    assert backend_reaches("hpc_ddp.backends.base") == []
    assert {"local", "slurm"} <= set(BACKEND_PACKAGES)
    # A stale entry would hide the next real reach: each one still reaches a backend.
    for module in (*BACKEND_PICKERS, *SEAM_PENDING):
        if module in BACKEND_PICKERS:
            own = tuple(f"hpc_ddp.backends.{name}." for name in BACKEND_PACKAGES)
            assert any(target.startswith(own) for target, _ in _imports(module)), module
            continue
        assert backend_reaches(module), f"{module} no longer reaches a backend: drop its entry"


def test_each_catalog_row_names_faces_its_registry_may_import() -> None:
    """A row names its faces by dotted path, imported by name (as entry points are): each
    must be a module of the backend's own package, at or below the layer of the registry that
    imports it, and a node face on no login side."""
    from hpc_ddp.backends.catalog import CATALOG

    assert [row.name for row in CATALOG][-1:] == ["local"]  # this machine takes what is left
    for row in CATALOG:
        for face, picker in (
            (row.login_face, "hpc_ddp.backends.registry"),
            (row.node_face, "hpc_ddp.backends.node_registry"),
        ):
            assert face in MODULES, (row.name, face)
            assert face.startswith(f"hpc_ddp.backends.{row.name}."), (row.name, face)
            assert layer_of(face) <= layer_of(picker), (face, picker)
            importlib.import_module(face)
        assert side_of(row.node_face) != "login", row.node_face
    assert layer_of("hpc_ddp.backends.slurm.login_face") > layer_of(
        "hpc_ddp.backends.node_registry"
    )  # the check can fail: a login face named as a node face would be refused


CLI_OWN_WAY: dict[str, str] = {
    "cli.cmd_run": "a node verb: the task on each node",
    "cli.cmd_supervise": "a node verb: the supervisor in the allocation",
    "cli.cmd_devcluster": "the dev cluster is a tool of its own, not a login-side verb",
    "cli.cmd_checkpoints": "reads checkpoint files with torch on purpose (see CROSSINGS)",
}
"""The CLI modules that may reach below :mod:`hpc_ddp.api`, each with its reason."""
CLI_BASE = ("hpc_ddp.api", "hpc_ddp.cli", "hpc_ddp.errors", "hpc_ddp.output",
            "hpc_ddp.version", "hpc_ddp.collector", "hpc_ddp.exitcodes")  # fmt: skip
"""What every other CLI module imports from hpc-ddp: the API, the CLI itself, and the ground."""
CLI_DATA: dict[tuple[str, str], tuple[str, str]] = {
    ("*", "hpc_ddp.rundir.layout.RUNS_DIR_ENV"): ("data", "the variable's name, in --help"),
    ("cli.options", "hpc_ddp.backends.catalog.backend_names"): (
        "data",
        "the backends' names, --backend's choices, read from the catalog (not a second list)",
    ),
    ("cli.main", "hpc_ddp.backends.registry.Registry"): (
        "injection point",
        "main(argv, backends=) takes the registry tests pass; it makes the real one",
    ),
}
"""Names a CLI module may import from below the API: plain data (a constant), or the
injection point of the backends."""


def _imported_names(tree: ast.Module) -> list[tuple[str, int]]:
    """``(hpc_ddp.x.y.Name, line)`` for each name ``from hpc_ddp.x.y import Name`` binds, and
    ``(hpc_ddp.x.y, line)`` for each ``import hpc_ddp.x.y``; function-level and
    ``TYPE_CHECKING`` imports included."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("hpc_ddp")]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and (node.module == "hpc_ddp" or node.module.startswith("hpc_ddp."))
        ):
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return sorted(out, key=lambda found: found[1])


def cli_reaches_below_the_api(module: str, tree: ast.Module | None = None) -> list[str]:
    """Every import of a CLI ``module`` (but :data:`CLI_OWN_WAY`'s) of something other than
    :data:`CLI_BASE` and the declared :data:`CLI_DATA`; ``tree``: its source (default: read)."""
    short = module.removeprefix("hpc_ddp.")
    if not short.startswith("cli.") or short in CLI_OWN_WAY:
        return []
    return [
        f"{module}:{line} imports {name}"
        for name, line in _imported_names(tree or _source(module))
        if not any(name == base or name.startswith(base + ".") for base in CLI_BASE)
        and (short, name) not in CLI_DATA
        and ("*", name) not in CLI_DATA
    ]


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("hpc_ddp.cli.")])
def test_a_cli_handler_reaches_only_the_api(module: str) -> None:
    """A verb parses its arguments, calls :mod:`hpc_ddp.api` and prints what it returns:
    what it does lives in the API, once, for the CLI and for Python alike."""
    assert cli_reaches_below_the_api(module) == []


def test_the_cli_check_sees_a_handler_that_reaches_past_the_api() -> None:
    tree = ast.parse(
        "from hpc_ddp.api.status import collect_status\n"
        "from hpc_ddp.rundir.layout import RUNS_DIR_ENV, RunPaths\n"
        "def run():\n    from hpc_ddp.submission.submit import runs_dir_from\n"
        "if TYPE_CHECKING:\n    from hpc_ddp.backends.slurm.client import SlurmClient\n"
        "import hpc_ddp.state.report\n"
    )
    assert cli_reaches_below_the_api("hpc_ddp.cli.cmd_status", tree) == [
        "hpc_ddp.cli.cmd_status:2 imports hpc_ddp.rundir.layout.RunPaths",
        "hpc_ddp.cli.cmd_status:4 imports hpc_ddp.submission.submit.runs_dir_from",
        "hpc_ddp.cli.cmd_status:6 imports hpc_ddp.backends.slurm.client.SlurmClient",
        "hpc_ddp.cli.cmd_status:7 imports hpc_ddp.state.report",
    ]
    assert cli_reaches_below_the_api("hpc_ddp.cli.cmd_supervise", tree) == []  # a node verb
    # Every declared name is still imported where it is allowed: a stale entry hides nothing.
    for source, name in CLI_DATA:
        where = [m for m in MODULES if m.startswith("hpc_ddp.cli.")] if source == "*" else []
        where = where or [f"hpc_ddp.{source}"]
        assert any(name in dict(_imported_names(_source(m))) for m in where), (source, name)
    for module in CLI_OWN_WAY:
        assert f"hpc_ddp.{module}" in MODULES, module


def test_importing_the_login_side_loads_nothing_of_the_node_side() -> None:
    """What the import statements say, checked by what importing every login module loads."""
    login = [m for m in MODULES if side_of(m) == "login"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {login!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hpc_ddp'))))"
    )
    loaded = json.loads(_run(code))
    assert [m for m in loaded if side_of(m) == "node"] == []
    assert "hpc_ddp.state.report" in loaded
    assert "hpc_ddp.rundir.ledger" in loaded


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _loaded_by(module: str) -> dict[str, list[str]]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps({{'heavy': [m for m in {list(HEAVY)!r} if m in sys.modules], "
        "'ours': sorted(m for m in sys.modules if m.startswith('hpc_ddp'))}))"
    )
    return json.loads(_run(code))  # type: ignore[no-any-return]


PACKAGES = {
    "hpc_ddp",
    *(
        "hpc_ddp." + ".".join(p.parent.relative_to(PACKAGE).parts)
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    ),
}


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_only_pure_modules(module: str) -> None:
    loaded = _loaded_by(module)
    assert loaded["heavy"] == [], f"{module} pulls in {loaded['heavy']}"
    impure = sorted(set(loaded["ours"]) - set(PURE_MODULES) - PACKAGES)
    assert impure == [], f"{module} pulls in modules that do I/O: {impure}"


@pytest.mark.parametrize("module", PREFLIGHT)
def test_preflight_runs_nothing_and_imports_no_torch(module: str) -> None:
    assert _loaded_by(module)["heavy"] == []
    assert [
        v for v in _violations(_source(module)) if "environ" not in v and "writes" not in v
    ] == []


def _source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)


def _os_names(tree: ast.Module) -> set[str]:
    """The names ``os`` is bound to in a module (``import os``, ``import os as _os``)."""
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "os"
    }


_ENV = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
_WRITES = frozenset(
    {
        "write_text", "write_bytes", "mkdir", "makedirs", "touch", "unlink", "remove", "rmdir",
        "rmtree", "rename", "replace", "symlink_to", "hardlink_to", "chmod", "truncate",
        "write_atomic", "write_text_atomic", "write_bytes_atomic", "create_atomic",
        "append_line", "dump",
    }
)  # fmt: skip
"""Calls that write, rename or remove files (``dump``: ``json.dump``/``yaml.dump`` to a file)."""
_WRITE_MODES = frozenset("wax+")


def _writes(node: ast.Call) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    target = func.value if isinstance(func, ast.Attribute) else None
    if name == "replace" and not (isinstance(target, ast.Name) and target.id == "os"):
        return None  # str.replace, dataclasses.replace: not a file
    to_stream = len(node.args) > 1 or any(k.arg in ("stream", "fp") for k in node.keywords)
    if name == "dump" and not to_stream:
        return None  # yaml.dump(data, Dumper=...): a string, not a file
    if name in _WRITES:
        return f"writes: {name}() (line {node.lineno})"
    if name == "open":
        mode = node.args[1] if len(node.args) > 1 else None
        mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
        if isinstance(mode, ast.Constant) and set(str(mode.value)) & _WRITE_MODES:
            return f"writes: open(..., {mode.value!r}) (line {node.lineno})"
    return None


def _violations(tree: ast.Module) -> list[str]:
    found = []
    os_names = _os_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.split(".")[0] == "subprocess"
            ]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "subprocess":
                found.append("from subprocess import ...")
            if node.module == "os" and any(a.name in _ENV for a in node.names):
                found.append("from os import environ/getenv")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in _ENV
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            found.append(f"os.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.Call) and (write := _writes(node)) is not None:
            found.append(write)
    return found


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_runs_no_command_reads_no_environment_and_writes_no_file(
    module: str,
) -> None:
    assert _violations(_source(module)) == []


def test_the_static_check_catches_what_it_looks_for() -> None:
    tree = ast.parse(
        "import os, subprocess\nimport os as _os\nfrom os import environ\n"
        "from subprocess import run\nx = os.environ['A']\ny = _os.getenv('B')\n"
        "p.write_text('x')\nopen(p, 'w')\nopen(p, mode='ab')\nos.replace(a, b)\n"
        "open(p)\nopen(p, 'rb')\n'a'.replace('a', 'b')\n"
    )
    assert len(_violations(tree)) == 9


def test_import_hpc_ddp_gives_errors_and_job_config_without_torch() -> None:
    code = (
        "import json, sys, hpc_ddp\n"
        "assert issubclass(hpc_ddp.RunDirError, hpc_ddp.HpcDdpError)\n"
        "assert hpc_ddp.JobConfig.__module__ == 'hpc_ddp.config.model'\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    assert json.loads(_run(code)) == []


def test_importing_the_errors_is_cheap() -> None:
    code = (
        "import sys; import hpc_ddp.errors; "
        "print(sorted(m for m in sys.modules if m.startswith('hpc_ddp')))"
    )
    assert _run(code).strip() == str(["hpc_ddp", "hpc_ddp.errors", "hpc_ddp.version"])


def test_the_whole_exception_tree_is_public_once() -> None:
    tree = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, errors.HpcDdpError)
        and not name.startswith("_")
    }
    assert "HpcDdpError" in tree
    for name in tree:
        assert getattr(hpc_ddp, name) is getattr(errors, name)
    assert tree <= set(hpc_ddp.__all__)
    assert "JobConfig" in hpc_ddp.__all__
    assert len(hpc_ddp.__all__) == len(set(hpc_ddp.__all__))
    for name in hpc_ddp.__all__:
        assert name in dir(hpc_ddp)


def test_job_config_is_the_config_model_one() -> None:
    from hpc_ddp.config.model import JobConfig

    assert hpc_ddp.JobConfig is JobConfig


def test_every_public_name_comes_from_the_module_that_defines_it() -> None:
    """``hpc_ddp.unwrap`` was looked up in the session module, which had stopped importing it
    (an AttributeError): each lazy name is found in its one home, never through a re-export."""
    code = (
        "import json, hpc_ddp\n"
        "names = {n: getattr(hpc_ddp, n) for n in hpc_ddp.__all__}\n"
        "print(json.dumps({n: [hpc_ddp._LAZY.get(n), getattr(v, '__module__', None)]\n"
        "                  for n, v in names.items() if callable(v)}))"
    )
    homes = json.loads(_run(code))
    assert homes["unwrap"] == ["hpc_ddp.runtime.procgroup", "hpc_ddp.runtime.procgroup"]
    for name, (declared, defined) in homes.items():
        assert declared in (None, defined), name


def test_the_version_agrees_with_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert hpc_ddp.__version__ == __version__ == project["version"]


def test_every_package_ships_in_the_wheel() -> None:
    """A package missing from ``[tool.setuptools] packages`` works in a checkout and is absent
    from every installed hpc-ddp."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    assert {p for p in PACKAGES if (ROOT / p.replace(".", "/") / "__init__.py").is_file()} <= listed


def test_no_package_shadows_a_public_name() -> None:
    """``hpc_ddp.submit`` is the API's function: a subpackage of that name would replace it
    with a module as soon as anything imported the subpackage."""
    top = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    top |= {p.stem for p in PACKAGE.glob("*.py")}
    assert top & set(hpc_ddp.__all__) == set()


def _package(module: str) -> str:
    """The top package (or top-level module) of ``hpc_ddp`` that holds ``module``."""
    return module.removeprefix("hpc_ddp").removeprefix(".").split(".")[0] or "__init__"


MUTUAL_PACKAGES: dict[tuple[str, str], str] = {
    ("backends", other): (
        "backends/ holds the shared types every layer speaks (base, jobs, arrays, allocation) at "
        f"the bottom and each backend's faces above {other}/, which they drive"
    )
    for other in ("job", "state", "submission", "sweep")
} | {
    ("backends", "rundir"): (
        "a manifest's backend is checked against the catalog (backends/catalog: names and dotted "
        "paths, importing nothing, in the ground layer below rundir/), as backends/ reads run "
        "directories above it"
    )
}
"""Pairs of packages that import each other, each with its reason; any other pair fails."""


def mutual_packages() -> set[tuple[str, str]]:
    """Every pair of packages of which each imports the other, function-level imports counted."""
    arrows = {
        (_package(module), _package(target))
        for module in MODULES
        for target, _ in _imports(module)
        if target in MODULES and _package(module) != _package(target)
    }
    return {tuple(sorted(pair)) for pair in arrows if pair[::-1] in arrows}  # type: ignore[misc]


def test_no_two_packages_import_each_other_but_those_declared() -> None:
    """A package is one layer, or declares why it is not: a pair that imports both ways is a
    cycle at the package level (two packages that cannot be read, tested or moved apart)."""
    found = mutual_packages()
    assert found - set(MUTUAL_PACKAGES) == set()
    assert set(MUTUAL_PACKAGES) - found == set(), "a declared pair no longer is one: drop it"
    assert ("config", "rundir") not in found  # SITE_ENV is config's: config needs no rundir
