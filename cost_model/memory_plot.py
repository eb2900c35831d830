"""Plot the peak memory per rank of each pipeline stage as stacked bars against the capacity.

One bar per stage, stacked in the order of :class:`cost_model.memory.MemoryBreakdown`::

    total_s = params + grads + optimizer + activations + recompute_working + buffers + reserved

with a dashed line at the device's ``capacity`` (``memory_gib`` of the cluster spec) and the
total and its share of the capacity, ``total_s / capacity``, written above each bar (red when
it does not fit). Takes what ``Estimate.to_dict()["memory_breakdown_gib"]`` holds: one mapping
per stage, GiB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from fxplan.cost_model.plotting import new_axes, save_figure

__all__ = ["PARTS", "plot_memory"]

#: Stacked parts, bottom to top, with their legend names and colours.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("params", "parameters", "#4c72b0"),
    ("grads", "gradients", "#55a868"),
    ("optimizer", "optimizer states", "#8172b2"),
    ("activations", "activations", "#dd8452"),
    ("recompute_working", "recompute working", "#ccb974"),
    ("buffers", "buffers", "#64b5cd"),
    ("reserved", "reserved (runtime)", "#b0b0b0"),
)


def plot_memory(stages: Sequence[Mapping[str, float]], path: str | Path, *,
                title: str | None = None) -> Path:
    """Draw the per-stage breakdowns (GiB, keys of :data:`PARTS` and ``capacity``) to ``path``
    and return the path."""
    if not stages:
        raise ValueError("no memory breakdown to plot")
    n = len(stages)
    fig, ax = new_axes(max(9.0, 3.5 + 0.7 * n), 5.2)
    xs = list(range(n))
    bottom = [0.0] * n
    for key, name, color in PARTS:
        heights = [float(s.get(key, 0.0)) for s in stages]
        ax.bar(xs, heights, bottom=bottom, color=color, label=name, width=0.65,
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    capacity = max(float(s["capacity"]) for s in stages)
    ax.axhline(capacity, color="#c44e52", linestyle="--", linewidth=1.2,
               label=f"capacity {capacity:.3g} GiB")
    for x, total, s in zip(xs, bottom, stages):
        fits = total <= float(s["capacity"])
        ax.text(x, total + capacity * 0.01, f"{total:.3g} GiB\n{total / float(s['capacity']):.0%}",
                ha="center", va="bottom", fontsize=8, color="#222222" if fits else "#c44e52")
    ax.set_xlim(-0.5 - 0.5 * (n < 3), n - 0.5 + 0.5 * (n < 3))
    ax.set_xticks(xs)
    ax.set_xticklabels([f"stage {i}" for i in xs], rotation=0 if n <= 12 else 90)
    ax.set_ylabel("memory per rank (GiB)")
    ax.set_ylim(0, max(capacity, max(bottom)) * 1.18)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.6)
    fig.suptitle(title or "peak memory per rank, by pipeline stage")
    by_label = dict(zip(*reversed(ax.get_legend_handles_labels())))
    names = [f"capacity {capacity:.3g} GiB"] + [name for _, name, _ in reversed(PARTS)]
    ax.legend([by_label[n] for n in names], names, loc="upper left",  # as stacked, top first
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, path)
