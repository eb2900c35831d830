"""Plot a pipeline timeline (``Estimate.timeline()``) as one row of bars per stage.

Forward ops are blue, backward ops orange and, where a zero-bubble schedule splits the
backward, its weight-gradient ops green; with several model chunks per stage each chunk ``c``
gets its own shade (darker for later chunks). Gaps are idle time: the schedule's bubble and
waits for slower stages (the estimate's ``bubble`` and ``stage_imbalance``). The legend names
kind and chunk; microbatch numbers are written into the bars that are wide enough to hold them (a bar
gets a label when its width is at least ``LABEL_MIN_FRACTION`` of the plotted span, and only
while there are at most ``label_limit`` ops). Each stage's busy fraction ``busy / makespan``
is shown at the right end of its row.

With many microbatches the steady state would be a barcode, so :func:`compress_events` cuts
it out: with ``h = 2·p·v + 2·keep`` ops (warm-up, cool-down and ``keep`` steady microbatches
on each side), the cut runs from ``t_a = max_s end(op h−1 of s)`` to
``t_b = min_s start(op K−h of s)`` (``K`` ops per stage), when that is at least
``MIN_CUT_FRACTION`` of the makespan. Ops after ``t_b`` move left by ``t_b − t_a − g``
(``g``, a small gap, is drawn as a hatched band saying how many ops and how much time it
hides); the time axis keeps the true times (its ticks after the band read ``x + removed``).
The busy fractions are computed on all ops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from fxplan.core.units import time_unit
from fxplan.report.plotting import new_axes, save_figure

__all__ = ["Cut", "compress_events", "plot_timeline"]

_COLORS = {"F": ("#9ecae1", "#4292c6", "#08519c", "#08306b"),
           "B": ("#fdae6b", "#f16913", "#d94801", "#8c2d04"),
           "W": ("#a1d99b", "#41ab5d", "#006d2c", "#00441b")}
_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
_TEXT_ON = ("#000000", "#000000", "#ffffff", "#ffffff")  # readable on each shade
#: Smallest bar, as a fraction of the makespan, that gets its microbatch number.
LABEL_MIN_FRACTION = 0.012
#: Smallest steady state worth cutting out, as a fraction of the makespan.
MIN_CUT_FRACTION = 0.2


class Cut(NamedTuple):
    """The steady state :func:`compress_events` left out: drawn as a band from ``at`` to
    ``at + gap``; ops after it were moved left by ``removed`` seconds; ``hidden`` ops."""

    at: float
    gap: float
    removed: float
    hidden: int


def compress_events(events: Sequence[Sequence], *, keep: int = 3
                    ) -> tuple[list[tuple], Cut | None]:
    """``events`` with the steady state cut out (module docstring), and the cut (``None``
    when there is too little to cut). Ops straddling a cut edge are clipped to it."""
    events = [tuple(e) for e in events]
    stages = max(e[0] for e in events) + 1
    chunks = max(e[3] for e in events) + 1
    by_stage = [sorted((e for e in events if e[0] == s), key=lambda e: e[4]) for s in range(stages)]
    head = 2 * stages * chunks + 2 * keep
    if any(2 * head >= len(ops) for ops in by_stage):
        return events, None
    makespan = max(e[5] for e in events)
    t_a = max(ops[head - 1][5] for ops in by_stage)
    t_b = min(ops[len(ops) - head][4] for ops in by_stage)
    if t_b - t_a < MIN_CUT_FRACTION * makespan:
        return events, None
    gap = 0.04 * (makespan - (t_b - t_a))
    removed = t_b - t_a - gap
    shown, hidden = [], 0
    for e in events:
        start, end = e[4], e[5]
        if start >= t_a and end <= t_b:
            hidden += 1
            continue
        if start < t_a:
            shown.append((*e[:4], start, min(end, t_a)))
        if end > t_b:
            shown.append((*e[:4], max(start, t_b) - removed, end - removed))
    return shown, Cut(t_a, gap, removed, hidden)


def _shade(kind: str, chunk: int) -> tuple[str, str]:
    """Face colour and text colour of an op of ``kind`` in model chunk ``chunk``."""
    palette = _COLORS[kind]
    i = min(chunk, len(palette) - 1)
    return palette[i], _TEXT_ON[i]


def _legend(ax: object, chunks: int, kinds: Sequence[str] = ("F", "B")) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_shade(kind, c)[0], edgecolor="white",
                     label=_NAMES[kind] + (f", chunk {c}" if chunks > 1 else ""))
               for kind in kinds for c in range(chunks)]
    handles.append(Patch(facecolor="white", edgecolor="#bbbbbb", label="idle (bubble, stage imbalance)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22 if chunks > 1 else -0.28),
              ncol=min(len(handles), 5), frameon=False)


def _draw_cut(ax: object, cut: Cut, scale: float, unit: str, stages: int) -> None:
    """The hatched band where the steady state was cut, and true times on the axis."""
    from matplotlib.ticker import FuncFormatter

    ax.axvspan(cut.at * scale, (cut.at + cut.gap) * scale, facecolor="#f0f0f0",
               edgecolor="#999999", hatch="///", linewidth=0.6)
    ax.text((cut.at + cut.gap / 2) * scale, -0.55, f"⋯ {cut.hidden} ops ({cut.removed * scale:.4g} "
            f"{unit}) of steady state not drawn ⋯", ha="center", va="bottom", fontsize=8,
            color="#444444")
    edge = (cut.at + cut.gap) * scale
    def tick(x: float, _: object) -> str:
        value = x + (cut.removed * scale if x > edge else 0.0)
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"

    ax.xaxis.set_major_formatter(FuncFormatter(tick))


def plot_timeline(events: Iterable[Sequence], path: str | Path, *, title: str | None = None,
                  label_limit: int = 400, compress: bool = True) -> Path:
    """Draw ``events`` (``(stage, kind, microbatch, chunk, start, end)``, seconds) to ``path``
    (format from the suffix, e.g. ``.png``/``.svg``) and return the path; with ``compress``
    a long steady state is cut out (:func:`compress_events`)."""
    events = list(events)
    if not events:
        raise ValueError("no timeline events to plot")
    stages = max(e[0] for e in events) + 1
    chunks = max(e[3] for e in events) + 1
    kinds = [kind for kind in _NAMES if any(e[1] == kind for e in events)]
    makespan = max(e[5] for e in events)
    busy = [0.0] * stages
    for e in events:
        busy[e[0]] += e[5] - e[4]
    cut = None
    if compress:
        events, cut = compress_events(events)
    end = max(e[5] for e in events)
    scale, unit = time_unit(makespan)
    fig, ax = new_axes(12, 0.55 * stages + 2.4)
    label = len(events) <= label_limit
    for stage, kind, microbatch, chunk, start, stop in events:
        face, text = _shade(kind, chunk)
        ax.broken_barh([(start * scale, (stop - start) * scale)], (stage - 0.4, 0.8),
                       facecolors=face, edgecolor="white", linewidth=0.5)
        if label and stop - start >= LABEL_MIN_FRACTION * end:
            ax.text((start + stop) / 2 * scale, stage, str(microbatch), ha="center",
                    va="center", fontsize=7, color=text)
    for stage in range(stages):
        ax.text(end * scale * 1.005, stage, f"{busy[stage] / makespan:.0%} busy", va="center",
                fontsize=8, color="#555555")
    if cut is not None:
        _draw_cut(ax, cut, scale, unit, stages)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.set_xlabel(f"time ({unit}); numbers in bars: microbatch")
    ax.set_xlim(0, end * scale * 1.08)
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.6)
    ax.set_title(title or "pipeline timeline", pad=16 if cut is not None else 6)
    _legend(ax, chunks, kinds)
    return save_figure(fig, path)
