"""Plot the peak memory per rank of each pipeline stage as stacked bars against the capacity.

One bar per stage, stacked in the order of :class:`cost_model.memory.breakdown.MemoryBreakdown`::

    total_s = params + grads + optimizer + activations + recompute_working + buffers
              + cuda_context + nccl + fragmentation + reserved

with a dashed line at the device's ``capacity`` (``memory_gib`` of the cluster spec; on a
heterogeneous cluster, where stages run on different device groups, a dashed segment over each
bar at its own group's capacity, one legend entry and colour per group, and the group under
each stage's name) and the total and its share of the capacity, ``total_s / capacity``,
written above each bar (red when it does not fit) — above the capacity line when the bar ends
just under it, so that the line never runs through the label. The title is the axes' own
(wrapped), so the saved figure keeps it whole. Takes what ``Estimate.to_dict()["memory_breakdown_gib"]`` holds: one mapping
per stage, GiB.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

from fxplan.report.plotting import new_axes, save_figure

__all__ = ["CAPACITY_COLOURS", "PARTS", "plot_memory"]

#: Stacked parts, bottom to top, with their legend names and colours.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("params", "parameters", "#4c72b0"),
    ("grads", "gradients", "#55a868"),
    ("optimizer", "optimizer states", "#8172b2"),
    ("activations", "activations", "#dd8452"),
    ("recompute_working", "recompute working", "#ccb974"),
    ("buffers", "buffers", "#64b5cd"),
    ("cuda_context", "CUDA context", "#937860"),
    ("nccl", "NCCL buffers", "#da8bc3"),
    ("fragmentation", "allocator fragmentation", "#8c8c8c"),
    ("reserved", "reserved (device spec)", "#b0b0b0"),
)


#: Capacity line colours, one per device group (the first is the single-group colour).
CAPACITY_COLOURS: tuple[str, ...] = ("#c44e52", "#222222", "#9467bd", "#17becf")


def plot_memory(stages: Sequence[Mapping[str, float]], path: str | Path, *,
                title: str | None = None, devices: Sequence[str] | None = None) -> Path:
    """Draw the per-stage breakdowns (GiB, keys of :data:`PARTS` and ``capacity``) to ``path``
    and return the path. ``devices``: the device group of each stage (``v100``), drawn under
    the stage and naming its capacity line when the stages are on several groups."""
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
    capacities = [float(s["capacity"]) for s in stages]
    capacity = max(capacities)
    top = max(capacity, max(bottom)) * 1.22
    groups = list(devices) if devices is not None and len(set(devices)) > 1 else None
    if groups is None and len(set(capacities)) == 1:
        cap_labels = [f"capacity {capacity:.3g} GiB"]
        ax.axhline(capacity, color=CAPACITY_COLOURS[0], linestyle="--", linewidth=1.2,
                   label=cap_labels[0])
    else:
        keys = groups if groups is not None else [f"{c:.3g} GiB" for c in capacities]
        colours = {k: CAPACITY_COLOURS[i % len(CAPACITY_COLOURS)]
                   for i, k in enumerate(dict.fromkeys(keys))}
        labels = {k: (f"capacity of {k}: {c:.3g} GiB" if groups is not None else
                      f"capacity {k}") for k, c in zip(keys, capacities)}
        cap_labels = list(dict.fromkeys(labels[k] for k in keys))
        for x, c, k in zip(xs, capacities, keys):
            ax.hlines(c, x - 0.45, x + 0.45, color=colours[k], linestyles="--", linewidth=1.4,
                      label=labels[k])
    for x, total, cap in zip(xs, bottom, capacities):
        fits = total <= cap
        # a label that would start within 9 % of the axis under the capacity line goes above it
        y = cap + 0.012 * top if fits and cap - total < 0.09 * top else total + 0.012 * top
        ax.text(x, y, f"{total:.3g} GiB\n{total / cap:.0%}", ha="center", va="bottom",
                fontsize=8, color="#222222" if fits else "#c44e52",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85})
    ax.set_xlim(-0.5 - 0.5 * (n < 3), n - 0.5 + 0.5 * (n < 3))
    ax.set_xticks(xs)
    names = [f"stage {i}" + (f"\n{groups[i]}" if groups is not None else "") for i in xs]
    ax.set_xticklabels(names, rotation=0 if n <= 12 else 90)
    ax.set_ylabel("memory per rank (GiB)")
    ax.set_ylim(0, top)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.6)
    lines = (title or "peak memory per rank, by pipeline stage").splitlines()
    ax.set_title("\n".join(textwrap.fill(line, 80) for line in lines), loc="left")
    by_label = dict(zip(*reversed(ax.get_legend_handles_labels())))
    names = cap_labels + [name for _, name, _ in reversed(PARTS)]
    ax.legend([by_label[n] for n in names], names, loc="upper left",  # as stacked, top first
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, path)
