"""Print the program a plan emits: readable fx code with placements annotated.

``emit_program(module, plan)`` accepts the model itself, its flat fx graph, or an already
outlined/staged module, and returns Python-like source text:

    # fxplan program — pp=2 dp=1 tp=2 | zero=0 | 1f1b mb=2×2 | recompute=none | sp=on
    # mesh pp×dp×tp = 2×1×2, tp fastest; stage k runs on pipeline rank k mod pp
    # stage 0 (pp rank 0): embed, layer_0
    # parameters (placements over dp,tp):
    #   wte.weight [512, 64]  RS(0)
    def embed(self, tokens):
        ...
        add = wte + wpe                          # planned RS(1)

Each line assigning a node that the plan places carries ``# planned <placement>``; blocks after
the first print only when their code differs from ``layer_0``'s (modulo the block index).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from torch import fx, nn

from fxplan.core.placements import format_placements
from fxplan.passes.rewrite.layers import OutlineLayers
from fxplan.passes.rewrite.stages import StagedProgram
from fxplan.passes.tracer import trace_model

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["emit_program"]

_ASSIGN = re.compile(r"^(\s+)(\w+) = ")


def _annotate(code: str, plan: "Plan") -> str:
    lines = []
    for line in code.strip("\n").splitlines():
        match = _ASSIGN.match(line)
        placement = plan.placements.nodes.get(match.group(2)) if match else None
        if placement is not None:
            statement = line.split(";")[0]
            line = f"{statement:<72} # planned {format_placements(placement)}"
        lines.append(line)
    return "\n".join(lines)


def _signature(gm: fx.GraphModule) -> tuple:
    """The block's ops with indices erased: equal for blocks that run the same code."""
    return tuple((n.op, re.sub(r"\d+", "N", str(n.target))) for n in gm.graph.nodes
                 if n.op != "placeholder")


def _outlined(module: nn.Module, plan: "Plan") -> nn.Module:
    if isinstance(module, (StagedProgram, fx.GraphModule)) and not isinstance(module, StagedProgram):
        gm = module
    elif isinstance(module, StagedProgram):
        return module
    else:
        gm = trace_model(module, 1)
    return OutlineLayers()(gm, plan).module


def _stage_lines(plan: "Plan") -> list[str]:
    lines = []
    for stage in plan.stages:
        parts = (["embed"] if stage.has_embedding else []) + [
            f"layer_{i}" for i in range(*stage.layers)] + (["head"] if stage.has_head else [])
        rank = plan.schedule.placement(stage.index, plan.pp)[0]
        lines.append(f"# stage {stage.index} (pp rank {rank}): {', '.join(parts)}")
    return lines


def _param_lines(module: nn.Module, plan: "Plan") -> list[str]:
    axes = ",".join(plan.placements.axes)
    lines = [f"# parameters (placements over {axes}; unlisted: replicated):"]
    names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    seen = set()
    for name, placement in plan.placements.params.items():
        if name not in seen:
            lines.append(f"#   {name:<36} {format_placements(placement)}")
            seen.add(name)
    if not plan.placements.params:
        lines += [f"#   {n}" for n in sorted(set(names.values()))]
    return lines


def emit_program(module: nn.Module, plan: "Plan") -> str:
    """The transformed program as text (see the module docstring)."""
    program = _outlined(module, plan)
    header = [
        f"# fxplan program — {plan.summary}",
        f"# mesh {'×'.join(plan.mesh_axes)} = {'×'.join(map(str, plan.mesh_shape))}, "
        f"{plan.mesh_axes[-1]} fastest; stage k runs on pipeline rank k mod pp",
        *_stage_lines(plan),
        *_param_lines(module, plan),
        "",
    ]
    body: list[str] = []
    first_block: tuple | None = None
    graphs = [(name or "program", m) for name, m in program.named_modules()
              if isinstance(m, fx.GraphModule)]
    for name, gm in graphs:
        code = _annotate(gm.code, plan)
        short = name.rsplit(".", 1)[-1]
        if short.startswith("layer_"):
            signature = _signature(gm)
            if first_block is None:
                first_block = signature
            elif signature == first_block:
                body.append(f"# {name}: same code as the first block (its own parameters)\n")
                continue
        body.append(f"# ---- {name} ----")
        body.append(code.replace("def forward(self", f"def {short}(self", 1))
        body.append("")
    return "\n".join(header + body)
