"""Plot a pipeline timeline (``Estimate.timeline()``) as one row of bars per stage.

Forward ops are blue, backward ops orange; with an interleaved schedule each model chunk ``c``
gets its own shade (darker for later chunks). Gaps are bubbles. The legend names kind and
chunk; microbatch numbers are written into the bars that are wide enough to hold them (a bar
gets a label when its width is at least ``LABEL_MIN_FRACTION`` of the plotted span, and only
while there are at most ``label_limit`` ops). Each stage's busy fraction ``busy / makespan``
is shown at the right end of its row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from fxplan.cost_model.plotting import new_axes, save_figure, time_unit

__all__ = ["plot_timeline"]

_COLORS = {"F": ("#9ecae1", "#4292c6", "#08519c", "#08306b"),
           "B": ("#fdae6b", "#f16913", "#d94801", "#8c2d04")}
_NAMES = {"F": "forward", "B": "backward"}
_TEXT_ON = ("#000000", "#000000", "#ffffff", "#ffffff")  # readable on each shade
#: Smallest bar, as a fraction of the makespan, that gets its microbatch number.
LABEL_MIN_FRACTION = 0.012


def _shade(kind: str, chunk: int) -> tuple[str, str]:
    """Face colour and text colour of an op of ``kind`` in model chunk ``chunk``."""
    palette = _COLORS[kind]
    i = min(chunk, len(palette) - 1)
    return palette[i], _TEXT_ON[i]


def _legend(ax: object, chunks: int) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_shade(kind, c)[0], edgecolor="white",
                     label=_NAMES[kind] + (f", chunk {c}" if chunks > 1 else ""))
               for kind in ("F", "B") for c in range(chunks)]
    handles.append(Patch(facecolor="white", edgecolor="#bbbbbb", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22 if chunks > 1 else -0.28),
              ncol=min(len(handles), 5), frameon=False)


def plot_timeline(events: Iterable[Sequence], path: str | Path, *, title: str | None = None,
                  label_limit: int = 400) -> Path:
    """Draw ``events`` (``(stage, kind, microbatch, chunk, start, end)``, seconds) to ``path``
    (format from the suffix, e.g. ``.png``/``.svg``) and return the path."""
    events = list(events)
    if not events:
        raise ValueError("no timeline events to plot")
    stages = max(e[0] for e in events) + 1
    chunks = max(e[3] for e in events) + 1
    end = max(e[5] for e in events)
    scale, unit = time_unit(end)
    fig, ax = new_axes(12, 0.55 * stages + 2.4)
    label = len(events) <= label_limit
    busy = [0.0] * stages
    for stage, kind, microbatch, chunk, start, stop in events:
        face, text = _shade(kind, chunk)
        busy[stage] += stop - start
        ax.broken_barh([(start * scale, (stop - start) * scale)], (stage - 0.4, 0.8),
                       facecolors=face, edgecolor="white", linewidth=0.5)
        if label and stop - start >= LABEL_MIN_FRACTION * end:
            ax.text((start + stop) / 2 * scale, stage, str(microbatch), ha="center",
                    va="center", fontsize=7, color=text)
    for stage in range(stages):
        ax.text(end * scale * 1.005, stage, f"{busy[stage] / end:.0%} busy", va="center",
                fontsize=8, color="#555555")
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.set_xlabel(f"time ({unit}); numbers in bars: microbatch")
    ax.set_xlim(0, end * scale * 1.08)
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.6)
    ax.set_title(title or "pipeline timeline")
    _legend(ax, chunks)
    return save_figure(fig, path)
