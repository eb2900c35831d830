"""``fxplan report plan.json --html out.html``: the plan as one self-contained web page.

The page needs nothing from the network: the plots (:mod:`fxplan.report.plots`, the same figures
``--plot`` writes) are embedded as base64 PNG ``data:`` URIs, the style sheet is inline and the
only script is a short inline self-check that writes, into ``#selfcheck``, how many of the
page's images decoded (``naturalWidth > 0``) — the browser test reads it back. All text from
the plan (model specs, reasons, fallbacks) goes through :func:`html.escape`.

Sections: the summary (model, cluster, degrees, schedule, predicted step time, throughput,
MFU, memory), the step's breakdown, memory per pipeline stage against the capacity of the
stage's devices (a plot and a table, with the device group of each stage), the pipeline
timeline (its steady state cut out when there are many microbatches,
:func:`report.timeline_plot.compress_events`) and each stage's busy share, per-layer
placements and costs, the runners-up, the pruning reasons grouped by kind
(:func:`fxplan.report.pruning.group_pruned`), the fallbacks and the search.
"""

from __future__ import annotations

import base64
import html
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from fxplan.report.terminal import (capacity_text, context_line, headroom_text, mesh_levels,
                                    offload_line, offload_stage_line, recompute_line,
                                    stage_recompute, zero_line)

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.cost_model.step.estimate import Estimate
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["render_html", "write_html"]

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:18px} .card span{color:#666;font-size:12px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
th,td{border:1px solid #e2e2e2;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td.l,th.l{text-align:left;white-space:normal}
img{max-width:min(100%,1000px);height:auto;background:#fff;border:1px solid #e2e2e2;border-radius:6px}
.bad{color:#c44e52;font-weight:600} .ok{color:#2e7d32;font-weight:600}
details{margin:4px 0} summary{cursor:pointer} li{margin:2px 0}
.scroll{max-height:460px;overflow:auto;display:inline-block;max-width:100%}
code{font:12px ui-monospace,Menlo,monospace} #selfcheck{color:#888;font-size:12px}
"""

_SELFCHECK = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  var el = document.getElementById('selfcheck');
  el.textContent = 'self-check: ' + ok.length + ' of ' + imgs.length + ' images decoded';
  el.setAttribute('data-images', String(imgs.length));
  el.setAttribute('data-decoded', String(ok.length));
  el.setAttribute('data-widths', ok.map(function (i) { return i.naturalWidth; }).join(','));
});
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _time(seconds: float | None) -> str:
    """``12.3 ms``: three significant digits in µs, ms or s."""
    from fxplan.core.units import time_unit

    if seconds is None:
        return "–"
    if seconds == 0:
        return "0"
    scale, unit = time_unit(abs(seconds))
    value = seconds * scale
    return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"


def _gib(value: float | None) -> str:
    """GiB for people: ``0.502 GiB`` → ``514 MiB``, ``226 KiB``, ``79.1 GiB``."""
    from fxplan.core.units import binary_bytes

    return "–" if value is None else binary_bytes(value * 2 ** 30)


def _bytes(value: float) -> str:
    from fxplan.core.units import binary_bytes

    return binary_bytes(value) if value else "0"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.3g} %"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; the first ``left`` columns left-aligned; every cell escaped."""
    head = "".join(f"<th class='l'>{_e(h)}</th>" if i < left else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td class='l'>{_e(c)}</td>" if i < left else
                                    f"<td>{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{data}'>"


def _card(value: str, label: str, css: str = "") -> str:
    return f"<div class='card'><b class='{css}'>{_e(value)}</b><span>{_e(label)}</span></div>"


def _summary(plan: Plan, result: Estimate) -> str:
    est = plan.estimate
    rate = (f"{est['tokens_per_s']:,.0f} tokens/s" if est.get("tokens_per_s") is not None
            else f"{est.get('samples_per_s', 0):,.1f} samples/s")
    fits = bool(est.get("fits"))
    cards = [
        _card(_time(est.get("step_time_s")), "predicted step time"),
        _card(rate, "throughput"),
        _card(_pct(est.get("mfu")), "MFU (model FLOPs ÷ peak, recompute not counted)"
              if len(est.get("precision_per_group") or {}) < 2 else
              "MFU (model FLOPs ÷ Σ each device's own peak, recompute not counted)"),
        _card(f"{est.get('tflops_per_device', 0):.3g} TFLOP/s",
              "hardware FLOP/s per device (counts recompute)"),
        _card(f"{_gib(est.get('max_memory_gib'))} of {capacity_text(plan)}",
              "peak memory per device", "" if fits else "bad"),
        _card("fits" if fits else "does NOT fit", "memory", "ok" if fits else "bad"),
    ]

    rows = [("plan", plan.summary), ("degrees", ", ".join(f"{k}={v}" for k, v in plan.degrees.items())),
            ("mesh levels", mesh_levels(plan)),
            ("ZeRO stage", plan.config.zero_text + (f" — per stage: {zero_line(plan)}"
                                                   if plan.config.zero_stages else "")),
            ("offload", (offload_line(plan) or "none")
             + (f" — per stage: {offload_stage_line(plan)}" if plan.config.offload_stages
                else "")),
            ("fp8", "on" if plan.config.fp8 else "off"), ("schedule", plan.schedule),
            ("microbatches", f"{plan.num_microbatches} × {plan.microbatch_size} samples"),
            ("recompute", plan.recompute_summary + (f" — per stage: {recompute_line(plan)}"
                                                    if stage_recompute(plan) else "")),
            ("sequence parallel", "on" if plan.sequence_parallel else "off"),
            ("context parallel", context_line(plan) if plan.config.cp > 1 else "off"),
            ("stages (layers)", " / ".join(str(s.num_layers) for s in plan.stages)),
            ("critical stage", result.critical_stage)]
    breakdown = [(k, _time(v), _pct(v / result.step_time_s)) for k, v in result.breakdown.items()]
    return ("<section id='summary'><h2>Summary</h2><div class='cards'>" + "".join(cards)
            + "</div>" + _table(("", "value"), rows, left=2)
            + "<h3>step time on the critical stage</h3>"
            + _table(("part", "time", "share"), breakdown) + "</section>")


def _memory(plan: Plan, result: Estimate, png: Path) -> str:
    from fxplan.cost_model.memory.breakdown import MEMORY_LEGEND, MEMORY_ROWS, state_layout_text

    devices = result.stage_plan.devices if result.stage_plan is not None else ()
    rows = []
    for s, m in enumerate(result.memory):
        g = m.to_gib()
        group = devices[s].name if s < len(devices) else "–"
        rows.append((s, group, *(_gib(g[k]) for k in (*MEMORY_ROWS, "total", "capacity",
                                                      "free")),
                     f"{100 * g['total'] / g['capacity']:.0f} %"))
    hetero = len({d.name for d in devices}) > 1
    note = ("<p>The cluster is heterogeneous: each stage is measured against the capacity of "
            "its own device group.</p>" if hetero else "")
    return ("<section id='memory'><h2>Memory per pipeline stage (per device)</h2>" + note
            + _img(png, "peak memory per stage against capacity")
            + f"<p>Memory {_e(headroom_text(result.to_dict()))}. {_e(MEMORY_LEGEND)}; "
            f"{_e(state_layout_text(result.state_layout))}.</p>"
            + _table(("stage", "device group", *MEMORY_ROWS.values(), "total", "capacity",
                      "free", "use"), rows, left=2) + "</section>")


def _timeline(plan: Plan, result: Estimate, png: Path) -> str:
    sim = result.simulation
    rows = [(s, _time(float(sim.timeline.busy[s])), _time(float(sim.timeline.stage_end[s])),
             _pct(float(sim.timeline.busy[s] / sim.timeline.makespan)), _time(float(sim.exposed_dp[s])),
             _time(float(sim.stage_time[s])))
            for s in range(sim.timeline.order.stages)]
    return ("<section id='timeline'><h2>Pipeline timeline</h2>"
            f"<p>{_e(plan.schedule)} with {plan.num_microbatches} microbatches per step; with "
            "many microbatches the steady state is cut out (hatched band) and the first and last "
            "few are drawn.</p>" + _img(png, "pipeline timeline")
            + _table(("stage", "busy", "pipeline end", "busy share", "exposed dp sync",
                      "stage step time"), rows) + "</section>")


def _placement_summary(names: Sequence[str], plan: Plan) -> str:
    from fxplan.core.placements import format_placements

    counts = Counter(format_placements(plan.placements.nodes[n]) for n in names
                     if n in plan.placements.nodes)
    return ", ".join(f"{p} ×{k}" for p, k in counts.most_common(4)) + \
        (f", … {len(counts) - 4} more" if len(counts) > 4 else "") if counts else "replicated (no tp)"


def _layers(plan: Plan, result: Estimate, graph: CapturedGraph) -> str:
    from fxplan.core.units import count
    from fxplan.cost_model.step.layer_costs import graph_segments

    if result.stage_plan is None:
        return ""
    segments = graph_segments(graph)
    nodes = {"pre": segments.pre, "post": segments.post,
             **{f"layer {i}": names for i, (_, names) in enumerate(segments.layers)}}
    p = plan.pp
    rows = []
    for st in plan.stages:
        segs = result.stage_plan.chunks[st.index % p][st.index // p]
        labels = (["pre"] if st.has_embedding else []) + [f"layer {i}" for i in range(*st.layers)] \
            + (["post"] if st.has_head else [])
        for label, seg in zip(labels, segs):
            tp_bytes = sum(b for _, b in seg.tp_forward) + sum(b for _, b in seg.tp_backward)
            recompute = plan.recompute(int(label.split()[1])) if label.startswith("layer") else "–"
            rows.append((label, st.index, st.index % p, st.index // p, _time(seg.forward_s),
                         _time(seg.backward_s), _time(seg.recompute_s) if seg.recompute_s else "–",
                         recompute, len(seg.tp_forward) + len(seg.tp_backward),
                         _bytes(tp_bytes), count(seg.param_count),
                         _placement_summary(nodes.get(label, ()), plan)))
    header = ("segment", "virtual stage", "pp rank", "chunk", "forward", "backward", "recompute",
              "recompute policy", "tp collectives", "tp bytes", "params per rank",
              "placements (node outputs over " + ",".join(plan.placements.axes) + ")")
    return ("<section id='layers'><h2>Per-layer placements and costs</h2><p>Per microbatch and "
            "per tensor-parallel rank.</p><div class='scroll'>" + _table(header, rows)
            + "</div></section>")


def _runners_up(plan: Plan) -> str:
    est = plan.estimate
    rows = [(f"{plan.summary} (chosen)", _time(est.get("step_time_s")), "–", _pct(est.get("mfu")),
             _gib(est.get("max_memory_gib")))]
    for r in plan.runners_up:
        rows.append((r["summary"], _time(r["step_time_s"]),
                     f"+{_time(r['delta_s'])} (+{r['delta_pct']:.3g} %)", _pct(r["mfu"]),
                     _gib(r["peak_memory_gib"])))
    return ("<section id='runners-up'><h2>Runners-up</h2>"
            + _table(("configuration", "step time", "Δ", "MFU", "peak memory"), rows)
            + "</section>")


def _pruned(plan: Plan) -> str:
    from fxplan.report.pruning import group_pruned

    groups = group_pruned(plan)
    if not groups:
        return "<section id='pruned'><h2>Pruned</h2><p>Nothing was pruned.</p></section>"
    parts = []
    for i, g in enumerate(groups):
        items = "".join(f"<li>{_e(r)}</li>" for r in g.reasons)
        parts.append(f"<details{' open' if i == 0 else ''}><summary><b>{_e(g.kind)}</b> "
                     f"({len(g.reasons)})</summary><ul>{items}</ul></details>")
    return (f"<section id='pruned'><h2>Pruned ({len(plan.pruned)} reasons)</h2>"
            "<p>Grouped by kind, the closest candidates first.</p>" + "".join(parts) + "</section>")


def _fallbacks_and_search(plan: Plan) -> str:
    fall = ("".join(f"<li>{_e(f)}</li>" for f in plan.fallbacks) if plan.fallbacks
            else "<li>none</li>")
    timings = ", ".join(f"{k} {v:.3g} s" for k, v in plan.timings.items())
    solver = f"{plan.solver.backend}: {plan.solver.status}" + (
        f", gap {plan.solver.gap:.2%}" if plan.solver.gap else "")
    return (f"<section id='fallbacks'><h2>Fallbacks</h2><ul>{fall}</ul></section>"
            f"<section id='search'><h2>Search</h2><p>{plan.search_time_s:.3g} s "
            f"({_e(timings)}); {_e(plan.estimate.get('candidates_visited', '?'))} candidates "
            f"ranked; solver {_e(solver)}.</p></section>")


def render_html(plan: Plan, graph: CapturedGraph, result: Estimate) -> str:
    """The page (module docstring) as a string; ``result`` is the plan's estimate
    (:func:`fxplan.plan_context.simulate_plan`)."""
    from fxplan.report.plots import plan_title, plot_simulation

    with tempfile.TemporaryDirectory(prefix="fxplan-report-") as tmp:
        timeline_png, memory_png = plot_simulation(result, Path(tmp) / "plan", plan_title(plan))
        body = (_summary(plan, result) + _memory(plan, result, memory_png)
                + _timeline(plan, result, timeline_png) + _layers(plan, result, graph)
                + _runners_up(plan) + _pruned(plan) + _fallbacks_and_search(plan))
    seq = f" × seq {plan.seq}" if plan.seq else ""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>fxplan · {_e(plan.summary)}</title><style>{_STYLE}</style></head><body><main>"
            f"<h1>{_e(plan.model)} on {_e(plan.cluster)}</h1>"
            f"<p class='sub'>{plan.world_size} devices · batch {plan.batch}{_e(seq)} · plan "
            f"<code>{_e(plan.summary)}</code></p>{body}"
            f"<p id='selfcheck'>self-check did not run</p></main>"
            f"<script>{_SELFCHECK}</script></body></html>")


def write_html(plan: Plan, graph: CapturedGraph, result: Estimate, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path`` and return the path."""
    out = Path(path)
    out.write_text(render_html(plan, graph, result), encoding="utf-8")
    return out
