"""``capture``: trace a model with torch.fx and annotate every node, allocating nothing.

Steps (each in its own module):

1. build the model on the ``meta`` device (a bundle) and cast it to ``dtype``; a bundle that
   fixes its loss (a user file) has the forward followed by that loss traced, so the graph ends
   in what training computes (:mod:`passes.forward_swap`); FlexAttention is traced as fused
   attention (:mod:`passes.flex_attention`);
2. obtain the fx graph by one of two methods (recorded in ``CapturedGraph.method``):
   ``"symbolic_trace"`` with :class:`~passes.tracer.CaptureTracer` (user leaf modules, clear
   errors; forward parameters without an example input are fixed to their defaults through
   ``concrete_args``, so ``targets=None`` traces the logits path, not a silent guess), or
   ``"export"``: :func:`torch.export.export` (non-strict) on fake tensors, ATen ops
   (:mod:`passes.exporter`); ``"export-core"`` the same lowered to the core ATen op set. ``method="auto"`` (the default) tries ``symbolic_trace`` and
   falls back to ``export`` when tracing fails (the reason is kept in ``method_note``);
   a bundle may prefer ``export`` (Hugging Face models, whose forwards take ``**kwargs``);
3. run the graph on fake tensors with autograd on (:mod:`passes.fake_run`): shape, dtype,
   op class, FLOPs, bytes and saved activations of every node;
4. parameters, tied by identity (:mod:`passes.analyses.params`), module paths, layers and
   repeated blocks (:mod:`passes.analyses.blocks`);
5. write a :class:`NodeInfo` into every ``node.meta["fxplan"]``.

A 96-layer GPT-3 175B or a 128-layer 1T model captures in a few seconds on a laptop CPU.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from typing import Any, Mapping, Sequence

import torch

from fxplan.passes.analyses.blocks import find_blocks, module_path
from fxplan.passes.analyses.params import is_parameter, node_params, param_table, unique_numel
from fxplan.passes.captured_graph import CapturedGraph, LayerRow
from fxplan.passes.errors import CaptureError
from fxplan.passes.exporter import export_graph
from fxplan.passes.flex_attention import priced_as_fused
from fxplan.passes.forward_swap import (TARGETS, computes_own_loss, forward_with_loss,
                                        traces_loss)
from fxplan.passes.unroll import UNROLLED
from fxplan.passes.fake_run import fake_run
from fxplan.passes.node_info import META_KEY, NodeInfo, ParamInfo, RepeatedBlock, cast_dtype
from fxplan.passes.tracer import trace

__all__ = ["capture", "CapturedGraph", "NodeInfo", "ParamInfo", "RepeatedBlock", "LayerRow",
           "CaptureError", "METHODS"]

#: How capture obtains the graph: ``auto`` tries ``symbolic_trace``, then ``export``;
#: ``export-core`` is ``export`` lowered to the core ATen op set.
METHODS = ("auto", "symbolic_trace", "export", "export-core")

log = logging.getLogger(__name__)


def capture(model: Any, *, inputs: Any = None, batch: int | None = None,
            seq: int | None = None, leaf_modules: Sequence[Any] = (),
            concrete_args: Mapping[str, Any] | None = None, dtype: torch.dtype | None = None,
            device: str = "cpu", method: str = "auto") -> CapturedGraph:
    """Capture ``model`` and annotate every node of its fx graph.

    ``model``: a ``ModelBundle`` (built on ``meta``;
    its example inputs for ``batch`` (default 1) and ``seq``) or an ``nn.Module`` with
    ``inputs``. ``inputs``: a dict keyed by ``forward`` parameter name, a tuple in parameter
    order or one value; each a tensor (any device, meta included) or an ``InputSpec``-like
    object with ``shape`` and ``dtype``. ``leaf_modules``: classes, class names, module
    paths or patterns to keep opaque (reported in ``leaf_modules``; ``symbolic_trace``
    only). ``concrete_args``: fixed values for forward parameters. ``dtype``: cast floating
    parameters and inputs (e.g. ``torch.bfloat16``). ``device``: the fake device ops run
    on. ``method``: one of :data:`METHODS`; ``auto`` takes the bundle's preference
    (``capture_method``) when it has one.
    """
    with contextlib.ExitStack() as scope:
        scope.enter_context(priced_as_fused())   # FlexAttention: fused, no CPU kernel needed
        start = time.perf_counter()
        if method not in METHODS:
            raise CaptureError(f"capture method {method!r} is not one of {', '.join(METHODS)}")
        preferred = getattr(model, "capture_method", "auto")
        built = not isinstance(model, torch.nn.Module)   # a bundle, built on meta here
        bundle = model
        model, example, name = _model_and_inputs(model, inputs, batch, seq, dtype)
        fed = built and isinstance(example, dict) and TARGETS in example \
            and computes_own_loss(bundle, model)   # the forward's own loss is priced
        if traces_loss(bundle, model, example):   # the graph ends in the trainer's loss
            scope.enter_context(forward_with_loss(model, bundle.loss,
                                                  [k for k in example if k != TARGETS]))
        graph = _capture(model, example, name, built, start, method, preferred, leaf_modules,
                         concrete_args, dtype, device)
        graph.fed_targets = fed
        return graph


def _capture(model: torch.nn.Module, example: Any, name: str, built: bool, start: float,
             method: str, preferred: str, leaf_modules: Sequence[Any],
             concrete_args: Mapping[str, Any] | None, dtype: torch.dtype | None,
             device: str) -> CapturedGraph:
    """:func:`capture` of a module with its example inputs (the bundle resolved)."""
    if method == "auto":
        method = preferred
    if method in ("export", "export-core") and leaf_modules:
        raise CaptureError("leaf_modules need method='symbolic_trace' (torch.export records "
                           "every op; it cannot keep a module opaque)")
    note = ""
    traced: CaptureError | None = None
    if method in ("auto", "symbolic_trace"):
        try:
            gm, leaves, args, named = _symbolic(model, example, concrete_args, leaf_modules)
            method = "symbolic_trace"
        except CaptureError as err:
            if method == "symbolic_trace" or leaf_modules:
                raise
            traced = err
            reason = str(err).split(" To capture it")[0]  # the remedies concern fx only
            note = f"symbolic_trace failed, so torch.export was used: {reason}"
            log.info("%s: %s", type(model).__name__, note)
            method = "export"
    if method in ("export", "export-core"):
        try:
            gm, args, named = _exported(model, example, concrete_args,
                                        core=method == "export-core")
        except CaptureError as err:
            if traced is None:
                raise
            raise CaptureError(f"{traced} torch.export failed too: {err}",
                               module_path=traced.module_path, location=traced.location) from err
        leaves = {}
        if UNROLLED in gm.meta:
            note = "; ".join(filter(None, [note, gm.meta[UNROLLED]]))
    run = fake_run(gm, args, device=device, dtype=dtype)
    params = param_table(model, dtype)
    infos = run.infos
    for node in gm.graph.nodes:
        infos[node.name].module_path = module_path(node)
        infos[node.name].params = node_params(gm, node, params)
    check_param_sum(gm, infos, params, type(model).__name__)
    blocks, layer_names, block_method = find_blocks(gm, model, infos, params)
    for node in gm.graph.nodes:
        node.meta[META_KEY] = infos[node.name]
    shapes = {k: (tuple(v.shape), cast_dtype(v.dtype, dtype)) for k, v in named.items()
              if _is_tensor_like(v)}
    return CapturedGraph(gm=gm, params=params, blocks=blocks, leaf_modules=leaves,
                         inputs=shapes, name=name, dtype=dtype, unpriced_ops=run.unpriced,
                         layer_names=layer_names, capture_seconds=time.perf_counter() - start,
                         method=method, method_note=note, block_method=block_method,
                         module=model if built else None)


def check_param_sum(gm: torch.fx.GraphModule, infos: Mapping[str, NodeInfo],
                    params: dict[str, ParamInfo], model_name: str) -> None:
    """The graph's parameters add up to the model's: every parameter the graph reads is
    one of the model's, and every one of the model's is read (a tied pair counts once).

    A graph that misses parameters (a layer copied from one of another kind, a branch not
    traced) would price a different model, so it is a :class:`CaptureError` naming them and
    the two totals.
    """
    read = {p for info in infos.values() for p in info.params}
    foreign = sorted(str(n.target) for n in gm.graph.nodes if n.op == "get_attr"
                     and str(n.target) not in params and is_parameter(gm, str(n.target)))
    canonical = {p.tied_to or p.name for p in params.values()}
    unread = sorted(canonical - {params[p].tied_to or p for p in read if p in params})
    if not foreign and not unread:
        return
    in_graph = unique_numel(sorted(read), params)
    total = unique_numel(sorted(canonical), params)
    what = (f"reads {len(foreign)} parameter(s) {model_name} does not have "
            f"({', '.join(foreign[:3])})"
            if foreign else f"never reads {len(unread)} of its parameters "
                            f"({', '.join(unread[:3])}{', …' if len(unread) > 3 else ''})")
    raise CaptureError(f"the captured graph of {model_name} {what}: its parameters add up to "
                       f"{in_graph:,} elements where the model has {total:,}, so a plan for it "
                       f"would price another model. A parameter the forward never uses should "
                       f"be removed from the model before planning.")


def _symbolic(model: torch.nn.Module, example: Any, concrete_args: Mapping[str, Any] | None,
              leaf_modules: Sequence[Any]) -> tuple[Any, dict[str, str], list[Any], dict]:
    """``symbolic_trace``: (graph module, user leaves, placeholder values, named inputs)."""
    named = _name_inputs(model, example)
    fixed = _concrete_args(model, named, dict(concrete_args or {}))
    gm, leaves = trace(model, concrete_args=fixed, leaf_modules=leaf_modules)
    order = [p for p in _forward_params(model) if p in named or p in fixed]
    return gm, leaves, [named[p] if p in named else fixed[p] for p in order], named


def _exported(model: torch.nn.Module, example: Any, concrete_args: Mapping[str, Any] | None,
              core: bool = False) -> tuple[Any, list[Any], dict]:
    """``torch.export``: (graph module, placeholder values, named inputs). Inputs are keyword
    arguments (``**kwargs`` forwards welcome); ``concrete_args`` join them as constants.
    ``core``: lowered to the core ATen op set (``run_decompositions()``)."""
    named = _name_inputs(model, example, allow_var_kwargs=True)
    clash = sorted(set(named) & set(concrete_args or {}))
    if clash:
        raise CaptureError(f"{clash} given both as inputs and as concrete_args")
    kwargs = {**named, **dict(concrete_args or {})}
    gm = export_graph(model, kwargs, core=core)
    args = [v for v in kwargs.values() if _is_tensor_like(v)]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise CaptureError(f"torch.export of {type(model).__name__} gave {len(placeholders)} "
                           f"graph inputs for {len(args)} tensor inputs; give tensors (or "
                           f"shape/dtype specs) as inputs and other values as concrete_args")
    return gm, args, named


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (
        hasattr(value, "shape") and isinstance(getattr(value, "dtype", None), torch.dtype))


def _model_and_inputs(model: Any, inputs: Any, batch: int | None, seq: int | None,
                      dtype: torch.dtype | None) -> tuple[torch.nn.Module, Any, str]:
    """A module with its inputs, or a bundle built on ``meta``: (model, example inputs, name).
    Spec strings are resolved above this layer (:func:`fxplan.capture`)."""
    if isinstance(model, str):
        raise CaptureError(f"capture() takes an nn.Module with inputs= or a model bundle, got the "
                           f"string {model!r}; for a model spec use fxplan.capture({model!r}, …)")
    if isinstance(model, torch.nn.Module):
        if inputs is None:
            raise CaptureError(f"capture({type(model).__name__}) needs inputs=...: example "
                               f"tensors or InputSpec(shape, dtype) per forward parameter")
        if batch is not None or seq is not None:
            raise CaptureError("batch= and seq= apply to a model bundle or spec; for a module, "
                               "give inputs of the shapes you want")
        return model, inputs, type(model).__name__
    if not (hasattr(model, "build") and hasattr(model, "example_inputs")):
        raise CaptureError(f"capture() takes a model spec, a ModelBundle or an nn.Module, "
                           f"got {type(model).__name__}")
    module = model.build(device="meta")
    if dtype is not None:
        module = module.to(dtype)
    if inputs is None:
        inputs = model.example_inputs(batch if batch is not None else 1, seq)
    return module, inputs, model.name


def _forward_params(model: torch.nn.Module) -> list[str]:
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise CaptureError(f"{type(model).__name__}.forward takes *args/**kwargs; capture "
                           f"needs named parameters (wrap the model in a module that names them)")
    return [p.name for p in params]


def _name_inputs(model: torch.nn.Module, inputs: Any, *,
                 allow_var_kwargs: bool = False) -> dict[str, Any]:
    """Inputs keyed by forward parameter name (any name when ``allow_var_kwargs`` and the
    forward takes ``**kwargs``)."""
    if allow_var_kwargs:
        params = inspect.signature(model.forward).parameters.values()
        names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if isinstance(inputs, Mapping) and any(p.kind == p.VAR_KEYWORD for p in params):
            return dict(inputs)
    else:
        names = _forward_params(model)
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in names]
        if unknown:
            raise CaptureError(f"inputs {unknown} are not parameters of "
                               f"{type(model).__name__}.forward({', '.join(names)})")
        return dict(inputs)
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if len(inputs) > len(names):
        raise CaptureError(f"{len(inputs)} inputs for {type(model).__name__}.forward"
                           f"({', '.join(names)})")
    return dict(zip(names, inputs))


def _concrete_args(model: torch.nn.Module, named: dict[str, Any],
                   given: dict[str, Any]) -> dict[str, Any]:
    """Fix every forward parameter without an input: ``given`` value, else its default."""
    clash = sorted(set(named) & set(given))
    if clash:
        raise CaptureError(f"{clash} given both as inputs and as concrete_args")
    fixed = dict(given)
    for p in inspect.signature(model.forward).parameters.values():
        if p.name in named or p.name in fixed:
            continue
        if p.default is inspect.Parameter.empty:
            raise CaptureError(f"{type(model).__name__}.forward needs {p.name!r}: give it in "
                               f"inputs or concrete_args")
        fixed[p.name] = p.default
    return fixed
