"""A picture of a sweep: the metric against each swept parameter, and the top runs' curves.

matplotlib is an optional extra (``pip install 'hpc-ddp[plot]'``), imported only here and only
when a plot is asked for; without it :func:`plot_results` raises a :class:`ConfigError` that
says how to install it (exit code 2). :func:`plot_target` checks where the picture goes (a
format matplotlib writes, a directory that can hold it) before anything is computed.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc_ddp.errors import ConfigError
from hpc_ddp.state.task import TaskState
from hpc_ddp.sweep.results import ResultRow

INSTALL_HINT = "HINT: pip install 'hpc-ddp[plot]' (or pip install matplotlib)"


def require_matplotlib() -> None:
    """Fail early (before any output) when ``--plot`` cannot be honoured."""
    _pyplot()


def plot_target(arg: str) -> Path:
    """Where ``--plot ARG`` writes: ``ARG`` (its suffix names the format), ``ARG/results.png``
    for an existing directory, ``ARG.png`` for a name without a suffix (as matplotlib would).

    Refused with a :class:`ConfigError` (exit 2) before anything is computed: a format
    matplotlib does not write, a parent that is a file, a place no file can be created.
    """
    _pyplot()
    out = Path(arg)
    if out.is_dir():
        out = out / "results.png"
    elif not out.suffix:
        out = out.with_name(out.name + ".png")
    backend_bases = importlib.import_module("matplotlib.backend_bases")
    formats = sorted(backend_bases.FigureCanvasBase.get_supported_filetypes())
    if out.suffix[1:].lower() not in formats:
        raise ConfigError(
            f"--plot {arg}: matplotlib cannot write {out.suffix!r} files. HINT: end the file name "
            f"with one of the supported formats: {', '.join('.' + f for f in formats)} "
            "(e.g. --plot results.png)"
        )
    _check_writable(arg, out)
    return out


def _check_writable(arg: str, out: Path) -> None:
    """Create ``out``'s directory and prove a file can be created there (the probe is removed
    again unless ``out`` already existed)."""
    hint = "HINT: pass a file path in a directory you can write, e.g. --plot results.png"
    above = out.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"--plot {arg}: {above} is a file, not a directory. {hint}")
    existed = out.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("ab"):
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        raise ConfigError(
            f"--plot {arg}: cannot write {out} ({exc.strerror or exc}). {hint}"
        ) from None


def _pyplot() -> Any:
    # import_module: matplotlib is optional, so neither mypy nor the login paths may need it.
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise ConfigError(
            f"--plot needs matplotlib, which is not installed. {INSTALL_HINT}"
        ) from None
    matplotlib.use("Agg")  # a file, never a window: login nodes have no display
    return importlib.import_module("matplotlib.pyplot")


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_results(
    rows: Sequence[ResultRow],
    *,
    keys: Sequence[str],
    metric: str,
    curves: Mapping[int, Sequence[tuple[int, float]]],
    out: Path,
    title: str = "",
) -> Path:
    """Draw one panel per swept key (best ``metric`` of each finished or partial run against
    the key's value; failed runs as red crosses at the value they reached) and one panel of
    the training curves in ``curves`` (point index -> (step, loss)), and save it to ``out``."""
    plt = _pyplot()
    panels = max(1, len(keys)) + (1 if curves else 0)
    cols = min(panels, 3)
    nrows = math.ceil(panels / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, key in zip(flat, keys or ["index"], strict=False):
        _metric_panel(ax, rows, key, metric)
    if curves:
        ax = flat[max(1, len(keys))]
        for index, curve in curves.items():
            if curve:
                steps, losses = zip(*curve, strict=True)
                ax.plot(steps, losses, label=f"#{index}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title("training loss of the top runs")
        ax.legend(fontsize="small")
    for ax in flat[panels:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    except OSError as exc:  # checked by plot_target, but the directory may change since
        raise ConfigError(
            f"--plot: cannot write {out} ({exc.strerror or exc}). HINT: pass a file path in a "
            "directory you can write"
        ) from None
    finally:
        plt.close(fig)
    return out


def _metric_panel(ax: Any, rows: Sequence[ResultRow], key: str, metric: str) -> None:
    def value(row: ResultRow) -> Any:
        return row.index if key == "index" else row.values.get(key)

    have = [r for r in rows if value(r) is not None and r.best is not None]
    xs = [value(r) for r in have]
    if not _numeric(xs):
        labels = sorted({str(x) for x in xs})
        xs = [labels.index(str(x)) for x in xs]
        ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize="small")
    elif xs and min(xs) > 0 and max(xs) / min(xs) >= 100:
        ax.set_xscale("log")  # learning rates and weight decays span decades
    ok = [(x, r.best) for x, r in zip(xs, have, strict=True) if r.state is not TaskState.FAILED]
    bad = [(x, r.best) for x, r in zip(xs, have, strict=True) if r.state is TaskState.FAILED]
    if ok:
        ax.scatter(*zip(*ok, strict=True), label="runs")
    if bad:
        ax.scatter(*zip(*bad, strict=True), marker="x", color="red", label="failed")
        ax.legend(fontsize="small")
    ax.set_xlabel(key)
    ax.set_ylabel(f"best {metric}")
    ax.set_title(f"{metric} vs {key}")
