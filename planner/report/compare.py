"""``fxplan compare``'s presentation: the table, the Pareto plot (PNG) and the HTML page.

The table lists the rows of a :class:`fxplan.compare.Comparison` in its order (by cost, or by
device-hours without prices), the Pareto rows marked ``*``. The plot puts days to train on
the x axis and cost (or device-hours) on the y axis, one marker style per cluster kind, each
point labelled with its device count, and joins the Pareto front with a line.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from fxplan.compare import Comparison, CompareRow

__all__ = ["plot_comparison", "render_comparison", "write_html"]

_HEADER = ("cluster", "devices", "plan", "step", "MFU", "memory", "days", "device-hours",
           "cost", "Pareto")


def _cells(row: CompareRow) -> tuple[str, ...]:
    from fxplan.core.units import seconds

    return (row.cluster, f"{row.devices:,}", row.summary, seconds(row.step_time_s),
            "–" if row.mfu is None else f"{100 * row.mfu:.1f} %",
            "–" if row.peak_memory_gib is None else f"{row.peak_memory_gib:.1f} GiB",
            f"{row.days:.1f}" + ("" if row.meets_deadline in (None, True) else " (late)"),
            f"{row.device_hours:,.0f}", "–" if row.cost is None else f"{row.cost:,.0f}",
            "*" if row.pareto else "")


def _heading(result: Comparison) -> str:
    from fxplan.core.units import count

    what = (f"{result.model}: {count(result.tokens)} tokens, batch {result.batch:,}"
            + (f" × {result.seq:,}" if result.seq else ""))
    when = (f"smallest size meeting {result.deadline_days:g} days" if result.deadline_days
            else "sweep of sizes")
    rank = ("ranked by cost (prices per device-hour as given)" if result.ranked_by == "cost"
            else "no prices given: ranked by device-hours")
    return f"{what} — {when}; {rank}"


def render_comparison(result: Comparison, console: Any = None) -> None:
    """Print the table (``rich``), the rows that could not be planned, and the elapsed time."""
    from rich.table import Table

    from fxplan.report.console import console as make_console

    out = console or make_console()
    table = Table(title=_heading(result), title_justify="left")
    for i, name in enumerate(_HEADER):
        table.add_column(name, justify="left" if i in (0, 2) else "right",
                         overflow="fold")
    for row in result.rows:
        table.add_row(*_cells(row))
    out.print(table)
    for item in result.unplanned:
        size = f" at {item['devices']:,} devices" if "devices" in item else ""
        out.print(f"not planned: {item['cluster']}{size}: {item['reason']}")
    out.print(f"{len(result.rows)} plan(s) in {result.elapsed_s:.1f} s; * = on the Pareto front "
              f"of days against {result.ranked_by}")


def _label(value: float, _: Any = None) -> str:
    """A tick label without an exponent: ``18,500``, ``12``, ``0.25``."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _scale(axis: Any, set_scale: Any, values: list[float]) -> None:
    """Logarithmic (ticks at 1, 2 and 5 of each decade) where the values span more than 10×,
    linear otherwise; plain tick labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [v for v in values if v and v > 0]
    if positive and max(positive) > 10 * min(positive):
        set_scale("log")
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(_label))
    axis.set_minor_formatter(NullFormatter())


def plot_comparison(result: Comparison, path: str | Path) -> Path:
    """Days against cost (or device-hours), one marker per kind, the Pareto front joined."""
    from fxplan.report.plotting import new_axes, save_figure

    fig, ax = new_axes(7.0, 4.6)
    metric = (lambda r: r.cost) if result.ranked_by == "cost" else (lambda r: r.device_hours)
    markers = "osD^vP*Xh<>"
    for i, kind in enumerate(dict.fromkeys(r.cluster for r in result.rows)):
        rows = [r for r in result.rows if r.cluster == kind]
        ax.scatter([r.days for r in rows], [metric(r) for r in rows], label=kind,
                   marker=markers[i % len(markers)], s=36, zorder=3)
        for r in rows:
            ax.annotate(f"{r.devices}", (r.days, metric(r)), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    front = sorted((r for r in result.rows if r.pareto), key=lambda r: r.days)
    if front:
        ax.plot([r.days for r in front], [metric(r) for r in front], color="0.3", lw=1,
                ls="--", zorder=2, label="Pareto front")
    if result.deadline_days:
        ax.axvline(result.deadline_days, color="tab:red", lw=0.8, ls=":", label="deadline")
    _scale(ax.xaxis, ax.set_xscale, [r.days for r in result.rows])
    _scale(ax.yaxis, ax.set_yscale, [metric(r) for r in result.rows])
    ax.set_xlabel("days to train")
    ax.set_ylabel("cost" if result.ranked_by == "cost" else "device-hours")
    ax.set_title(_heading(result), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    return save_figure(fig, path)


def write_html(result: Comparison, path: str | Path, png: Path) -> Path:
    """A self-contained page: the heading, the plot (embedded) and the table."""
    import base64

    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in _HEADER)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in _cells(r)) + "</tr>"
                   for r in result.rows)
    image = base64.b64encode(png.read_bytes()).decode("ascii")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>fxplan compare</title>"
            f"<style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:right}}"
            f"td:nth-child(1),td:nth-child(3){{text-align:left}}</style></head><body>"
            f"<h1>fxplan compare</h1><p>{e(_heading(result))}</p>"
            f"<img alt='days against {e(result.ranked_by)}' src='data:image/png;base64,{image}'>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>")
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
