"""What ``hpc-ddp results`` shows of a sweep's rows (:func:`hpc_ddp.api.sweep.gather`'s), besides
its JSON (:func:`~hpc_ddp.api.sweep.results_json`): the table, CSV or Markdown, the summary
line, and the plot.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from hpc_ddp.sweep.results import ResultRow, loss_curve, read_metrics, sweep_summary

if TYPE_CHECKING:
    from hpc_ddp.api.sweep import Results

FORMATS = ("table", "csv", "json", "markdown")
"""What ``--format`` may name."""
PLOTTED_CURVES = 5
"""The training curves the plot draws: the best points'."""


def summary_line(found: Results) -> str:
    """Under the table: how many tasks are in which state, and how they are ranked."""
    counts = ", ".join(f"{n} {state}" for state, n in sweep_summary(found.rows).items() if n)
    return f"{len(found.rows)} tasks: {counts}; ranked by {found.sort_key} ({found.mode})"


def check_plot(arg: str) -> Path:
    """Where ``--plot ARG`` writes (:func:`~hpc_ddp.sweep.plot.plot_target`), refused before
    anything is computed when matplotlib cannot write there."""
    from hpc_ddp.sweep.plot import plot_target

    return plot_target(arg)


def plot(found: Results, out: Path) -> Path:
    """Draw the metric per swept key and the best points' training curves to ``out``; the
    file written."""
    from hpc_ddp.sweep.plot import plot_results

    rows = found.rows
    top = [r for r in rows if r.best is not None][:PLOTTED_CURVES]
    curves = {r.index: loss_curve(read_metrics(r.run_dir / "metrics.jsonl")) for r in top}
    return plot_results(
        rows,
        keys=found.record.keys,
        metric=found.metric,
        curves=curves,
        out=out,
        title=f"{found.record.name}: {len(rows)} tasks",
    )


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def table_rows(rows: Sequence[ResultRow], keys: Sequence[str]) -> list[list[Any]]:
    """Rows as table cells; a failed or cancelled task's state names its last cause."""
    out = []
    for r in rows:
        state = r.state.value
        if r.last_cause and r.state.value in ("failed", "cancelled"):
            state = f"{state} ({r.last_cause})"
        out.append(
            [
                r.index,
                state,
                *(_cell(r.values.get(k)) for k in keys),
                r.best,
                r.final,
                r.loss,
                r.steps,
                r.attempts,
                r.job,
            ]
        )
    return out


def format_rows(rows: Sequence[ResultRow], keys: Sequence[str], metric: str, fmt: str) -> str:
    """The rows as a table, CSV or Markdown (text ending in a newline); JSON is
    :func:`hpc_ddp.api.sweep.results_json`'s."""
    headers = ["#", "state", *keys, f"best {metric}", f"final {metric}", "loss", "steps",
               "attempts", "job"]  # fmt: skip
    cells = table_rows(rows, keys)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows([["" if c is None else c for c in row] for row in cells])
        return buf.getvalue()
    tablefmt = "github" if fmt == "markdown" else "simple"
    text = tabulate(
        cells,
        headers=headers,
        tablefmt=tablefmt,
        floatfmt=".4g",
        missingval="-",
        # Job refs such as 31_1 would read as the number 311 (Python allows _ in numbers).
        disable_numparse=[len(headers) - 1],
    )
    return text + "\n"
