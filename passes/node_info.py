"""The annotations capture writes: :class:`NodeInfo` (in ``node.meta["fxplan"]``),
:class:`ParamInfo` and :class:`RepeatedBlock`.

Units: FLOPs are floating-point operations (a multiply-add counts 2), bytes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import torch

#: The op classes a node can have; the cost model keys efficiencies on them.
OP_CLASSES: tuple[str, ...] = ("matmul", "attention", "elementwise", "norm", "softmax",
                               "embedding", "reduction", "view", "loss", "conv", "pool",
                               "dropout", "other")

#: Classes whose FLOPs are matrix products: what Megatron's FLOP formulas count.
MATMUL_CLASSES: frozenset[str] = frozenset({"matmul", "attention", "conv"})

Shape = tuple[int, ...]
#: A tensor's shape; a tuple of shapes for a node that returns several tensors; ``None`` for a
#: node whose value is not a tensor (``x.size(1)``, ``None``).
NodeShape = Union[Shape, tuple[Shape, ...], None]
NodeDtype = Union[torch.dtype, tuple[torch.dtype, ...], None]

META_KEY = "fxplan"


def target_name(target: object) -> str:
    """A stable text for an fx node target: the string itself (modules, methods, attributes)
    or ``module.qualname`` of a function (``_operator.add``), the same in every process."""
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"


def cast_dtype(dtype: torch.dtype, target: torch.dtype | None) -> torch.dtype:
    """``target`` for floating dtypes when given, else ``dtype`` (integers stay integers):
    how capture's ``dtype=`` applies to parameters, buffers and inputs."""
    return target if target is not None and dtype.is_floating_point else dtype


@dataclass
class NodeInfo:
    """What capture knows about one fx node; lives in ``node.meta["fxplan"]``.

    - ``shape``/``dtype``: of the node's value (see :data:`NodeShape`).
    - ``flops``: forward FLOPs (rules in :mod:`passes.analyses.flops`).
    - ``bytes_read``/``bytes_written``: tensor bytes the op moves (inputs incl. the module's
      own parameters, outputs); 0 and 0 for a view.
    - ``params``: names of the parameters the node owns (a ``call_module``'s parameters, a
      ``get_attr`` of a parameter), as the graph names them: a tied alias keeps its own name
      and :attr:`ParamInfo.tied_to` points at the canonical one.
    - ``module_path``: qualified name of the innermost module the op runs in (``""``: root).
    - ``layer``: index of the repeated block the node belongs to, ``None`` outside blocks.
    - ``block_signature``: structural hash of that block, ``None`` outside blocks.
    - ``op_class``: one of :data:`OP_CLASSES`.
    - ``saved_bytes``: bytes of tensors autograd keeps for backward, attributed to the node
      whose execution saved them, each storage counted once, parameters and buffers never.
    - ``saved_shared``: of those storages, the ones later nodes save too (a view of this
      node's saved tensor that another op keeps): ``(bytes, (later savers…))`` each. Such a
      storage is freed only when every saver's tensors are, so recomputing this node alone
      does not free it.
    """

    shape: NodeShape = None
    dtype: NodeDtype = None
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    params: list[str] = field(default_factory=list)
    module_path: str = ""
    layer: int | None = None
    block_signature: str | None = None
    op_class: str = "other"
    saved_bytes: int = 0
    saved_shared: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ParamInfo:
    """One parameter name of the model. Tied names (same ``Parameter`` object) get
    ``tied_to`` = the first name under which the parameter was registered."""

    name: str
    shape: Shape
    dtype: torch.dtype
    bytes: int
    tied_to: str | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class RepeatedBlock:
    """Layers that share one structural ``signature`` (ops, relative targets, shapes, dtypes,
    parameter shapes; not the layer index). ``nodes_per_layer[i]`` are the node names of
    ``layers[i]`` in graph order, so node ``k`` of every layer plays the same role."""

    signature: str
    layers: list[int]
    nodes_per_layer: list[list[str]]

    @property
    def count(self) -> int:
        return len(self.layers)
