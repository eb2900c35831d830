"""The predicted step as a Chrome / Perfetto trace (JSON trace-event format).

Open the file in ``chrome://tracing`` or https://ui.perfetto.dev (it loads locally, nothing
is uploaded). One process per pipeline rank ``s`` (``pid = s``), one thread per lane:

====  ====================  ==============================================================
tid   lane                  events
====  ====================  ==============================================================
0     compute               each forward/backward op's compute (recompute included)
1     tp comm (exposed)     its exposed tensor-parallel communication
2     zero comm (exposed)   its exposed ZeRO-3 parameter gathers / gradient scatters
3     p2p send              its blocking send of the activation / gradient to the next rank
4     dp grad sync          each data-parallel gradient-bucket reduction on the comm stream,
                            then the post-backward sync (tied embeddings, ZeRO-1/2 gather)
5     optimizer             the optimizer step
====  ====================  ==============================================================

Everything comes from the cost model's step simulation
(:attr:`cost_model.step.estimate.Estimate.simulation`), nothing is simulated again: an op of
stage ``s``, chunk ``c`` runs from ``start`` to ``end`` of the simulated pipeline timeline,
and its duration ``end − start = Σ_k costs[k, s, c]`` over the components
(:data:`cost_model.step.simulator.COMPONENTS`) is drawn as consecutive slices, compute first, send
last (the simulator prices exposed time, not when inside the op it is exposed). After the
stage's last op come the exposed gradient sync, the post-backward sync and the optimizer, so
the last event of stage ``s`` ends at the simulated ``T_s`` and the latest of all at the
step time ``T = max_s T_s``. Times are µs (``ts``/``dur`` of ``"X"`` events).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cost_model.step.estimate import Estimate

__all__ = ["LANES", "predicted_trace", "write_trace"]

#: Lane names by tid.
LANES: tuple[str, ...] = ("compute", "tp comm (exposed)", "zero comm (exposed)", "p2p send",
                          "dp grad sync", "optimizer")
_US = 1e6


def _event(name: str, pid: int, tid: int, start_s: float, dur_s: float, **args: Any) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * _US,
            "dur": dur_s * _US, "cat": LANES[tid], "args": args}


def _metadata(stages: int, ranks: list[str]) -> list[dict]:
    events: list[dict] = []
    for s in range(stages):
        events.append({"name": "process_name", "ph": "M", "pid": s,
                       "args": {"name": f"pipeline rank {s} ({ranks[s]})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": s,
                       "args": {"sort_index": s}})
        for tid, lane in enumerate(LANES):
            events.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid,
                           "args": {"name": lane}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": tid,
                           "args": {"sort_index": tid}})
    return events


def _op_parts(costs: Any, kind: int, stage: int, chunk: int, split: bool) -> Any:
    """The component seconds of one op: the forward's, the backward's (less its weight
    gradient under a split backward) or, for a split backward's ``W``, that weight-gradient
    compute alone."""
    if kind == 0:
        return costs.forward[:, stage, chunk]
    weight = 0.0 if costs.weight is None or not split else float(costs.weight[stage, chunk])
    parts = costs.backward[:, stage, chunk].copy()
    if kind == 2:
        parts[:] = 0.0
        parts[0] = weight
    else:
        parts[0] -= weight
    return parts


def predicted_trace(result: Estimate, *, title: str = "") -> dict[str, Any]:
    """The trace-event JSON object of ``result`` (module docstring)."""
    from fxplan.cost_model.step.simulator import COMPONENTS, FORWARD

    if result.stage_plan is None:
        raise ValueError("the estimate carries no stage costs (cost_model.estimate sets them)")
    sim, costs = result.simulation, result.stage_plan.costs
    timeline = sim.timeline
    order = timeline.order
    p = order.stages
    config = result.config
    ranks = [f"ranks {s * config.dp * config.tp}…{(s + 1) * config.dp * config.tp - 1}"
             if config.dp * config.tp > 1 else f"rank {s}" for s in range(p)]
    events = _metadata(p, ranks)
    for s in range(p):
        for k in range(order.ops_per_stage):
            kind, c = int(order.kind[s, k]), int(order.chunk[s, k])
            mb = int(order.microbatch[s, k])
            parts = _op_parts(costs, kind, s, c, order.split_backward)
            letter = "FBW"[kind]
            at = float(timeline.start[s, k])
            for tid, (component, seconds) in enumerate(zip(COMPONENTS, parts.tolist())):
                if seconds > 0:
                    name = letter + str(mb) if component == "compute" else f"{letter}{mb} {component}"
                    events.append(_event(name, s, tid, at, seconds, microbatch=mb, chunk=c,
                                         op=("forward", "backward", "weight-gradient")[kind]))
                at += seconds
        for i, (begin, end) in enumerate(sim.dp_transfers[s] if sim.dp_transfers else ()):
            events.append(_event(f"grad bucket {i}", s, 4, begin, end - begin,
                                 exposed_s=max(0.0, end - max(begin, float(timeline.stage_end[s])))))
        at = float(timeline.stage_end[s] + sim.exposed_dp[s])
        if costs.post[s] > 0:
            events.append(_event("post-backward sync", s, 4, at, float(costs.post[s])))
        at += float(costs.post[s])
        if costs.optimizer[s] > 0:
            events.append(_event("optimizer step", s, 5, at, float(costs.optimizer[s])))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "fxplan cost model (predicted)", "title": title,
                          "plan": config.summary(), "step_time_s": result.step_time_s,
                          "stage_time_s": list(result.stage_time_s),
                          "breakdown_s": dict(result.breakdown)}}


def write_trace(trace: dict[str, Any], path: str | Path) -> Path:
    """Write ``trace`` as JSON to ``path`` (parents created) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace))
    return out
