"""What a sharding rule sees of one fx node: a normalised op identity and its tensor operands.

The same op reaches the graph in several forms — ``call_module`` of a ``torch.nn`` leaf
(``nn.Linear``), ``call_function`` (``F.linear``, ``torch.matmul``, ``operator.add``) or
``call_method`` (``x.view``). :func:`op_identity` maps each to one key: the module class, the
function, or the method name. Operands are the node's tensor arguments in order (nested
lists such as ``torch.cat``'s flattened) followed, for a ``call_module``, by the module's own
parameters in registration order — so ``nn.Linear(x)`` and ``F.linear(x, w, b)`` both present
``(x, weight, bias)``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from fxplan.passes.node_info import META_KEY
from fxplan.sharding.aten import aten_identity, is_aten

__all__ = ["Operand", "OpContext", "op_identity", "make_context", "tensor_shape", "constant_args"]

Shape = tuple[int, ...]


def tensor_shape(value: Any) -> Optional[Shape]:
    """``value`` if it is one tensor shape (a tuple of ints), else ``None``."""
    if isinstance(value, tuple) and all(isinstance(d, int) for d in value):
        return value
    return None


@dataclass(frozen=True)
class Operand:
    """A tensor operand: its global shape and dtype; ``producer`` the fx node it comes from
    (``None`` for a module's own parameter), ``element`` the output index when the producer
    returns several tensors, ``param`` the parameter name for a parameter."""

    shape: Shape
    dtype: torch.dtype
    producer: Optional[torch.fx.Node] = None
    element: Optional[int] = None
    param: Optional[str] = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


@dataclass
class OpContext:
    """A rule's view of a node; ``out`` is its output shape (a tuple of shapes for a node
    returning several tensors, ``()`` for a scalar); ``param`` the parameter a ``get_attr``
    node reads, if any."""

    node: torch.fx.Node
    op: Any
    operands: list[Operand]
    out: Any
    module: Optional[torch.nn.Module] = None
    param: Optional[str] = None

    @property
    def shapes(self) -> list[Shape]:
        return [o.shape for o in self.operands]

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        """A constant argument by position in ``node.args`` (``self`` counts for a method) or
        by keyword."""
        if name in self.node.kwargs:
            return self.node.kwargs[name]
        if position < len(self.node.args):
            return self.node.args[position]
        return default


def op_identity(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """The module class, the function, the method name, or ``node.op`` for sources; an ATen
    op (``torch.export``) is named as its ``torch`` spelling (:mod:`fxplan.sharding.aten`)."""
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target)))
    if node.op == "call_function" and is_aten(node.target):
        return aten_identity(node.target)  # export's ATen ops share the torch rules
    if node.op in ("call_function", "call_method"):
        return node.target
    return node.op


def constant_args(node: torch.fx.Node) -> str:
    """The node's arguments with every fx node blanked: what a rule may read besides shapes
    (two nodes with equal op, shapes and constant arguments get the same options)."""
    return repr(torch.fx.node.map_arg((node.args, dict(node.kwargs)), lambda _: "%"))


def _info_shape(node: torch.fx.Node) -> Any:
    info = node.meta.get(META_KEY)
    return None if info is None else info.shape


def _info_dtype(node: torch.fx.Node, element: Optional[int]) -> torch.dtype:
    dtype = node.meta[META_KEY].dtype
    if isinstance(dtype, tuple):
        dtype = dtype[element or 0]
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _node_operands(node: torch.fx.Node) -> list[Operand]:
    operands: list[Operand] = []
    element = node.args[1] if node.target is operator.getitem and len(node.args) > 1 else None

    def visit(arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            shape = _info_shape(arg)
            if tensor_shape(shape) is not None:
                operands.append(Operand(shape, _info_dtype(arg, None), arg))
            elif isinstance(shape, tuple) and shape and isinstance(element, int):
                operands.append(Operand(shape[element], _info_dtype(arg, element), arg, element))
        return arg

    torch.fx.node.map_aggregate(node.args, visit)
    torch.fx.node.map_aggregate(dict(node.kwargs), visit)
    return operands


def make_context(gm: torch.fx.GraphModule, node: torch.fx.Node) -> OpContext:
    """Build the :class:`OpContext` of ``node``."""
    operands = _node_operands(node)
    module = None
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        for name, param in module.named_parameters(recurse=False):
            operands.append(Operand(tuple(param.shape), param.dtype, param=f"{node.target}.{name}"))
    elif node.op == "get_attr":
        info = node.meta[META_KEY]
        param = info.params[0] if info.params else None
        return OpContext(node, op_identity(gm, node), [], info.shape, param=param)
    return OpContext(node, op_identity(gm, node), operands, _info_shape(node), module)

