"""Plot a pipeline timeline (``Estimate.timeline()``) as one row of bars per stage.

Forward ops are blue, backward ops orange, darker for later model chunks of an interleaved
schedule; gaps are bubbles. Microbatch numbers are written into the bars when there are few
enough to read. Uses matplotlib's non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["plot_timeline"]

_COLORS = {"F": ("#9ecae1", "#4292c6", "#08519c", "#08306b"),
           "B": ("#fdae6b", "#f16913", "#d94801", "#8c2d04")}


def plot_timeline(events: Iterable[Sequence], path: str | Path, *, title: str | None = None,
                  label_limit: int = 400) -> Path:
    """Draw ``events`` (``(stage, kind, microbatch, chunk, start, end)``, seconds) to ``path``
    (format from the suffix, e.g. ``.png``/``.svg``) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = list(events)
    if not events:
        raise ValueError("no timeline events to plot")
    stages = max(e[0] for e in events) + 1
    end = max(e[5] for e in events)
    scale, unit = (1e3, "ms") if end < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(12, 0.45 * stages + 1.5))
    label = len(events) <= label_limit
    for stage, kind, microbatch, chunk, start, stop in events:
        palette = _COLORS[kind]
        ax.broken_barh([(start * scale, (stop - start) * scale)], (stage - 0.4, 0.8),
                       facecolors=palette[min(chunk, len(palette) - 1)], edgecolor="white",
                       linewidth=0.3)
        if label:
            ax.text((start + stop) / 2 * scale, stage, str(microbatch), ha="center",
                    va="center", fontsize=6)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, end * scale)
    ax.set_title(title or "pipeline timeline (blue: forward, orange: backward)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
