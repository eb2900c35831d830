"""Hand-written plans for the tiny GPT, as test data (the planner's search is not needed).

Megatron-style tensor parallelism as explicit placements over ``("dp", "tp")``: QKV and FC1
column-parallel (weight ``S(0)`` over tp), projection and FC2 row-parallel (``S(1)``), the tied
embedding vocabulary-parallel (``S(0)``), norms and position embedding replicated. Sequence
parallelism puts the LayerNorm outputs and residual sums at ``S(1)`` (sequence dim) over tp;
without it FC2's partial output is reduced to ``R`` right away.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.core.placements import PlacementMap, parse_placements
from fxplan.core.plan import Plan, StageAssignment

MODEL = "gpt-tiny:dropout=0,seq=16"
SEQ, VOCAB = 16, 512

_COLUMN = ("attn.qkv.weight", "attn.qkv.bias", "mlp.fc1.weight", "mlp.fc1.bias")
_ROW = ("attn.proj.weight", "mlp.fc2.weight")


def build_model(layers: int = 2, seed: int = 0, attention: str = "math", meta: bool = False
                ) -> torch.nn.Module:
    """The tiny GPT, seeded; ``meta``: parameters on meta (buffers real), for per-stage builds."""
    import contextlib

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.build import meta_parameters

    torch.manual_seed(seed)
    with meta_parameters() if meta else contextlib.nullcontext():
        return resolve_model(f"{MODEL},layers={layers},attention={attention}").build("cpu")


def param_placements(model: torch.nn.Module, tp: int) -> dict[str, str]:
    """Parameter → compact placement string over ``("dp", "tp")``."""
    placements = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        tp_token = "R"
        if tp > 1 and name.endswith(_COLUMN) or name in ("wte.weight", "lm_head.weight"):
            tp_token = "S(0)"
        elif tp > 1 and name.endswith(_ROW):
            tp_token = "S(1)"
        placements[name] = "R" + (tp_token if tp > 1 else "R")
    return placements


def node_placements(model: torch.nn.Module, sequence_parallel: bool) -> dict[str, str]:
    """Node → compact placement string over ``("dp", "tp")``."""
    gm = torch.fx.symbolic_trace(model, concrete_args={"targets": None})
    placements = {}
    for node in gm.graph.nodes:
        is_norm = node.op == "call_module" and str(node.target).split(".")[-1] in ("ln1", "ln2", "ln_f")
        is_residual = node.op == "call_function" and node.target is operator.add
        if sequence_parallel and (is_norm or is_residual):
            placements[node.name] = "S(0)S(1)"
        elif node.op == "call_module" and str(node.target).endswith("mlp.fc2"):
            placements[node.name] = "S(0)R"
    return placements


def stages_for(layers: int, pp: int, v: int) -> tuple[StageAssignment, ...]:
    count = pp * v
    bounds = [round(i * layers / count) for i in range(count + 1)]
    return tuple(StageAssignment(k, (bounds[k], bounds[k + 1]), has_embedding=k == 0,
                                 has_head=k == count - 1) for k in range(count))


def make_plan(*, pp: int = 1, dp: int = 1, tp: int = 1, zero: int = 0, schedule: str = "1f1b",
              microbatch_size: int = 2, num_microbatches: int = 1, sp: bool = False,
              layers: int = 2, recompute: str = "none", offload: str = "none",
              zero_stages: tuple[int, ...] | None = None,
              offload_stages: tuple[str, ...] | None = None, **extra: Any) -> Plan:
    model = build_model(layers)
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, microbatch_size=microbatch_size,
                            num_microbatches=num_microbatches, schedule=Schedule.parse(schedule),
                            zero_stage=zero, recompute=recompute, sequence_parallel=sp,
                            offload=offload, zero_stages=zero_stages,
                            offload_stages=offload_stages)
    nodes = node_placements(model, sp) if tp > 1 else {}
    placements = PlacementMap(
        nodes={name: parse_placements(text) for name, text in nodes.items()},
        params={name: parse_placements(text) for name, text in param_placements(model, tp).items()})
    return Plan(
        model=MODEL, cluster="local-cpu", graph_fingerprint="test", cluster_fingerprint="test",
        batch=dp * microbatch_size * num_microbatches, seq=SEQ, config=config,
        stages=stages_for(layers, pp, config.virtual_stages), placements=placements, **extra,
    )


def fixed_batch(plan: Plan, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (plan.batch, SEQ + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
