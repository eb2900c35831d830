"""Plots: the pipeline timeline and the memory breakdown are written as valid PNGs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.report.memory_plot import PARTS, plot_memory
from fxplan.report.plotting import is_png
from fxplan.report.timeline_plot import plot_timeline


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


def test_long_steady_state_is_cut_and_short_timelines_are_not() -> None:
    """256 microbatches on 4 stages: the cut hides most ops; the kept ones cover the warm-up and
    cool-down of every stage, and the shift is exactly what the cut removed. 8 microbatches:
    nothing is cut."""
    import numpy as np

    from fxplan.cost_model.step.simulator import simulate_pipeline
    from fxplan.report.timeline_plot import compress_events

    durations = np.tile([[[1.0, 2.0]]], (4, 1, 1))
    long = simulate_pipeline("1f1b", 4, 1, 256, durations).events()
    shown, cut = compress_events(long)
    assert cut is not None and cut.hidden > 1500 and len(shown) < 250
    makespan = max(e.end for e in long)
    assert max(e[5] for e in shown) == pytest.approx(makespan - cut.removed)
    for s in range(4):
        mbs = {e[2] for e in shown if e[0] == s}
        assert {0, 255} <= mbs
    short = simulate_pipeline("1f1b", 4, 1, 8, durations).events()
    assert compress_events(short) == ([tuple(e) for e in short], None)


def test_memory_plot_draws_one_capacity_line_per_device_group(tmp_path: Path,
                                                              monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A V100 stage (32 GiB) and an A100 stage (80 GiB): one capacity line each, named by
    group in the legend and under each stage."""
    import fxplan.report.memory_plot as memory_plot

    drawn = {}
    real = memory_plot.save_figure

    def keep(fig, path):  # type: ignore[no-untyped-def]
        ax = fig.axes[0]
        drawn["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
        drawn["lines"] = sorted(float(seg[0][1]) for c in ax.collections
                                if c.get_linestyle() and hasattr(c, "get_segments")
                                for seg in c.get_segments())
        return real(fig, path)

    monkeypatch.setattr(memory_plot, "save_figure", keep)
    stage = {key: 1.0 for key, _, _ in PARTS}
    stages = [dict(stage, capacity=32.0), dict(stage, capacity=80.0)]
    assert_png(plot_memory(stages, tmp_path / "m.png", devices=["v100", "a100"]))
    assert drawn["legend"][:2] == ["capacity of v100: 32 GiB", "capacity of a100: 80 GiB"]
    assert drawn["ticks"] == ["stage 0\nv100", "stage 1\na100"]
    assert drawn["lines"] == [32.0, 80.0]


def test_a_zero_bubble_timeline_draws_its_weight_gradient_ops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A split backward's ``W`` ops (zero-bubble schedules) get their own colour and legend
    entry; a plain schedule's legend names forward and backward only."""
    import torch

    from fxplan.api import capture
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model import ParallelConfig, estimate
    from fxplan.report import timeline_plot

    graph = capture("gpt:layers=8,hidden=256,heads=8,vocab=1024,seq=128", batch=1,
                    dtype=torch.bfloat16)
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    events = estimate(graph, cluster, ParallelConfig.parse("dp=2,pp=4,mb=1,schedule=zbv"),
                      batch=16).timeline()
    assert {e[1] for e in events} == {"F", "B", "W"}
    drawn: list[list[str]] = []
    legend = timeline_plot._legend
    monkeypatch.setattr(timeline_plot, "_legend", lambda ax, chunks, kinds: (
        drawn.append(list(kinds)), legend(ax, chunks, kinds)))
    assert_png(plot_timeline(events, tmp_path / "zbv.png", title="zbv"))
    assert_png(plot_timeline([e for e in events if e[1] != "W"], tmp_path / "plain.png"))
    assert drawn == [["F", "B", "W"], ["F", "B"]]
