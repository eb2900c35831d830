"""Plots: the pipeline timeline and the memory breakdown are written as valid PNGs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.cost_model.memory_plot import PARTS, plot_memory
from fxplan.cost_model.plotting import is_png
from fxplan.cost_model.timeline_plot import plot_timeline


def assert_png(path: Path) -> None:
    """``path`` is a PNG with some drawing in it (not a blank few hundred bytes)."""
    assert is_png(path) and Path(path).stat().st_size > 2000


def test_timeline_with_chunks_is_a_png(tmp_path: Path) -> None:
    events = [(s, kind, mb, c, t, t + 0.9) for s in range(2) for c in range(2)
              for mb, (kind, t) in enumerate([("F", 4.0 * s + c), ("B", 4.0 * s + 2 + c)])]
    assert_png(plot_timeline(events, tmp_path / "t.png", title="two stages, two chunks"))


def test_timeline_refuses_no_events(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no timeline events"):
        plot_timeline([], tmp_path / "t.png")


def test_memory_breakdown_is_a_png(tmp_path: Path) -> None:
    stage = {key: 1.0 + i for i, (key, _, _) in enumerate(PARTS)}
    over = dict(stage, activations=60.0)
    stages = [dict(stage, capacity=80.0), dict(over, capacity=80.0)]  # the second does not fit
    assert_png(plot_memory(stages, tmp_path / "m.png"))
