"""What differs between two plans: configuration, stages, placements, prediction.

:func:`diff_plans` compares two :class:`~fxplan.core.plan.Plan` values field by field:

* provenance: model, cluster, global batch, sequence length (and whether the graph and the
  cluster fingerprints agree);
* configuration: the degrees ``pp, dp, tp``, the link level each mesh axis runs over, the
  schedule, microbatch size and count, ZeRO stage, recompute, sequence parallelism;
* stages: the layer range ``[start, stop)`` of every virtual stage;
* placements, summarised: each differing entry's name with its layer numbers replaced by
  ``*`` (``layers_*_attention_wq``), so the repeated blocks of a 100-layer model fold into one
  row; rows are ``(kind, pattern, placement in a, placement in b)`` with a count, most frequent
  first (kinds: node outputs, consumer inputs, parameters);
* prediction: step time, MFU, TFLOP/s per device, peak memory (the heaviest rank and every
  pipeline rank), capacity and whether it fits,
  with ``b − a``.

Two plans with no difference in any of these are ``identical``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fxplan.core.plan import Plan

__all__ = ["PlanDiff", "diff_plans", "layer_pattern"]

_LAYER_INDEX = re.compile(r"(?<=[._])\d+(?=[._]|$)")
#: Prediction keys of ``Plan.estimate`` compared, in print order.
PREDICTED = ("step_time_s", "mfu", "tflops_per_device", "max_memory_gib", "peak_memory_gib",
             "capacity_gib", "fits")


def layer_pattern(name: str) -> str:
    """``layers.12.attention.wq.weight`` → ``layers.*.attention.wq.weight``; the same for
    ``h_3_attn`` (fx node names): every dotted or underscored integer becomes ``*``."""
    return _LAYER_INDEX.sub("*", name)


@dataclass
class PlanDiff:
    """The differences of plan ``b`` from plan ``a`` (module docstring)."""

    fields: list[tuple[str, Any, Any]] = field(default_factory=list)
    stages: tuple[list[list[int]], list[list[int]]] | None = None
    placements: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    placement_counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    predicted: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.fields or self.stages or self.placements or self.predicted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "fields": [{"field": k, "a": a, "b": b} for k, a, b in self.fields],
            "stages": None if self.stages is None else {"a": self.stages[0],
                                                        "b": self.stages[1]},
            "placements": {
                "differing": {k: {"count": n, "of": total}
                              for k, (n, total) in self.placement_counts.items()},
                "by_pattern": [{"kind": k, "pattern": p, "a": a, "b": b, "count": n}
                               for k, p, a, b, n in self.placements]},
            "predicted": [{"key": k, "a": a, "b": b,
                           **({"delta": b - a} if _numbers(a, b) else {})}
                          for k, a, b in self.predicted],
        }


def _numbers(a: Any, b: Any) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))


def _config_fields(plan: Plan) -> dict[str, Any]:
    return {"model": plan.model, "cluster": plan.cluster, "batch": plan.batch, "seq": plan.seq,
            "graph fingerprint": plan.graph_fingerprint[:12],
            "cluster fingerprint": plan.cluster_fingerprint[:12],
            "pp": plan.pp, "dp": plan.dp, "tp": plan.tp,
            "axis levels": "/".join(plan.axis_levels),
            "schedule": str(plan.schedule), "microbatch size": plan.microbatch_size,
            "microbatches": plan.num_microbatches, "zero": plan.zero_stage,
            "offload": plan.config.offload_text, "fp8": "on" if plan.config.fp8 else "off",
            "cp": plan.config.cp, "ep": plan.config.ep,
            "recompute": plan.recompute_summary,
            "sequence parallel": "on" if plan.sequence_parallel else "off",
            "layout priced": plan.estimate.get("layout", "megatron-default")}


def _entries(plan: Plan) -> dict[str, dict[str, str]]:
    """Placements by kind as ``name → text`` (inputs named ``consumer ← producer``)."""
    data = plan.placements.to_json()
    return {"node outputs": dict(data.get("nodes", {})),
            "consumer inputs": {f"{e['consumer']} ← {e['producer']}": e["placements"]
                                for e in data.get("inputs", [])},
            "parameters": dict(data.get("params", {}))}


def _placement_rows(a: Plan, b: Plan) -> tuple[list[tuple[str, str, str, str, int]],
                                               dict[str, tuple[int, int]]]:
    rows: Counter[tuple[str, str, str, str]] = Counter()
    counts: dict[str, tuple[int, int]] = {}
    ea, eb = _entries(a), _entries(b)
    for kind in ea:
        names = set(ea[kind]) | set(eb[kind])
        differing = [n for n in names if ea[kind].get(n) != eb[kind].get(n)]
        if differing:
            counts[kind] = (len(differing), len(names))
        for name in differing:
            rows[(kind, layer_pattern(name), ea[kind].get(name, "(default)"),
                  eb[kind].get(name, "(default)"))] += 1
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(*key, n) for key, n in ordered], counts


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    """What differs from ``a`` to ``b`` (module docstring)."""
    out = PlanDiff()
    fa, fb = _config_fields(a), _config_fields(b)
    out.fields = [(k, fa[k], fb[k]) for k in fa if fa[k] != fb[k]]
    sa = [list(s.layers) for s in a.stages]
    sb = [list(s.layers) for s in b.stages]
    if sa != sb:
        out.stages = (sa, sb)
    out.placements, out.placement_counts = _placement_rows(a, b)
    for key in PREDICTED:
        va, vb = a.estimate.get(key), b.estimate.get(key)
        if va != vb:
            out.predicted.append((key, va, vb))
    return out
