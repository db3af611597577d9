"""The sbatch script: a job config and a run directory in, the script's text out.

Pure: :func:`render_sbatch` returns text and writes nothing; :func:`load_template` is the only
function here that reads a file. The default template is written by
:mod:`hpc_ddp.backends.slurm.default_script` (no Jinja2 on a default submit); a user's own
``slurm.template`` is rendered by Jinja2. The script runs ``srun ... <python> -m hpc_ddp run
RUN_DIR`` on every task; the runtime reads ``RUN_DIR/config.yaml`` from there.

Two parsers read the script, and each value is made safe for the one that reads it:

- ``#SBATCH`` lines are comments to bash but sbatch splits them itself: on whitespace, with
  ``"``/``'`` quoting, ``\\`` escapes and ``#`` starting a comment. Values with anything outside a
  plain set of characters are wrapped in double quotes; values with ``"`` or ``\\`` are refused.
- Every value in a shell line goes through :func:`shlex.quote` (the template's ``q`` filter).
  ``env.setup`` lines are the one exception: shell written by the user, rendered verbatim.

A line break or NUL in any rendered value would end a comment or a quoted word and let the rest
run as shell, so every such value is refused (the config loader refuses them too).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hpc_ddp.backends.slurm.default_script import render_default_script
from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.config.units import format_slurm_time
from hpc_ddp.errors import RenderError
from hpc_ddp.frozen import dataclass

DEFAULT_TEMPLATE = "default.sbatch.j2"

Flag = tuple[str, str | None]

_LINE_BREAKS = ("\n", "\r", "\0")
_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")
_FLAG_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIGNAL = re.compile(r"(?:SIG)?[A-Z0-9]+")

# Flags hpc-ddp writes itself, and where to set them instead of slurm.extra.
_OWN_FLAGS = {
    "job-name": "set `name`",
    "nodes": "set slurm.nodes (and slurm.min_nodes for a range)",
    "mincpus": "hpc-ddp sets it for a slurm.min_nodes range (tasks_per_node x cpus_per_task)",
    "ntasks": "set slurm.nodes and slurm.tasks_per_node",
    "ntasks-per-node": "set slurm.tasks_per_node",
    "cpus-per-task": "set slurm.cpus_per_task",
    "gpus-per-task": "set slurm.gpus_per_task",
    "gpus-per-node": "set slurm.gpus_per_node",
    "mem": "set slurm.mem",
    "time": "set slurm.time",
    "partition": "set slurm.partition",
    "account": "set slurm.account",
    "qos": "set slurm.qos",
    "constraint": "set slurm.constraint",
    "exclusive": "set slurm.exclusive: true",
    "signal": "set requeue.signal and requeue.lead_time",
    "requeue": "hpc-ddp always asks for --requeue",
    "no-requeue": "hpc-ddp needs --requeue to survive preemption and time limits",
    "open-mode": "hpc-ddp appends to logs so that a requeue never truncates them",
    "output": "logs always go to RUN_DIR/logs",
    "error": "logs always go to RUN_DIR/logs",
    "array": "sweeps set the array",
    "wrap": "hpc-ddp submits a script, not --wrap",
    "no-kill": "set fault.enabled: with it hpc-ddp asks for --no-kill (its supervisor handles "
    "a lost node)",
}


@dataclass(frozen=True)
class RenderContext:
    """What the script needs besides the job config: where it runs and how it was made."""

    run_dir: str
    """Absolute run directory; for an array job, the sweep directory."""
    python: str
    """The interpreter that runs ``-m hpc_ddp run`` on the nodes when there is no container
    (the submitting ``sys.executable``); inside one, ``env.container.python`` runs instead."""
    config_source: str
    submit_command: str
    generated_at: str
    version: str
    exclude: tuple[str, ...] = ()
    """Nodes the job asks Slurm to leave out (``--exclude``, the lemon record's), besides any
    ``slurm.extra`` names."""
    array: str | None = None
    """Slurm array spec (``0-5%2``); each task then runs in ``RUN_DIR/tasks/<index>``."""
    array_offset: int = 0
    """Array task ``t`` runs sweep point ``t + array_offset`` (arrays past ``MaxArraySize``).

    The script exports ``HPC_DDP_ARRAY_OFFSET`` for the runtime. Slurm's log-file patterns
    cannot add, so logs then go through ``RUN_DIR/arrays/<offset>/<t>``, which the caller
    makes a symlink to ``../../tasks/<t + offset>``.
    """


def default_template_text() -> str:
    """The text of the template shipped in ``slurm_templates/default.sbatch.j2``."""
    # Found from the package's own module, not through importlib.resources, whose imports
    # (tempfile, zipfile) cost ~4 ms of every submit for zipped installs that pip never makes.
    package = importlib.import_module("hpc_ddp.slurm_templates")  # slurm_templates/ (package-dir)
    assert package.__file__ is not None  # a regular package (it has an __init__.py)
    return Path(package.__file__).with_name(DEFAULT_TEMPLATE).read_text(encoding="utf-8")


def load_template(cfg: JobConfig, base_dir: Path) -> str | None:
    """Read ``cfg.slurm.template`` (relative to ``base_dir``); None for the default template,
    which :func:`render_sbatch` writes without reading it."""
    if cfg.slurm.template is None:
        return None
    path = Path(cfg.slurm.template)
    if not path.is_absolute():
        path = base_dir / path
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RenderError(
            f"sbatch template {str(path)!r} (slurm.template) does not exist. HINT: fix the path "
            f"(a relative one is taken from {str(base_dir)!r}) or drop slurm.template to use "
            "the default template"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RenderError(
            f"cannot read sbatch template {str(path)!r} (slurm.template): {exc}. "
            "HINT: make it a readable UTF-8 text file"
        ) from None


def sbatch_command(
    script: Path, *, test_only: bool = False, extra_args: Sequence[str] = ()
) -> list[str]:
    """The sbatch argv that submits ``script`` (what a dry run shows beside it), or with
    ``test_only`` asks when it would start. Pure, so a dry run needs no Slurm client."""
    return ["sbatch", "--test-only" if test_only else "--parsable", *extra_args, str(script)]


def sbatch_flags(cfg: JobConfig, ctx: RenderContext) -> list[Flag]:
    """Every sbatch flag of the job as (long name, value or ``None``), sorted by name."""
    s = cfg.slurm
    logs, stem = _batch_log_pattern(ctx)
    flags: dict[str, str | None] = {
        "job-name": cfg.name,
        # The spares too: the supervisor's steps use `nodes` of them (see the template).
        "nodes": _nodes_flag(s),
        "ntasks-per-node": str(s.tasks_per_node),
        "time": format_slurm_time(s.time_s),
        "signal": f"{_signal_name(cfg.requeue.signal)}@{cfg.requeue.lead_s}",
        "requeue": None,
        # A requeued job reopens its logs: without append Slurm truncates them.
        "open-mode": "append",
        "output": f"{logs}/{stem}.out",
        "error": f"{logs}/{stem}.err",
    }
    optional: dict[str, object] = {
        "cpus-per-task": s.cpus_per_task,
        "gpus-per-task": s.gpus_per_task,
        "gpus-per-node": s.gpus_per_node,
        "mem": s.mem,
        "partition": s.partition,
        "account": s.account,
        "qos": s.qos,
        "constraint": s.constraint,
        "array": ctx.array,
    }
    flags.update({name: str(value) for name, value in optional.items() if value is not None})
    if _is_range(s):
        flags.update(_range_shape(s))
        del flags["ntasks-per-node"]
        flags.pop("cpus-per-task", None)
    if s.exclusive:
        flags["exclusive"] = None
    if cfg.fault.enabled:
        flags["no-kill"] = None  # a lost node ends its step, not the job (see the template)
    for name, value in s.extra:
        if not _FLAG_NAME.fullmatch(name):
            raise RenderError(
                f"slurm.extra flag {name!r} is not a long sbatch option name. HINT: write it "
                "without dashes, in lower case, e.g. 'mail-type' for --mail-type"
            )
        if name in _OWN_FLAGS:
            raise RenderError(
                f"slurm.extra sets --{name}, which hpc-ddp writes itself. HINT: {_OWN_FLAGS[name]}"
            )
        flags[name] = value
    if ctx.exclude:
        # Added to the user's own --exclude (slurm.extra), never in its place.
        given = [n for n in (flags.get("exclude") or "").split(",") if n]
        flags["exclude"] = ",".join(dict.fromkeys([*given, *ctx.exclude]))
    return sorted(flags.items())


def _is_range(s: SlurmConfig) -> bool:
    return s.min_nodes is not None and s.min_nodes < s.nodes


def _nodes_flag(s: SlurmConfig) -> str:
    """``--nodes``: ``NODES``, or ``MIN-MAX`` with ``slurm.min_nodes``, spares added to both
    ends. Slurm then gives as many nodes of the range as it can at once; the batch script
    sees the nodes it gave (``SLURM_JOB_NUM_NODES``), the supervisor's steps use them all, and
    so does a plain ``srun`` (with ``--ntasks-per-node``, see :func:`srun_args`)."""
    most = s.nodes + s.spare_nodes
    if not _is_range(s):
        return str(most)
    assert s.min_nodes is not None
    return f"{s.min_nodes + s.spare_nodes}-{most}"


def _range_shape(s: SlurmConfig) -> dict[str, str | None]:
    """A node range's per-node request: ``--mincpus`` for a whole node's ranks, in place of
    ``--ntasks-per-node`` and ``--cpus-per-task``.

    Seen on Slurm 22.05: ``--nodes=1-2 --ntasks-per-node=1`` got one node with both idle (the
    range's top is capped at MIN x tasks per node), while ``--nodes=1-2 --mincpus=N`` gets both
    when they are free and one when the other is busy, a requeue included. The steps' shape
    (tasks per node, CPUs per task) is srun's to set, which it does in any case.
    """
    cpus = s.tasks_per_node * (s.cpus_per_task or 1)
    return {"mincpus": str(cpus)}


def format_sbatch_line(name: str, value: str | None) -> str:
    """One ``#SBATCH`` line, quoted for sbatch's own parser (not bash's)."""
    if value is None:
        return f"#SBATCH --{name}"
    _refuse_line_breaks(f"sbatch flag --{name}", value)
    if '"' in value or "\\" in value:
        raise RenderError(
            f"sbatch flag --{name} value {value!r} contains a double quote or backslash, which "
            "sbatch's #SBATCH parser treats as quoting. HINT: remove them from the value"
        )
    if _SBATCH_PLAIN.fullmatch(value):
        return f"#SBATCH --{name}={value}"
    return f'#SBATCH --{name}="{value}"'


def render_sbatch(cfg: JobConfig, ctx: RenderContext, template_text: str | None = None) -> str:
    """Render the job's sbatch script from a user's Jinja2 template, or (``template_text=None``)
    the default one, written by :func:`~hpc_ddp.backends.slurm.default_script.render_default_script`
    without Jinja2 (the same bytes as ``default.sbatch.j2``)."""
    for where, value in _rendered_strings(cfg, ctx):
        _refuse_line_breaks(where, value)
    variables = template_variables(cfg, ctx)
    if template_text is None:
        script = render_default_script(variables)
    else:
        script = _render_jinja(template_text, variables)
    _check_script_shape(script)
    return script


def _render_jinja(text: str, variables: dict[str, Any]) -> str:
    """A user's template (``slurm.template``) rendered by Jinja2."""
    import jinja2  # here, not at the top: importing it costs a third of a default dry run

    if variables["ch_run"] and "ch_run" not in text:
        # `launcher` is empty then: a template that predates charliecloud would run the tasks
        # outside the container without a word.
        raise RenderError(
            "env.container.runtime is charliecloud, but the sbatch template (slurm.template) "
            "never uses `ch_run`. HINT: copy the two `ch_run` blocks of the default template "
            "(slurm_templates/default.sbatch.j2) into yours"
        )
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = shlex.quote
    try:
        return env.from_string(text).render(variables)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(
            f"sbatch template line {exc.lineno}: {exc.message}. HINT: fix the Jinja2 syntax"
        ) from None
    except jinja2.UndefinedError as exc:
        raise RenderError(
            f"sbatch template uses an unknown value: {exc.message}. HINT: use only "
            f"{', '.join(sorted(variables))}"
        ) from None


def template_variables(cfg: JobConfig, ctx: RenderContext) -> dict[str, Any]:
    """The names a template sees (a user template may use any of them)."""
    for name, _ in cfg.env.vars:
        if not _ENV_NAME.fullmatch(name):
            raise RenderError(
                f"env.vars name {name!r} is not a shell variable name. "
                "HINT: use letters, digits and underscores, not starting with a digit"
            )
    run_dir = shlex.quote(ctx.run_dir)
    flags = sbatch_flags(cfg, ctx)
    ch_run = _ch_run_words(cfg)
    if ch_run:
        _check_visible_to_ch_run(cfg, ctx)
    return {
        "cfg": cfg,
        "ctx": ctx,
        "version": ctx.version,
        "generated_at": ctx.generated_at,
        "config_source": ctx.config_source,
        "submit_command": ctx.submit_command,
        "flags": flags,
        "sbatch_lines": [format_sbatch_line(n, v) for n, v in flags],
        "modules": list(cfg.env.modules),
        "setup": list(cfg.env.setup),
        "env_vars": list(cfg.env.vars),
        "run_dir_expr": _run_dir_expr(ctx, run_dir),
        "array_offset": ctx.array_offset if ctx.array else 0,
        "srun_args": srun_args(cfg, ctx),
        # charliecloud: `ch-run --cd="$PWD" CH_RUN -- PYTHON ...`, the one expansion it needs.
        "launcher": [] if ch_run else launcher_argv(cfg),
        "ch_run": ch_run,
        "task_argv": [task_python(cfg, ctx), "-m", "hpc_ddp", "run", ctx.run_dir],
        "supervisor_argv": supervisor_argv(cfg, ctx),
        # An array task's logs/ is made by the script, not at submit (see _batch_log_pattern).
        "make_logs_dir": bool(ctx.array),
    }


def supervisor_argv(cfg: JobConfig, ctx: RenderContext) -> list[str]:
    """``PYTHON -m hpc_ddp supervise RUN_DIR`` (the batch script execs it, srun's argv after
    ``--``); empty without ``fault.enabled``. ``PYTHON`` is the interpreter that submitted, on
    the batch host even with a container: the supervisor imports no torch and runs no task."""
    if not cfg.fault.enabled:
        return []
    return [ctx.python, "-m", "hpc_ddp", "supervise", ctx.run_dir]


def task_python(cfg: JobConfig, ctx: RenderContext) -> str:
    """The interpreter the tasks run: ``env.container.python`` in a container (the login
    node's interpreter does not exist in the image), else ``ctx.python``."""
    container = cfg.env.container
    return ctx.python if container is None else container.python


def srun_args(cfg: JobConfig, ctx: RenderContext) -> list[str]:
    """The step's srun options (unquoted argv); ``slurm.srun_args`` come last.

    No ``--cpu-bind``: Slurm binds each task to its ``cpus_per_task`` CPUs (or follows the
    site's default), which keeps ranks sharing a node off each other's cores; a job that wants
    another binding sets ``--cpu-bind=...`` in ``slurm.srun_args``.
    """
    logs = _log_dir_pattern(ctx)
    # Without a supervisor srun ends the step when a task fails; with one the supervisor does,
    # after the frozen ranks were woken and every rank had a moment to write its stacks.
    args = [] if cfg.fault.enabled else ["--kill-on-bad-exit=1"]
    args += [
        f"--output={logs}/rank-%t.out",
        f"--error={logs}/rank-%t.err",
        "--open-mode=append",
    ]
    if cfg.slurm.cpus_per_task is not None:
        # srun in 22.05 does not inherit -c from sbatch.
        args.append(f"--cpus-per-task={cfg.slurm.cpus_per_task}")
    if _is_range(cfg.slurm) and not cfg.fault.enabled:
        # A node range asks sbatch for no tasks per node (see _range_shape): the step says it,
        # on every node it got (the supervisor gives its steps their whole shape itself).
        args.append(f"--ntasks-per-node={cfg.slurm.tasks_per_node}")
    container = cfg.env.container
    if container is not None and container.runtime == "pyxis":
        args.append(f"--container-image={container.image}")
        if container.binds:
            for bind in container.binds:
                if "," in bind:
                    raise RenderError(
                        f"env.container.binds entry {bind!r} contains a comma, which pyxis "
                        "reads as a separator. HINT: bind a directory whose path has no comma"
                    )
            args.append(f"--container-mounts={','.join(container.binds)}")
        args.extend(container.options)
    for arg in cfg.slurm.srun_args:
        if not arg.startswith("-"):
            raise RenderError(
                f"slurm.srun_args entry {arg!r} is not an srun option. HINT: each entry is one "
                "option starting with '-', its value attached: '--mpi=pmix'"
            )
    args.extend(cfg.slurm.srun_args)
    return args


def launcher_argv(cfg: JobConfig, workdir: str = "$PWD") -> list[str]:
    """The container wrapper before the python command (empty without apptainer or
    charliecloud: pyxis is srun's own options).

    ``workdir`` is where ch-run starts the task: the script passes the job's working directory
    (``"$PWD"``, expanded by the batch shell), as the tasks of a job without a container start
    there (apptainer does the same by itself)."""
    container = cfg.env.container
    if container is None or container.runtime == "pyxis":
        return []
    if container.runtime == "charliecloud":
        return ["ch-run", f"--cd={workdir}", *_ch_run_words(cfg), "--"]
    argv = ["apptainer", "exec"]
    if cfg.slurm.gpus_per_task or cfg.slurm.gpus_per_node:
        argv.append("--nv")
    for bind in container.binds:
        argv += ["--bind", bind]
    return [*argv, *container.options, container.image]


_CH_RUN_UNSET = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
"""ch-run passes the host's environment through (Slurm's variables and ``CUDA_VISIBLE_DEVICES``
must reach the task), but these would point the image's interpreter at the host's packages."""


def _ch_run_words(cfg: JobConfig) -> list[str]:
    """ch-run's arguments between ``--cd`` and ``--``: ``[-b SRC[:DST]]... --unset-env=...
    [OPTIONS] IMAGE`` (empty without charliecloud). No ``-w``: every task of every node shares
    the image read-only. The script writes ``ch-run --cd="$PWD" WORDS -- PYTHON ...``."""
    container = cfg.env.container
    if container is None or container.runtime != "charliecloud":
        return []
    argv = []
    for bind in container.binds:
        if bind.count(":") > 1:
            raise RenderError(
                f"env.container.binds entry {bind!r} has options (SRC:DST:OPTS), which ch-run "
                "does not take. HINT: write SRC or SRC:DST (ch-run binds read-write)"
            )
        argv += ["-b", bind]
    argv += [f"--unset-env={name}" for name in _CH_RUN_UNSET]
    return [*argv, *container.options, container.image]


def _check_visible_to_ch_run(cfg: JobConfig, ctx: RenderContext) -> None:
    """The tasks of a charliecloud job must see the run directory at its own path: every task
    would fail after the queue wait otherwise."""
    container = cfg.env.container
    assert container is not None
    if container.ch_run_shows(ctx.run_dir) is False:
        raise RenderError(
            f"the run directory {ctx.run_dir!r} is not visible inside the charliecloud "
            "container at that path: of the host's files ch-run shows only /tmp (unless "
            "--private-tmp) and env.container.binds that keep their path (here: "
            f"{', '.join(container.binds) or 'none'}). HINT: add the top directory that holds "
            "it to env.container.binds (e.g. /scratch; the image must have that directory), "
            "or pick another --runs-dir"
        )


def _run_dir_expr(ctx: RenderContext, run_dir: str) -> str:
    """The task's run directory as a shell word (``run_dir`` is already quoted)."""
    if not ctx.array:
        return run_dir
    if isinstance(ctx.array_offset, bool) or not isinstance(ctx.array_offset, int):
        raise RenderError(f"array_offset must be an integer, got {ctx.array_offset!r}")
    if ctx.array_offset < 0:
        raise RenderError(f"array_offset must not be negative, got {ctx.array_offset}")
    if ctx.array_offset:
        return f'{run_dir}/tasks/"$((SLURM_ARRAY_TASK_ID + {ctx.array_offset}))"'
    return f'{run_dir}/tasks/"$SLURM_ARRAY_TASK_ID"'


def _log_dir_pattern(ctx: RenderContext) -> str:
    """The logs directory as a Slurm filename pattern (``%a``: the array task id)."""
    run_dir = _escape_pattern(ctx.run_dir)
    if not ctx.array:
        return f"{run_dir}/logs"
    if ctx.array_offset:
        return f"{run_dir}/arrays/{ctx.array_offset}/%a/logs"
    return f"{run_dir}/tasks/%a/logs"


def _batch_log_pattern(ctx: RenderContext) -> tuple[str, str]:
    """Where the batch script's own logs go. An array's go to the sweep's ``logs/``, named by
    array job and task id (:func:`hpc_ddp.backends.arrays.batch_logs` finds a point's):
    Slurm opens them before the script runs, and making every task's ``logs/`` at submit cost a
    third of a sweep's submit time (the script makes it, for the rank logs)."""
    if ctx.array:
        return _escape_pattern(ctx.run_dir) + "/logs", "batch-%A_%a"
    return _log_dir_pattern(ctx), "batch-%j"


def _escape_pattern(path: str) -> str:
    """Keep a literal ``%`` in a path from being read as a Slurm filename pattern."""
    return path.replace("%", "%%")


def _signal_name(signal: str) -> str:
    if not _SIGNAL.fullmatch(signal):
        raise RenderError(
            f"requeue.signal {signal!r} is not a signal name. HINT: use e.g. USR2 or USR1"
        )
    return signal


def _refuse_line_breaks(where: str, value: str) -> None:
    if any(c in value for c in _LINE_BREAKS):
        raise RenderError(
            f"{where} value {value!r} contains a line break or NUL, which would escape into "
            "the script's shell. HINT: write it on one line (split setup into several entries)"
        )


def _rendered_strings(cfg: JobConfig, ctx: RenderContext) -> Iterator[tuple[str, str]]:
    """Every string that can reach the script, with where it came from."""
    yield "name", cfg.name
    for section in ("slurm", "env", "requeue"):
        yield from _strings(section, getattr(cfg, section))
    # Params never reach the default script (the tasks read them from config.yaml), but a
    # user template may render them.
    for name, value in cfg.params.flat().items():
        if isinstance(value, str):
            yield f"params.{name}", value
    yield from _strings("context", ctx)


def _strings(where: str, value: object) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _strings(f"{where}[{i}]", item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _strings(f"{where}.{f.name}", getattr(value, f.name))


def _check_script_shape(script: str) -> None:
    """sbatch needs a shebang and reads #SBATCH lines only before the first command."""
    lines = script.splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise RenderError(
            "the rendered script does not start with '#!', so sbatch refuses it. "
            "HINT: make '#!/bin/bash' the template's first line"
        )
    in_header = True
    for number, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if in_header and stripped and not stripped.startswith("#"):
            in_header = False
        elif not in_header and line.startswith("#SBATCH"):
            raise RenderError(
                f"rendered script line {number} is an #SBATCH line after the first command, "
                "where sbatch ignores it. HINT: move sbatch_lines above every command"
            )
