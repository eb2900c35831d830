"""Rules read from PyTorch's own DTensor op strategies, for ATen ops without a decorator rule.

A ``torch.export`` graph calls ATen overloads (``aten.eq.Scalar``, ``aten.cumsum.default``,
``aten.index.Tensor``, …). Where no ``@register_rule`` covers one, DTensor usually does: its
sharding propagator (``DTensor._op_dispatcher.sharding_propagator``) holds, per overload,

* a *single-dim* strategy (``op_single_dim_strategy_funcs``): rows ``[out…, in…]`` of
  placements valid over one mesh axis, ``_ShardingPlaceholder(d)`` standing for ``Shard(d)``
  (the all-replicated row is implied) — exactly an :class:`AxisOption` list;
* an *op strategy* (``op_strategy_funcs``): given an ``OpStrategy`` per tensor input, the
  ``OpSpec`` list of valid (inputs → output) specs. Asked on a 1-axis mesh with every input
  offered every placement (``R``, ``P``, ``S(0)`` … ``S(ndim−1)``), its specs are the one-axis
  options;
* else, for an op with a decomposition (``aten.__and__``, ``aten.pad``, ``aten.diff``: the
  CompositeImplicit ones), DTensor's own decomposition tracer (``decomp_strategy``) run on
  each combination of input placements, keeping the combinations that trace without a
  redistribution.

The mesh is a 1-device ``DeviceMesh`` built without a process group (``_init_backend=False``,
as DTensor's decomposition tracer builds its own): nothing is initialised, so later real
process groups in the same process are untouched, and every dim is "shardable" on it — the
divisibility on the real mesh is checked later by :func:`~fxplan.sharding.expand.expand_options`.

Conversion: ``Shard(d)`` → ``S(d)``, ``Replicate`` → ``R``, ``Partial("sum")`` → ``P``; a
spec with any other placement (``Partial("avg"/"max")``, ``_StridedShard``) or with outputs
placed differently (fxplan gives all outputs of a node one placement) is dropped. The runtime
runs these ops on DTensors with the same propagator, so the options are the ones it executes.

Results are cached per (overload, operand shapes and dtypes, constant arguments): the
options of one axis do not depend on the mesh, so the layers of a model and the meshes the
search tries share one query.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree

from fxplan.core.placements import Partial, Placement, Replicate, Shard
from fxplan.sharding.context import OpContext, constant_args, tensor_shape
from fxplan.sharding.strategy import P, R, S, AxisOption

__all__ = ["dtensor_options", "dtensor_source", "cache_info"]

log = logging.getLogger(__name__)

#: Most input-placement combinations traced through a decomposition (``(2+ndim)^inputs``).
MAX_DECOMP_COMBINATIONS = 256


class _Unsupported(Exception):
    """The node's arguments cannot be presented to DTensor (a non-constant non-tensor)."""


@functools.cache
def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


@functools.cache
def _mesh() -> Any:
    """A 1-device mesh on no process group (DTensor's decomposition tracer builds the same)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", [0], _init_backend=False, _rank=0)


def dtensor_source(op: Any) -> Optional[str]:
    """Which DTensor table can answer for ``op``: ``"single-dim"``, ``"strategy"``,
    ``"decomposition"``, or ``None`` (not an ATen overload, or DTensor lacks it)."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    prop = _propagator()
    if op in prop.op_single_dim_strategy_funcs:
        return "single-dim"
    if op in prop.op_strategy_funcs:
        return "strategy"
    # DTensor's decomposition tracer arrived after torch 2.11: there, such ops have no rule
    decomp = getattr(prop, "decomp_strategy", None)
    if op.namespace == "aten" and decomp is not None and decomp.has_decomp(op):
        return "decomposition"
    return None


def _placement(p: Any) -> Optional[Placement]:
    """DTensor's placement as fxplan's, or ``None`` when fxplan has no such placement."""
    if type(p) is Shard:  # not _StridedShard
        return S(p.dim)
    if isinstance(p, Replicate):
        return R
    if isinstance(p, Partial) and p.reduce_op == "sum":
        return P
    return None


def _candidates(ndim: int) -> list[Placement]:
    return [R, P] + [S(d) for d in range(ndim)]


def _tensor_meta(shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    from torch.distributed.tensor._dtensor_spec import TensorMeta

    stride = tuple(int(s) for s in torch.empty(shape, device="meta").stride()) if shape else ()
    return TensorMeta(torch.Size(shape), stride, dtype)


def _schema(ctx: OpContext, wrap: Any) -> Any:
    """The node's arguments as an ``OpSchema`` with ``wrap(operand)`` for each tensor operand
    (in :func:`~fxplan.sharding.context.make_context` order: args, then kwargs, flattened)."""
    from torch.distributed.tensor._op_schema import OpSchema

    operands = iter(ctx.operands)

    def convert(arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            if tensor_shape(arg.meta["fxplan"].shape) is None:
                raise _Unsupported(f"argument {arg.name} is not one tensor")
            return wrap(next(operands))
        if isinstance(arg, (list, tuple)):
            return type(arg)(convert(a) for a in arg)
        return arg

    args = tuple(convert(a) for a in ctx.node.args)
    kwargs = {k: convert(v) for k, v in ctx.node.kwargs.items()}
    return OpSchema(ctx.node.target, args, kwargs)


def _option(outputs: list[Any], inputs: list[Any], n_operands: int) -> Optional[AxisOption]:
    """One DTensor row (output placements, input placements) as an :class:`AxisOption`."""
    outs = {_placement(p) if p is not None else None for p in outputs} - {None}
    if len(outs) != 1 or len(inputs) != n_operands:
        return None
    converted = tuple(_placement(p) for p in inputs)
    if any(p is None for p in converted):
        return None
    return AxisOption(converted, outs.pop())


def _single_dim(ctx: OpContext) -> list[AxisOption]:
    from torch.distributed.tensor._op_schema import OpStrategy, OpSpec
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    mesh = _mesh()
    schema = _schema(ctx, lambda o: OpStrategy([OpSpec(DTensorSpec(
        mesh, (R,), _tensor_meta(o.shape, o.dtype)))]))
    op = ctx.node.target
    rows = _propagator().op_single_dim_strategy_funcs[op].func(op, schema.args_meta, schema.kwargs_meta)
    n = len(ctx.operands)
    options = [AxisOption(tuple(R for _ in range(n)), R)]
    for row in rows:
        row = [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in row]
        option = _option(row[: len(row) - n], row[len(row) - n:], n)
        if option is not None:
            options.append(option)
    return options


def _op_strategy(ctx: OpContext) -> list[AxisOption]:
    from torch.distributed.tensor._op_schema import OpStrategy, OpSpec
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    mesh = _mesh()

    def offer_all(o: Any) -> Any:
        meta = _tensor_meta(o.shape, o.dtype)
        return OpStrategy([OpSpec(DTensorSpec(mesh, (p,), meta)) for p in _candidates(o.ndim)])

    schema = _schema(ctx, offer_all)
    strategy = _propagator().op_strategy_funcs[ctx.node.target](schema)
    if not isinstance(strategy, OpStrategy):  # a TupleStrategy (foreach ops): not a node op
        return []
    options = []
    for spec in strategy.strategies:
        out = spec.output_specs
        outs = [out.placements[0]] if isinstance(out, DTensorSpec) else \
            [o.placements[0] if o is not None else None for o in out]
        ins = outs[:1] * len(ctx.operands) if spec.input_specs is None else \
            [s.placements[0] for s in spec.input_specs]
        option = _option(outs, ins, len(ctx.operands))
        if option is not None:
            options.append(option)
    return options


def _decomposition(ctx: OpContext) -> list[AxisOption]:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    mesh = _mesh()
    schema = _schema(ctx, lambda o: DTensorSpec(mesh, (R,), _tensor_meta(o.shape, o.dtype)))
    tracer = _propagator().decomp_strategy
    per_input = [_candidates(o.ndim) for o in ctx.operands]
    if not per_input or len(list(itertools.product(*per_input))) > MAX_DECOMP_COMBINATIONS:
        per_input = [[R] for _ in ctx.operands]
    # the tracer takes one placement per pytree leaf of (args, kwargs), None for non-tensors
    leaves = pytree.tree_leaves(schema.args_schema) + pytree.tree_leaves(schema.kwargs_schema)
    is_tensor = [isinstance(leaf, DTensorSpec) for leaf in leaves]
    options = []
    for combo in itertools.product(*per_input):
        chosen = iter(combo)
        placements = tuple(next(chosen) if t else None for t in is_tensor)
        try:
            out = tracer._propagate_through_decomp(schema, placements, mesh)
        except Exception:  # noqa: BLE001 — DTensor signals "needs a redistribution" by raising
            continue
        option = _option(list(out) if isinstance(out, tuple) else [out], list(combo), len(ctx.operands))
        if option is not None:
            options.append(option)
    return options


_QUERIES = {"single-dim": _single_dim, "strategy": _op_strategy, "decomposition": _decomposition}


_CACHE: dict[tuple, Optional[tuple[AxisOption, ...]]] = {}
_STATS = {"hits": 0, "misses": 0}


def _query(ctx: OpContext) -> Optional[tuple[AxisOption, ...]]:
    source = dtensor_source(ctx.node.target)
    try:
        options = _QUERIES[source](ctx)
    except _Unsupported as exc:
        log.debug("DTensor strategy of %s not usable for node %s: %s", ctx.node.target, ctx.node.name, exc)
        return None
    except Exception as exc:  # noqa: BLE001 — a strategy that fails on this input is no rule
        log.debug("DTensor strategy of %s failed on node %s: %s: %s", ctx.node.target, ctx.node.name,
                  type(exc).__name__, exc)
        return None
    return tuple(dict.fromkeys(options)) or None


def dtensor_options(ctx: OpContext) -> Optional[list[AxisOption]]:
    """The one-axis options DTensor registers for the ATen overload ``ctx.node.target``
    (module docstring), or ``None`` when it has none usable for this node."""
    op = ctx.node.target
    if ctx.node.op != "call_function" or dtensor_source(op) is None:
        return None
    key = (op, tuple((o.shape, o.dtype) for o in ctx.operands), constant_args(ctx.node), repr(ctx.out))
    if key in _CACHE:
        _STATS["hits"] += 1
    else:
        _STATS["misses"] += 1
        _CACHE[key] = _query(ctx)
    options = _CACHE[key]
    return None if options is None else list(options)


def cache_info() -> dict[str, int]:
    """Hits, misses and size of the per-(op, shapes, dtypes, constants) cache."""
    return {**_STATS, "size": len(_CACHE)}
