"""Tensor-parallel styles (``torch.distributed.tensor.parallel``) derived from a plan's
parameter placements, so that ``parallelize_module`` realises the plan on the user's module.

Each module with parameters is read from the ``tp`` entry of its planned placements
(:func:`fxplan.passes.rewrite.placements.axis_placement`, as the graph rewrite reads them):

    nn.Linear     weight S(0) (bias S(0) or none)  →  ColwiseParallel   Y_r = X · W_rᵀ  (Y sharded on
                                                                        its last dim, W_r the r-th row block)
                  weight S(1) (bias R or none)     →  RowwiseParallel   Y = Σ_r X_r · W_rᵀ  (all-reduce,
                                                                        or reduce-scatter on the sequence)
                  R                                →  nothing (replicated)
    nn.Embedding  weight S(0)  →  RowwiseParallel  vocabulary-parallel: rows outside the shard give 0,
                                                   the sum over ranks is the lookup
                  weight S(1)  →  ColwiseParallel  (output gathered)
                  R, a position embedding (``wpe``…) under sequence parallelism  →  PositionShard
                               (each tp rank its sequence shard's rows; :mod:`fxplan.runtime.styles.tp_positions`)
    nn.MultiheadAttention  in_proj_weight S(0), out_proj.weight S(1)  →  HeadParallelAttention
                  (each rank its heads' rows of q, k and v; :mod:`fxplan.runtime.styles.tp_attention`)
    fused-QKV attention (the zoo GPT's: ``qkv`` h → 3h, ``proj``, ``heads``/``hidden``):
                  qkv.weight S(0), proj.weight S(1)  →  FusedQKVAttention
                  (the same head rows of the fused Linear, local head count set on the module;
                  ``proj`` RowwiseParallel as above; :mod:`fxplan.runtime.styles.tp_fused_qkv`)
    other         every parameter R → nothing, or ``SequenceParallel`` for a leaf
                  (a norm) under sequence parallelism; anything sharded → not expressible

Inside a repeated block a column-parallel Linear's output stays local (its heads / hidden
units), and the row-parallel Linear after it reduces; outside the blocks (embedding, LM head)
outputs are gathered to ``Replicate``, so the model's output is a plain full tensor.

With sequence parallelism (``plan.sequence_parallel``) the residual stream between the
tensor-parallel regions is a DTensor sharded on the sequence dim (``Shard(1)``): the embedding
and every row-parallel Linear in a block reduce-scatter to ``Shard(1)``, norms run
``SequenceParallel``, and each child of a block that holds column-parallel Linears
(attention, MLP) gets ``PrepareModuleInput`` that all-gathers its hidden input
(``Shard(1) → Replicate``, the input found by the probe, positional or keyword) and passes it
on as the ``Replicate`` DTensor: the column-parallel Linears' input gradients then arrive as
partial sums and the gather's backward reduce-scatters them (a local tensor would have been
all-reduced, then sliced: twice the bytes); the gathered input is what autograd saves, so
the weight gradient needs no second gather.

A tied weight (one Parameter under several names) is laid out once for all its users: ``read_as``
maps each of its names to the one name whose planned placement they all take
(:func:`fxplan.runtime.apply.module_tied.tied_layout`), so the users' styles agree.

When a placement cannot be written as a style, :class:`NotExpressible` says which and why;
the runtime then falls back to the graph rewrite (:mod:`fxplan.runtime.apply.graph`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)
from torch.distributed.tensor.parallel.style import ParallelStyle

from fxplan.core.placements import format_placements
from fxplan.passes.rewrite.placements import axis_placement, normalize
from fxplan.runtime.apply.probe import ModuleProbe
from fxplan.runtime.styles.context_parallel import POSITION_EMBEDDINGS
from fxplan.runtime.styles.tp_attention import HeadParallelAttention, attention_unsupported
from fxplan.runtime.styles.tp_fused_qkv import (FusedQKVAttention, fused_qkv_unsupported,
                                         is_fused_qkv_attention)
from fxplan.runtime.styles.tp_positions import PositionShard

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["NotExpressible", "tp_styles", "tp_token"]


class NotExpressible(Exception):
    """The plan's placements are not a set of ``parallelize_module`` styles (message: why)."""


def tp_token(plan: "Plan", fqn: str, ndim: int, read_as: Mapping[str, str] | None = None) -> str:
    """The ``tp`` token of parameter ``fqn``'s planned placement (``R`` when unplanned); a tied
    weight's names read the placement of ``read_as[fqn]``."""
    planned = plan.placements.params.get((read_as or {}).get(fqn, fqn))
    if planned is None:
        return "R"
    return format_placements([normalize(axis_placement(plan, planned, "tp"), ndim)])


def _linear_kind(module: nn.Module, prefix: str, plan: "Plan",
                 read_as: Mapping[str, str] | None = None) -> str:
    """``col``, ``row`` or ``rep`` for a Linear / Embedding, or :class:`NotExpressible`."""
    weight = tp_token(plan, f"{prefix}.weight", 2, read_as)
    bias = tp_token(plan, f"{prefix}.bias", 1, read_as) \
        if getattr(module, "bias", None) is not None else None
    embedding = isinstance(module, nn.Embedding)
    if weight == "R" and bias in (None, "R"):
        return "rep"
    if weight == "S(0)" and bias in (None, "S(0)"):
        return "row" if embedding else "col"
    if weight == "S(1)" and bias in (None, "R"):
        return "col" if embedding else "row"
    raise NotExpressible(f"{type(module).__name__} {prefix!r} is planned weight {weight}, bias "
                         f"{bias}: not a column- or row-parallel layout")


def tp_styles(model: nn.Module, plan: "Plan", probe: ModuleProbe,
              read_as: Mapping[str, str] | None = None) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan for ``model`` (module docstring); raises
    :class:`NotExpressible` with the reason when there is none. ``read_as``: each name of a
    tied weight → the name whose planned placement it takes."""
    sp = plan.sequence_parallel
    styles: dict[str, ParallelStyle] = {}
    regions: set[str] = set()
    attention: list[str] = []
    fused: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{a}.") for a in attention) or \
                any(name == f"{f}.qkv" for f in fused):
            continue  # out_proj, qkv: part of the head-parallel attention's style
        if _fused_qkv_style(module, name, plan):
            styles[name] = FusedQKVAttention(_gather_input(name, probe) if sp else None)
            fused.append(name)
            continue
        if isinstance(module, nn.MultiheadAttention):
            if _attention_style(module, name, plan):
                styles[name] = HeadParallelAttention()
                attention.append(name)
                continue
        direct = [(k, p) for k, p in module._parameters.items() if p is not None]
        if not direct:
            continue
        block = probe.block_of(name)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            kind = _linear_kind(module, name, plan, read_as)
            if kind == "rep":
                if sp and block is None and _position_embedding(name, module):
                    styles[name] = PositionShard()  # its own sequence shard (tp_positions)
                    continue
                if sp and block is None:
                    raise NotExpressible(f"{name!r} is replicated over tp: with sequence "
                                         "parallelism the embedding and the head must be split "
                                         "to enter and leave the sequence-sharded stream")
                continue
            if isinstance(module, nn.Embedding):
                out = Shard(1) if sp else Replicate()
                cls = RowwiseParallel if kind == "row" else ColwiseParallel
                styles[name] = cls(input_layouts=Replicate(), output_layouts=out,
                                   use_local_output=not sp)
            elif block is None:  # outside the blocks (LM head): gather a full output
                inp = Shard(1) if sp else (Replicate() if kind == "row" else None)
                cls = ColwiseParallel if kind == "col" else RowwiseParallel
                styles[name] = cls(input_layouts=inp, output_layouts=Replicate())
            elif kind == "col":
                region = f"{block}.{name[len(block) + 1:].split('.')[0]}"
                if region == name:  # a direct child of the block gathers its own input
                    styles[name] = ColwiseParallel(input_layouts=Shard(1) if sp else None)
                else:
                    styles[name] = ColwiseParallel()
                    regions.add(region)
            else:
                styles[name] = (RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
                                if sp else RowwiseParallel())
            continue
        sharded = [k for k, p in direct if tp_token(plan, f"{name}.{k}", p.ndim, read_as) != "R"]
        if sharded:
            raise NotExpressible(f"{type(module).__name__} {name!r} has parameter(s) "
                                 f"{', '.join(sharded)} sharded over tp; only Linear and "
                                 "Embedding weights have parallel styles")
        if sp and next(module.children(), None) is None:
            styles[name] = SequenceParallel()
    if not any(isinstance(v, (ColwiseParallel, RowwiseParallel, HeadParallelAttention,
                              FusedQKVAttention)) for v in styles.values()):
        return {}  # nothing is split over tp: every rank runs the whole module
    if sp:
        for region in sorted(regions):
            styles[region] = _gather_input(region, probe)
        _check_sequence_parallel(model, probe, styles)
    return styles


def _position_embedding(name: str, module: nn.Module) -> bool:
    """A learned position embedding (an ``nn.Embedding`` named as in
    :data:`~fxplan.runtime.styles.context_parallel.POSITION_EMBEDDINGS`)."""
    return isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_EMBEDDINGS


def _attention_style(module: nn.MultiheadAttention, prefix: str, plan: "Plan") -> bool:
    """Whether ``module`` is planned head-parallel (``in_proj_weight`` ``S(0)``, ``out_proj``
    ``S(1)``); ``False`` when replicated; :class:`NotExpressible` for any other layout."""
    out = module.out_proj
    tokens = {"in_proj_weight": tp_token(plan, f"{prefix}.in_proj_weight", 2)
              if module.in_proj_weight is not None else None,
              "in_proj_bias": tp_token(plan, f"{prefix}.in_proj_bias", 1)
              if module.in_proj_bias is not None else None,
              "out_proj.weight": tp_token(plan, f"{prefix}.out_proj.weight", 2),
              "out_proj.bias": tp_token(plan, f"{prefix}.out_proj.bias", 1)
              if out.bias is not None else None}
    if module.in_proj_weight is None:
        return False  # separate q/k/v_proj_weight parameters: the generic check below applies
    if all(t in (None, "R") for t in tokens.values()):
        return False
    wanted = {"in_proj_weight": "S(0)", "in_proj_bias": "S(0)", "out_proj.weight": "S(1)",
              "out_proj.bias": "R"}
    layout = ", ".join(f"{k} {v}" for k, v in tokens.items() if v is not None)
    if any(v is not None and v != wanted[k] for k, v in tokens.items()):
        raise NotExpressible(f"nn.MultiheadAttention {prefix!r} is planned {layout}: not the "
                             "head-parallel layout (in_proj S(0), out_proj.weight S(1))")
    reason = attention_unsupported(module, plan.tp)
    if reason:
        raise NotExpressible(f"nn.MultiheadAttention {prefix!r} cannot run head-parallel: "
                             f"{reason}")
    return True


def _fused_qkv_style(module: nn.Module, prefix: str, plan: "Plan") -> bool:
    """Whether ``module`` is a fused-QKV attention planned head-parallel (``qkv.weight``
    ``S(0)``, ``qkv.bias`` ``S(0)``/``R``, ``proj.weight`` ``S(1)``, ``proj.bias`` ``R``);
    :class:`NotExpressible` when its heads do not divide over tp."""
    if not is_fused_qkv_attention(module):
        return False
    tokens = {"qkv.weight": tp_token(plan, f"{prefix}.qkv.weight", 2),
              "qkv.bias": tp_token(plan, f"{prefix}.qkv.bias", 1)
              if module.qkv.bias is not None else "S(0)",
              "proj.weight": tp_token(plan, f"{prefix}.proj.weight", 2),
              "proj.bias": tp_token(plan, f"{prefix}.proj.bias", 1)
              if module.proj.bias is not None else "R"}
    if not (tokens["qkv.weight"] == "S(0)" and tokens["qkv.bias"] in ("S(0)", "R")
            and tokens["proj.weight"] == "S(1)" and tokens["proj.bias"] == "R"):
        return False  # replicated, or another layout: the Linears' own styles decide
    reason = fused_qkv_unsupported(module, plan.tp)
    if reason:
        raise NotExpressible(f"{type(module).__name__} {prefix!r} cannot run head-parallel: "
                             f"{reason}")
    return True


def _check_sequence_parallel(model: nn.Module, probe: ModuleProbe,
                             styles: dict[str, ParallelStyle]) -> None:
    """Under sequence parallelism every block child with parameters must take the sequence-
    sharded residual stream: a tp region (gathers it), a norm (``SequenceParallel``) or a
    parallel Linear; anything else would mix plain parameters with sharded DTensors."""
    for block in probe.blocks:
        for key, child in model.get_submodule(block).named_children():
            name = f"{block}.{key}"
            if name in styles or next(child.parameters(), None) is None:
                continue
            raise NotExpressible(f"with sequence parallelism {type(child).__name__} {name!r} "
                                 "holds replicated parameters outside any tensor-parallel "
                                 "region: its sequence-sharded input has no style to gather it")


def _gather_input(region: str, probe: ModuleProbe) -> PrepareModuleInput:
    """All-gather the hidden input of ``region`` from the sequence shards."""
    call = probe.calls.get(region)
    if call is None or (not call.positional and not call.keywords):
        raise NotExpressible(f"{region!r} (holds column-parallel Linears) takes no floating-"
                             "point input to gather from the sequence shards")
    if call.positional:
        first = call.positional[0]
        layouts = tuple(Shard(1) if i == first else None for i in range(call.num_args))
        desired = tuple(Replicate() if i == first else None for i in range(call.num_args))
        return PrepareModuleInput(input_layouts=layouts, desired_input_layouts=desired,
                                  use_local_output=False)
    key = call.keywords[0]
    return PrepareModuleInput(input_kwarg_layouts={key: Shard(1)},
                              desired_input_kwarg_layouts={key: Replicate()},
                              use_local_output=False)
