"""Strategies of one fx node on a mesh: the entry point of :mod:`fxplan.sharding`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.fx

from fxplan.sharding.context import OpContext, constant_args, make_context, tensor_shape
from fxplan.sharding.dtensor_rules import dtensor_options
from fxplan.sharding.expand import expand_options
from fxplan.sharding.registry import find_rule, replicate_fallback
from fxplan.sharding.strategy import OpStrategy

__all__ = ["NodeStrategies", "node_strategies", "is_tensor_node", "same_role", "describe", "describe_module", "rule_sources"]

#: Rule name prefix of the options read from DTensor.
DTENSOR_PREFIX = "dtensor:"


@dataclass
class NodeStrategies:
    """The candidate strategies of ``ctx.node``; ``rule`` names the rule used (a decorator
    rule's function name, ``"dtensor:<overload>"`` for an ATen op whose options come from
    DTensor's registered strategy, :mod:`fxplan.sharding.dtensor_rules`), ``fallback`` is
    true when neither matched and every tensor is replicated."""

    ctx: OpContext
    strategies: list[OpStrategy]
    rule: str
    follows: bool
    fallback: bool

    @property
    def name(self) -> str:
        return self.ctx.node.name

    @property
    def source(self) -> str:
        """``"rule"`` (a decorator rule), ``"dtensor"`` or ``"fallback"``."""
        return "fallback" if self.fallback else "dtensor" if self.rule.startswith(DTENSOR_PREFIX) else "rule"


def is_tensor_node(node: torch.fx.Node) -> bool:
    """Whether the node yields tensors (one, or several of the same rank): the nodes that
    get a placement. ``x.size(1)``, ``output`` and non-tensor values do not."""
    if node.op == "output":
        return False
    shape = node.meta["fxplan"].shape
    if tensor_shape(shape) is not None:
        return True
    return isinstance(shape, tuple) and bool(shape) and all(tensor_shape(s) is not None for s in shape)


def same_role(like: OpContext, ctx: OpContext) -> bool:
    """Whether two nodes get the same options on every mesh: the same op, operand shapes,
    output shape and constant arguments (as in two layers of a repeated block)."""
    return like.op == ctx.op and like.shapes == ctx.shapes and like.out == ctx.out \
        and constant_args(like.node) == constant_args(ctx.node)


def node_strategies(gm: torch.fx.GraphModule, node: torch.fx.Node, mesh_shape: Sequence[int],
                    like: Optional[NodeStrategies] = None,
                    ctx: Optional[OpContext] = None) -> Optional[NodeStrategies]:
    """All valid strategies of ``node`` on a mesh of ``mesh_shape``; ``None`` for a node that
    is not a tensor. ``like``: a node of the same role (:func:`same_role`), whose strategy
    list is then shared instead of derived again; ``ctx``: the node's context when the caller
    made it already (it does not depend on the mesh)."""
    if ctx is None:
        if not is_tensor_node(node):
            return None
        ctx = make_context(gm, node)
    if like is not None and same_role(like.ctx, ctx):
        return NodeStrategies(ctx, like.strategies, like.rule, like.follows, like.fallback)
    rule = find_rule(ctx.op)
    derived = dtensor_options(ctx) if rule is None else None
    if rule is not None:
        options, name = rule.fn(ctx), rule.name
    elif derived is not None:
        options, name = derived, f"{DTENSOR_PREFIX}{ctx.node.target}"
    else:
        options, name = replicate_fallback(ctx), "replicate_fallback"
    strategies = expand_options(options, mesh_shape, ctx.shapes, ctx.out)
    if not strategies:  # nothing divides: replicate everything (always valid)
        strategies = expand_options(replicate_fallback(ctx), mesh_shape, ctx.shapes, ctx.out)
    return NodeStrategies(ctx, strategies, name, bool(rule and rule.follows),
                          rule is None and derived is None)


def describe(gm: torch.fx.GraphModule, mesh_shape: Sequence[int]) -> dict[str, list[str]]:
    """Node name → its strategies printed compactly (``"S(0), R -> S(0)"``), for tensor nodes:
    the quickest way to see what the rules offer (and what tests assert)."""
    table = {}
    for node in gm.graph.nodes:
        op = node_strategies(gm, node, mesh_shape)
        if op is not None:
            table[node.name] = [str(s) for s in op.strategies]
    return table


def describe_module(module: torch.nn.Module, mesh_shape: Sequence[int],
                    **input_shapes: Sequence[int]) -> dict[str, list[str]]:
    """:func:`describe` of ``module`` captured on meta tensors of the given input shapes
    (keyword: the ``forward`` parameter name)."""
    from fxplan.passes.capture import capture  # capture imports nothing of the planner

    inputs = {name: torch.empty(*shape, device="meta") for name, shape in input_shapes.items()}
    return describe(capture(module, inputs=inputs).gm, mesh_shape)


def rule_sources(gm: torch.fx.GraphModule) -> dict[str, dict[str, int]]:
    """Where each op's options come from: ``{"rule": …, "dtensor": …, "fallback": …}``, each
    op name (the ATen overload for ``torch.export`` graphs) → its number of nodes. The
    source does not depend on the mesh (a 1-axis mesh of 2 is asked)."""
    table: dict[str, dict[str, int]] = {"rule": {}, "dtensor": {}, "fallback": {}}
    for node in gm.graph.nodes:
        op = node_strategies(gm, node, (2,))
        if op is not None and node.op not in ("placeholder", "get_attr"):
            name = str(node.target) if node.op == "call_function" else str(getattr(op.ctx.op, "__name__", op.ctx.op))
            counts = table[op.source]
            counts[name] = counts.get(name, 0) + 1
    return table
