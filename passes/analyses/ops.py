"""Op keys and the op registry.

Every fx node gets a *key*: the function or method name (``"linear"``, ``"matmul"``,
``"softmax"``, ``"view"``), the ``torch.nn`` leaf module's functional name (``nn.Linear`` →
``"linear"``), or ``"module:ClassName"`` for other leaf modules. A rule registered for the
key, one short decorated function in :mod:`passes.analyses.flops`, gives the op class and
the forward FLOPs. A key without a rule is priced by measurement (see
:func:`passes.fake_run.FakeRun`) and reported by capture.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef

#: Leaf ``torch.nn`` modules and the key of the function they compute.
_MODULE_KEYS: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Linear, "linear"), (nn.Bilinear, "bilinear"), (nn.Embedding, "embedding"),
    (nn.modules.conv._ConvNd, "conv"), (nn.LayerNorm, "layer_norm"), (nn.RMSNorm, "rms_norm"),
    (nn.modules.batchnorm._BatchNorm, "batch_norm"), (nn.GroupNorm, "group_norm"),
    (nn.modules.dropout._DropoutNd, "dropout"), (nn.GELU, "gelu"), (nn.ReLU, "relu"),
    (nn.SiLU, "silu"), (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"), (nn.Softmax, "softmax"),
    (nn.LogSoftmax, "log_softmax"), (nn.modules.pooling._MaxPoolNd, "max_pool"),
    (nn.modules.pooling._AvgPoolNd, "avg_pool"),
    (nn.modules.pooling._AdaptiveAvgPoolNd, "adaptive_avg_pool"),
    (nn.modules.pooling._AdaptiveMaxPoolNd, "adaptive_max_pool"), (nn.Flatten, "flatten"),
    (nn.Identity, "identity"), (nn.CrossEntropyLoss, "cross_entropy"), (nn.MSELoss, "mse_loss"),
)

#: ``operator`` functions whose ``__name__`` differs from the tensor method of the same op.
_OPERATOR_KEYS = {operator.truediv: "div", operator.floordiv: "floor_divide",
                  operator.iadd: "add", operator.imul: "mul", operator.isub: "sub",
                  operator.itruediv: "div", operator.invert: "bitwise_not",
                  operator.and_: "logical_and", operator.or_: "logical_or"}


def op_key(node: torch.fx.Node, module: nn.Module | None = None) -> str:
    """The registry key of ``node`` (``module``: the submodule of a ``call_module``)."""
    if node.op == "call_module":
        for cls, key in _MODULE_KEYS:
            if isinstance(module, cls):
                return key
        return f"module:{type(module).__name__}"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return aten_key(target)
        return _OPERATOR_KEYS.get(target) or getattr(target, "__name__", str(target)).lstrip("_")
    if node.op == "call_method":
        name = str(node.target)  # in-place methods (add_) price like their out-of-place twin
        return name[:-1] if name.endswith("_") and not name.startswith("_") else name
    return node.op  # placeholder, get_attr, output


def aten_key(op: "torch._ops.OpOverload | torch._ops.OpOverloadPacket") -> str:
    """The key of an ATen op as ``torch.export`` records it: its packet name without leading
    underscores (``aten.linear.default`` → ``"linear"``, ``aten._softmax.default`` →
    ``"softmax"``, ``aten.add_.Tensor`` → ``"add"``), so ATen and ``torch`` spellings of one
    op share a rule."""
    packet = op.overloadpacket if isinstance(op, torch._ops.OpOverload) else op
    name = packet.__name__
    if name.startswith("__") and name.endswith("__"):  # aten.__and__ → "and"
        return name[2:-2]
    name = name.lstrip("_")
    return name[:-1] if name.endswith("_") else name


def tensors(tree: Any) -> list[torch.Tensor]:
    """The distinct tensors in a nested structure of args/outputs, in order."""
    seen: dict[int, torch.Tensor] = {}
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            seen.setdefault(id(leaf), leaf)
    return list(seen.values())


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class OpCall:
    """One executed node as the rules see it: args/kwargs/out hold fake tensors."""

    key: str
    args: tuple
    kwargs: dict
    out: Any
    module: nn.Module | None = None

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """Argument ``name``, passed by position ``index`` or by keyword."""
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(name, default)

    def param(self, attr: str, index: int) -> Any:
        """A module attribute (``weight``) for ``call_module``, else argument ``index``."""
        if self.module is not None:
            return getattr(self.module, attr, None)
        return self.arg(index, attr)

    @property
    def inputs(self) -> list[torch.Tensor]:
        """Input tensors, the module's own parameters and buffers included."""
        found = tensors((self.args, self.kwargs))
        if self.module is not None:
            found += [*self.module.parameters(), *self.module.buffers()]
        return tensors(found)

    @property
    def outputs(self) -> list[torch.Tensor]:
        return tensors(self.out)

    @property
    def out_numel(self) -> int:
        return sum(t.numel() for t in self.outputs)

    @property
    def in_numel(self) -> int:
        """Elements of the first tensor argument (the op's main input)."""
        first = tensors(self.args)
        return first[0].numel() if first else 0


FlopFn = Callable[[OpCall], int]


@dataclass(frozen=True)
class OpRule:
    """Op class and forward FLOPs of one key; ``bytes_read`` overrides the default (all
    input bytes) where an op touches only part of an input (an embedding's gathered rows)."""

    op_class: str
    flops: FlopFn
    bytes_read: FlopFn | None = None


_RULES: dict[str, OpRule] = {}


def register(*keys: str, op_class: str, bytes_read: FlopFn | None = None
             ) -> Callable[[FlopFn], FlopFn]:
    """Decorator: ``flops(call) -> int`` is the rule for ``keys``, of class ``op_class``."""

    def deco(fn: FlopFn) -> FlopFn:
        for key in keys:
            _RULES[key] = OpRule(op_class, fn, bytes_read)
        return fn

    return deco


def rule_for(key: str) -> OpRule | None:
    """The registered rule for ``key`` (:mod:`fxplan.passes.analyses.flops` registers the
    rules; the package imports it, so they are in place before any module of it is used)."""
    return _RULES.get(key)


@dataclass(frozen=True)
class Price:
    """Op class, forward FLOPs and bytes moved by one executed node."""

    op_class: str
    flops: int
    bytes_read: int
    bytes_written: int


def _aliases_input(call: OpCall) -> bool:
    """Whether every output shares storage with some input (a view, no data moved); ``False``
    for tensors without a storage to compare (vmap's batched tensors, as FlexAttention's block
    mask is built under ``vmap``)."""
    try:
        inputs = {StorageWeakRef(t.untyped_storage()) for t in call.inputs}
        outs = call.outputs
        return bool(outs) and all(StorageWeakRef(t.untyped_storage()) in inputs for t in outs)
    except (NotImplementedError, RuntimeError):
        return False


def price(call: OpCall, measured_flops: int | None = None) -> Price:
    """Price ``call`` by its rule; without one, by ``measured_flops`` (FlopCounterMode counts
    only matrix products, so a node measured > 0 is classed ``matmul``, else ``other``).

    Cases for bytes and class, decided by what the op did on the fake tensors:
      - no tensor output (``size``, ``getattr``): class ``other``, 0 bytes;
      - output aliases an input and no FLOPs (views, no-op casts): class ``view``, 0 bytes;
      - a ``view``-class op that had to copy (``reshape`` of a strided tensor): ``elementwise``;
      - otherwise input bytes (or the rule's ``bytes_read``) and output bytes.
    """
    rule = rule_for(call.key)
    if rule is not None:
        op_class, flops = rule.op_class, int(rule.flops(call))
    else:
        flops = int(measured_flops or 0)
        op_class = "matmul" if flops > 0 else "other"
    if not call.outputs:
        return Price("other", 0, 0, 0)
    if flops == 0 and op_class in ("view", "elementwise") and _aliases_input(call):
        return Price("view", 0, 0, 0)
    if op_class == "view":
        op_class = "elementwise"
    read = rule.bytes_read(call) if rule is not None and rule.bytes_read else \
        sum(map(nbytes, call.inputs))
    return Price(op_class, flops, read, sum(map(nbytes, call.outputs)))
