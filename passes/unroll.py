"""Export a deep model from a shallow copy: trace three layers, repeat the third.

``torch.export`` costs time per traced op, and faster than linearly in the number of layers
(tracing, stack-trace symbolisation, the recompiles of export's own passes): a 70B Llama
(80 layers) takes ~20 s, while its blocks are identical. When the model's layers are one
container (``model.layers``, ``transformer.h``, ``encoder.layer``: see
:func:`~fxplan.passes.analyses.blocks.layer_containers`) of at least :data:`MIN_LAYERS`
children of one class, :func:`export_unrolled` exports the model with the container cut to
its first ``K = 3`` children and rebuilds the graph of all ``N`` layers from it:

    embed · L0 · L1 · L2 · head   ─unroll─►   embed · L0 · L1 · L2 · L3 … L(N-1) · head

Layer ``i ≥ 3`` is a copy of ``L2`` in which

- a node of ``L2`` becomes its copy in layer ``i`` (same position in the layer);
- a reference of ``L2`` to a node of ``L1`` (the residual stream, at position ``q``)
  becomes the node at position ``q`` of layer ``i-1``;
- a reference to a node outside the layers (rotary tables, masks) stays as it is;
- ``get_attr`` targets, ``nn_module_stack`` paths and node names say ``i`` where they
  said ``2``;

and the nodes after the layers that read ``L2`` read layer ``N-1`` instead. Node names are
then given afresh in graph order, as export names them.

The copy is exact only when layer ``i`` would trace as ``L2`` does, so the rebuild proves it
in two ways. Before the export, every layer's *structure* (:func:`layer_structure`: the class
of each of its modules, the shape and dtype of each parameter and buffer, and each module's
plain attributes — numbers, strings, flags — with the layer's own index written as the
index) is compared with the structure of the layer it will be copied from. Layers that
change kind part-way (DeepSeek-V3's ``first_k_dense_replace`` dense layers before the
mixture-of-experts ones) move the cut: with ``s`` the first layer from which all layers have
one structure, ``K = max(3, s + 3)`` layers are traced and layer ``K-1`` repeated, so the
three traced layers the graph check compares are of the repeated kind. After the export,
``L(K-2)`` and ``L(K-1)`` must be *isomorphic* (same ops, targets up to the index, shapes and
dtypes; ``L(K-1)``'s references into ``L(K-2)`` mirror ``L(K-2)``'s into ``L(K-3)``; the same
outside references), each layer's nodes contiguous, nothing after the layers reading an
earlier layer (say, all hidden states returned), and the rebuilt graph must read exactly the
container's parameters, with their shapes. A model that fails any check (alternating layer
kinds, a structure that never settles) is exported whole, and the capture says why.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable, Sequence

import torch
import torch.fx

from fxplan.passes.analyses.blocks import layer_containers, module_path
from fxplan.passes.analyses.lifted import LIFTED, constant_key
from fxplan.passes.analyses.params import is_parameter

__all__ = ["MIN_LAYERS", "SHALLOW_LAYERS", "UNROLLED", "NotUnrollable", "export_unrolled",
           "index_attributes", "layer_structure"]

#: Cut to at least this many layers: L0 (reads the embeddings), L1 and L2 (read a layer like
#: themselves).
SHALLOW_LAYERS = 3
#: ``GraphModule.meta`` key of the line saying what was traced and what repeated.
UNROLLED = "fxplan_unrolled"
#: Models with fewer layers are exported whole (the saving would be small).
MIN_LAYERS = 6


class NotUnrollable(Exception):
    """The model's layers cannot be rebuilt from a shallow export; the message says why.
    ``shallow_tried``: a shallow export was made and found inexact (worth reporting), as
    opposed to a model with no long layer container (nothing to report)."""

    def __init__(self, message: str, *, shallow_tried: bool = True) -> None:
        super().__init__(message)
        self.shallow_tried = shallow_tried


#: Plain attribute values that belong to a layer's structure (a window size, a flag, a kind).
_PLAIN = (bool, int, float, str, type(None))


def _attributes(layer: torch.nn.Module) -> dict[str, Any]:
    """The plain attributes of every module inside ``layer``, keyed by ``module.name``."""
    return {f"{name}.{k}" if name else k: v
            for name, m in layer.named_modules(remove_duplicate=False)
            for k, v in vars(m).items() if not k.startswith("_") and isinstance(v, _PLAIN)}


def index_attributes(layers: Sequence[torch.nn.Module]) -> frozenset[str]:
    """The attributes that hold each layer's own index (``self_attn.layer_idx``): equal to
    ``i`` in layer ``i`` for every layer, so they differ by construction, not by kind."""
    found = [{key for key, v in _attributes(m).items() if type(v) is int and v == i}
             for i, m in enumerate(layers)]
    return frozenset.intersection(*map(frozenset, found)) if found else frozenset()


def layer_structure(layer: torch.nn.Module, ignore: frozenset[str] = frozenset()
                    ) -> tuple:
    """What must agree between a layer and its copy: for every module inside ``layer``
    (itself included) its relative name and class, the plain attributes of each (numbers,
    strings, flags; those in ``ignore``, the layer's own index, left out), and every
    parameter's and buffer's name, shape and dtype."""
    modules = tuple((name, f"{type(m).__module__}.{type(m).__qualname__}")
                    for name, m in layer.named_modules(remove_duplicate=False))
    attributes = tuple(sorted((key, v) for key, v in _attributes(layer).items()
                              if key not in ignore))
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in
                    [*layer.named_parameters(remove_duplicate=False),
                     *layer.named_buffers(remove_duplicate=False)])
    return modules, attributes, tensors


def _first_difference(a: tuple, b: tuple) -> str:
    """The first entry in which two :func:`layer_structure` values differ, in words."""
    for kind, xs, ys in (("module", a[0], b[0]), ("attribute", a[1], b[1]),
                         ("tensor", a[2], b[2])):
        for x, y in zip(xs, ys):
            if x != y:
                a_, b_ = (x[1], y[1]) if len(x) == 2 else (x[1:], y[1:])
                return f"{kind} {x[0] or '(the layer)'}: {a_} vs {b_}"
        if len(xs) != len(ys):
            return f"{len(xs)} vs {len(ys)} {kind}s"
    return "nothing"


def _container(model: torch.nn.Module) -> tuple[str, torch.nn.Module, int]:
    """The one layer container of ``model``, its path and the number of layers to trace
    (``K``: the module docstring), or :class:`NotUnrollable`."""
    found = layer_containers(model)
    if len(found) != 1:
        raise NotUnrollable(f"{len(found)} layer containers ({', '.join(found) or 'none'})", shallow_tried=False)
    path = found[0]
    container = model.get_submodule(path)
    if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
        raise NotUnrollable(f"{path} is a {type(container).__name__}, not a ModuleList", shallow_tried=False)
    if len(container) < MIN_LAYERS:
        raise NotUnrollable(f"{path} has {len(container)} layers (< {MIN_LAYERS})", shallow_tried=False)
    ignore = index_attributes(list(container))
    structures = [layer_structure(child, ignore) for child in container]
    start = len(structures) - 1
    while start > 0 and structures[start - 1] == structures[-1]:
        start -= 1
    shallow = max(SHALLOW_LAYERS, start + SHALLOW_LAYERS)
    if shallow >= len(container):
        raise NotUnrollable(f"{path}.{start - 1} and {path}.{start} differ "
                            f"({_first_difference(structures[start - 1], structures[start])}) "
                            f"and too few layers follow to repeat", shallow_tried=False)
    return path, container, shallow


def export_unrolled(model: torch.nn.Module,
                    export: Callable[[torch.nn.Module], torch.fx.GraphModule]
                    ) -> torch.fx.GraphModule:
    """``export(model)`` of all layers, traced on the first ``K`` only (the module docstring).

    ``export``: exports a module and returns the cleaned graph module (state on ``meta``,
    ``get_attr`` nodes before their first user). The model is cut in place for the export
    and restored before returning, also on error. Raises :class:`NotUnrollable` when the
    rebuild would not be exact (the caller then exports the whole model).
    """
    path, container, k = _container(model)
    total = len(container)
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    shallow = type(container)(list(container)[:k])
    setattr(parent, attr, shallow)
    try:
        gm = export(model)
    finally:
        setattr(parent, attr, container)
    _unroll(gm, path, total, k)
    _check_parameters(gm, model, path)
    gm.meta[UNROLLED] = f"{path}: layers 0-{k - 1} traced, {k}-{total - 1} " \
                        f"repeated from layer {k - 1}"
    return gm


def _check_parameters(gm: torch.fx.GraphModule, model: torch.nn.Module, path: str) -> None:
    """The rebuilt graph reads exactly the parameters of ``model``'s layers, each with its
    shape: a copy that named a parameter the model lacks, or missed one, is not exact."""
    prefix = f"{path}."
    wanted = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)
              if n.startswith(prefix)}
    read: dict[str, tuple[int, ...]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith(prefix):
            if is_parameter(gm, str(node.target)):
                read[str(node.target)] = tuple(gm.get_parameter(str(node.target)).shape)
    extra = sorted(set(read) - set(wanted))
    if extra:
        raise NotUnrollable(f"the rebuilt graph reads {extra[0]}, which the model lacks")
    wrong = [n for n in read if read[n] != wanted[n]]
    if wrong:
        raise NotUnrollable(f"the rebuilt graph reads {wrong[0]} as {read[wrong[0]]}, "
                            f"the model's is {wanted[wrong[0]]}")
    unread = sorted(set(wanted) - set(read))
    if unread:
        raise NotUnrollable(f"the rebuilt graph never reads {unread[0]}"
                            + (f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""))



def _layer_pattern(path: str) -> re.Pattern[str]:
    """Matches a module path or ``get_attr`` target inside layer N of ``path``; group 1 is N."""
    return re.compile(rf"^{re.escape(path)}\.(\d+)(?:\.|$)")


def _layer_of(node: torch.fx.Node, pattern: re.Pattern[str]) -> int | None:
    match = pattern.match(module_path(node) if node.op != "get_attr" else str(node.target))
    return int(match[1]) if match else None


def _split_layers(gm: torch.fx.GraphModule, path: str, k: int) -> list[list[torch.fx.Node]]:
    """The nodes of layers 0 … k-1, each contiguous in graph order, with nothing between."""
    pattern = _layer_pattern(path)
    layers: list[list[torch.fx.Node]] = [[] for _ in range(k)]
    order: list[int | None] = []
    for node in gm.graph.nodes:
        layer = _layer_of(node, pattern)
        order.append(layer)
        if layer is not None:
            if layer >= k:
                raise NotUnrollable(f"node {node.name} is in layer {layer} of a cut model")
            layers[layer].append(node)
    runs = [k for i, k in enumerate(order) if k is not None and (i == 0 or order[i - 1] != k)]
    if runs != list(range(k)):
        raise NotUnrollable("the layers' nodes are not contiguous in graph order")
    return layers


def _renamed(value: Any, path: str, old: int, new: int) -> Any:
    """``value`` (a string or nested tuple/dict of strings) with ``path.old`` → ``path.new``."""
    if isinstance(value, str):
        return re.sub(rf"(^|[^\w.]|__){re.escape(path)}\.{old}(?=\.|$)", rf"\g<1>{path}.{new}", value)
    if isinstance(value, tuple):
        return tuple(_renamed(v, path, old, new) for v in value)
    if isinstance(value, dict):
        return {_renamed(k, path, old, new): _renamed(v, path, old, new) for k, v in value.items()}
    return value


def _stack_key(node: torch.fx.Node, path: str, index: int) -> Any:
    stack = node.meta.get("nn_module_stack") or {}
    return tuple((_renamed(p, path, index, 0), t if isinstance(t, str) else getattr(t, "__name__", t))
                 for p, t in stack.values())


def _signature(node: torch.fx.Node, path: str, index: int) -> Any:
    val = node.meta.get("val")
    shape = (tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else type(val).__name__
    target = _renamed(str(node.target), path, index, 0) if node.op == "get_attr" else node.target
    return node.op, constant_key(node, target), shape, _stack_key(node, path, index)


def _renumbered(gm: torch.fx.GraphModule, target: str, before: str, template: str,
                steps: int) -> str:
    """The name of a lifted constant ``steps`` layers after the template's, numbered as export
    numbers a model exported whole: the number grows by the template's number less the
    layer before's at each layer (``lifted_tensor_2`` in layer 1, ``_4`` in 2, ``_6`` in 3).
    The copied layer's attribute is renamed to it."""
    def number(name: str) -> int:
        return int(re.search(r"(\d+)$", name)[1])   # type: ignore[index]
    new = number(template) + steps * (number(template) - number(before))
    owner_path, _, old_name = target.rpartition(".")
    renamed = f"{old_name[:len(old_name) - len(str(number(old_name)))]}{new}"
    owner = gm.get_submodule(owner_path) if owner_path else gm
    if renamed != old_name and hasattr(owner, old_name):
        value = getattr(owner, old_name)
        delattr(owner, old_name)
        setattr(owner, renamed, value)
    return f"{owner_path}.{renamed}" if owner_path else renamed


def _check_isomorphic(prev: list[torch.fx.Node], layer: list[torch.fx.Node],
                      before: list[torch.fx.Node], path: str, k: int) -> None:
    """``layer`` (index k) reads ``prev`` (k-1) as ``prev`` reads ``before`` (k-2)."""
    if len(prev) != len(layer):
        raise NotUnrollable(f"layers differ in size ({len(prev)} and {len(layer)} nodes)")
    pos_prev = {n: i for i, n in enumerate(prev)}
    pos_layer = {n: i for i, n in enumerate(layer)}
    pos_before = {n: i for i, n in enumerate(before)}

    def role(value: torch.fx.Node, own: dict, lower: dict) -> Any:
        if value in own:
            return ("own", own[value])
        if value in lower:
            return ("prev", lower[value])
        return ("outside", value)

    for a, b in zip(prev, layer):
        if _signature(a, path, k - 1) != _signature(b, path, k):
            raise NotUnrollable(f"{a.name} and {b.name} differ (layer {k - 1} vs {k})")
        ra = torch.fx.node.map_aggregate((a.args, a.kwargs), lambda v: role(v, pos_prev, pos_before)
                                         if isinstance(v, torch.fx.Node) else v)
        rb = torch.fx.node.map_aggregate((b.args, b.kwargs), lambda v: role(v, pos_layer, pos_prev)
                                         if isinstance(v, torch.fx.Node) else v)
        if repr(ra) != repr(rb):
            raise NotUnrollable(f"{a.name} and {b.name} read different inputs")


def _unroll(gm: torch.fx.GraphModule, path: str, total: int, k: int) -> None:
    """Grow ``gm`` (exported with ``k`` layers of ``path``) to ``total``."""
    graph = gm.graph
    layers = _split_layers(gm, path, k)
    last = k - 1
    _check_isomorphic(layers[last - 1], layers[last], layers[last - 2], path, last)
    in_layers = {n for layer in layers for n in layer}
    template = layers[last]
    early = {n for layer in layers[:last] for n in layer}
    for node in graph.nodes:
        if node not in in_layers and any(a in early for a in node.all_input_nodes):
            raise NotUnrollable(f"{node.name} (after the layers) reads an early layer")
    position = {n: i for i, n in enumerate(template)}
    previous_position = {n: i for i, n in enumerate(layers[last - 1])}
    copies: list[torch.fx.Node] = template
    copied: set[torch.fx.Node] = set()
    first_copy: torch.fx.Node | None = None
    anchor = template[-1]
    owners = gm.get_submodule(path)
    for index in range(k, total):
        owners.add_module(str(index), copy.deepcopy(owners.get_submodule(str(last))))
        made: list[torch.fx.Node] = []
        prior = copies

        def arg(value: torch.fx.Node) -> torch.fx.Node:
            if value in position:
                return made[position[value]]
            if value in previous_position:
                return prior[previous_position[value]]
            return value

        for node, before in zip(template, layers[last - 1]):
            with graph.inserting_after(anchor):
                target = (_renamed(node.target, path, last, index) if node.op == "get_attr"
                          else node.target)
                if node.op == "get_attr" and LIFTED.search(target):
                    target = _renumbered(gm, target, before.target, node.target, index - last)
                name = None if node.op == "get_attr" else _base_name(node.name)
                new = graph.create_node(node.op, target, *torch.fx.node.map_arg(
                    (node.args, node.kwargs), arg), name=name, type_expr=node.type)
            new.meta = {**node.meta, "nn_module_stack": _renamed(
                node.meta.get("nn_module_stack", {}), path, last, index)}
            made.append(new)
            copied.add(new)
            first_copy = first_copy or new
            anchor = new
        copies = made
    for node in template:
        for user in list(node.users):
            if user not in in_layers and user not in copied:  # a node after the layers
                user.replace_input_with(node, copies[position[node]])
    gm.graph = _renamed_in_order(graph, first_copy) if first_copy else graph
    gm.graph.lint()
    gm.recompile()


_SUFFIX = re.compile(r"_(\d+)$")


def _take(numbers: dict[str, int], name: str) -> None:
    """Record ``name`` (``base`` or ``base_N``) as taken in ``numbers``."""
    match = _SUFFIX.search(name)
    base, number = (name[:match.start()], int(match[1])) if match else (name, 0)
    numbers[base] = max(numbers.get(base, -1), number)


def _base_name(name: str) -> str:
    return _SUFFIX.sub("", name)


def _renamed_in_order(graph: torch.fx.Graph, first_copy: torch.fx.Node) -> torch.fx.Graph:
    """A copy of ``graph`` in which the ``call_function`` nodes from ``first_copy`` on are
    named afresh in graph order, continuing the numbering of the names before them
    (``linear_20`` in layer 2, ``linear_21`` next), as export names a model traced whole. (A
    graph's namespace never frees a name, so renaming in place would skip numbers.)"""
    fresh = torch.fx.Graph(owning_module=graph.owning_module, tracer_cls=graph._tracer_cls,
                           tracer_extras=graph._tracer_extras)
    fresh._codegen = copy.deepcopy(graph._codegen)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    renaming = False
    numbers: dict[str, int] = {}  # base → highest number taken (0: the bare base)
    for sub in graph.owning_module.modules():  # export numbered their nodes with the root's
        if isinstance(sub, torch.fx.GraphModule) and sub.graph is not graph:
            for node in sub.graph.nodes:
                _take(numbers, node.name)
    for node in graph.nodes:
        renaming = renaming or node is first_copy
        if renaming and node.op == "call_function":
            base = _base_name(node.name)
            numbers[base] = numbers[base] + 1 if base in numbers else 0
            name = f"{base}_{numbers[base]}" if numbers[base] else base
        else:
            name = node.name
            if not renaming:
                _take(numbers, name)
        made = fresh.create_node(node.op, node.target,
                                 *torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__),
                                 name=name, type_expr=node.type)
        made.meta = node.meta
        env[node] = made
    return fresh
