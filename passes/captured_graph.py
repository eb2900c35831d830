""":class:`CapturedGraph`: a traced model with every node annotated, and its totals.

FLOP conventions (Narayanan et al., SC'21, §5.1; Korthikanti et al., 2022): the forward pass
costs ``F`` FLOPs, of which ``M`` are matrix products (matmul, attention, conv). Training
counts matrix products only: backward costs ``2M`` (gradients of inputs and of weights),
and full activation recompute runs the layers' forward again (``M_layers``; the head after
the last layer is not recomputed)::

    training_flops(recompute=False) = 3·M
    training_flops(recompute=True)  = 3·M + M_layers

For a GPT with ``l`` layers, hidden ``h``, vocabulary ``V``, sequence ``s`` and batch ``B``:
``M = 24·B·s·l·h²·(1 + s/(6h)) + 2·B·s·h·V`` and the recompute total is Megatron's
``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Hashable, Iterable

import torch
import torch.fx

from fxplan.passes.analyses.params import unique_numel
from fxplan.passes.node_info import (MATMUL_CLASSES, META_KEY, NodeInfo, ParamInfo, RepeatedBlock,
                              target_name)


@dataclass(frozen=True)
class LayerRow:
    """One row of :meth:`CapturedGraph.per_layer_table`: a layer, or the nodes before/after
    the layers. ``params`` counts distinct parameter elements the row's nodes use (a tied
    embedding/head weight appears in the rows of both users)."""

    name: str
    layer: int | None
    signature: str | None
    nodes: int
    params: int
    flops: int
    matmul_flops: int
    saved_bytes: int


@dataclass
class CapturedGraph:
    """A model captured by :func:`passes.capture.capture`.

    ``gm`` is the fx graph module (it shares the model's parameters; every node carries a
    :class:`NodeInfo` in ``node.meta["fxplan"]``). ``params`` lists every parameter name,
    tied aliases included. ``blocks`` groups the layers by structural signature.
    ``leaf_modules`` maps module paths kept opaque at the user's request to their class.
    ``unpriced_ops`` counts nodes whose op had no FLOP rule (priced by measurement).
    ``layer_names`` maps a layer index to its module path (``h.3``). ``method`` says how
    the graph was obtained: ``"symbolic_trace"`` (``torch.fx`` ops, ``call_module`` leaves)
    or ``"export"`` (``torch.export``, ATen ops, parameters as ``get_attr``);
    ``block_method`` says how the repeated blocks were found (``module hierarchy``, ``graph
    structure`` or ``none``: :func:`fxplan.passes.analyses.blocks.find_blocks`).
    ``method_note`` why export was used when ``symbolic_trace`` was tried first, and for
    export which layers were traced and which repeated (:mod:`fxplan.passes.unroll`).

    The graph is not changed after capture, so its name indexes (:attr:`nodes_by_name`,
    :attr:`infos_by_name`) are built once, and ``memo`` holds what later stages derive from
    it (the cost model's segments, layouts and segment costs), keyed by the stage that
    computes them; both live and die with the graph.
    """

    gm: torch.fx.GraphModule
    params: dict[str, ParamInfo]
    blocks: list[RepeatedBlock]
    leaf_modules: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    name: str = ""
    dtype: torch.dtype | None = None
    unpriced_ops: dict[str, int] = field(default_factory=dict)
    layer_names: dict[int, str] = field(default_factory=dict)
    capture_seconds: float = 0.0
    method: str = "symbolic_trace"
    method_note: str = ""
    block_method: str = "module hierarchy"
    memo: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)
    #: The module a bundle was built into for the capture (on ``meta``: no weights), for the
    #: checks that need its classes (``fxplan launch``'s expert-layer check builds no second
    #: one); ``None`` for a module the caller gave (not kept alive by the graph).
    module: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    #: The forward is given the targets and trained on the loss it returns
    #: (:func:`fxplan.passes.forward_swap.computes_own_loss`): the runtime's check feeds them too.
    fed_targets: bool = False

    # --- nodes ---------------------------------------------------------------------------

    def info(self, node: torch.fx.Node | str) -> NodeInfo:
        """The annotation of ``node`` (a node or its name): ``node.meta["fxplan"]``."""
        if isinstance(node, str):
            return self.infos_by_name[node]
        return node.meta[META_KEY]

    def nodes(self) -> Iterable[tuple[torch.fx.Node, NodeInfo]]:
        """``(node, info)`` in graph order."""
        return ((n, n.meta[META_KEY]) for n in self.gm.graph.nodes)

    @cached_property
    def nodes_by_name(self) -> dict[str, torch.fx.Node]:
        """``{name: fx node}``, built on first use."""
        return {n.name: n for n in self.gm.graph.nodes}

    @cached_property
    def infos_by_name(self) -> dict[str, NodeInfo]:
        """``{name: NodeInfo}``, built on first use."""
        return {n.name: n.meta[META_KEY] for n in self.gm.graph.nodes}

    # --- totals ----------------------------------------------------------------------------

    @property
    def num_params(self) -> int:
        """Distinct parameter elements (a tied pair counted once)."""
        return sum(p.numel for p in self.params.values() if p.tied_to is None)

    @property
    def param_bytes(self) -> int:
        return sum(p.bytes for p in self.params.values() if p.tied_to is None)

    @property
    def forward_flops(self) -> int:
        """All forward FLOPs, memory-bound ops included."""
        return sum(i.flops for _, i in self.nodes())

    @property
    def forward_matmul_flops(self) -> int:
        """Forward FLOPs of matrix products (``M`` in the module docstring)."""
        return sum(i.flops for _, i in self.nodes() if i.op_class in MATMUL_CLASSES)

    def training_flops(self, recompute: bool = True) -> int:
        """FLOPs of one training step, matrix products only: ``3·M (+ M_layers)``."""
        layers = sum(i.flops for _, i in self.nodes()
                     if i.op_class in MATMUL_CLASSES and i.layer is not None)
        return 3 * self.forward_matmul_flops + (layers if recompute else 0)

    @property
    def saved_bytes(self) -> int:
        """Bytes autograd keeps for backward over the whole forward (no recompute)."""
        return sum(i.saved_bytes for _, i in self.nodes())

    def saved_bytes_by_layer(self) -> dict[int | None, int]:
        """Saved bytes per layer index; key ``None`` for nodes outside the layers."""
        out: dict[int | None, int] = {}
        for _, info in self.nodes():
            out[info.layer] = out.get(info.layer, 0) + info.saved_bytes
        return out

    # --- tables ----------------------------------------------------------------------------

    def per_layer_table(self) -> list[LayerRow]:
        """Rows: nodes before the first layer, each layer, nodes after the last layer."""
        groups: dict[tuple[int, Any], list[NodeInfo]] = {}
        seen_layer = False
        for node, info in self.nodes():
            if info.layer is not None:
                seen_layer = True
                key: tuple[int, Any] = (1, info.layer)
            else:
                key = (2, None) if seen_layer else (0, None)
            groups.setdefault(key, []).append(info)
        names = {(0, None): "(before layers)" if seen_layer else "(no layers)",
                 (2, None): "(after layers)"}
        rows = []
        for key in sorted(groups, key=lambda k: (k[0], k[1] if k[1] is not None else -1)):
            infos = groups[key]
            rows.append(LayerRow(
                name=names.get(key) or self.layer_names.get(key[1], str(key[1])), layer=key[1],
                signature=infos[0].block_signature if key[1] is not None else None,
                nodes=len(infos),
                params=unique_numel([p for i in infos for p in i.params], self.params),
                flops=sum(i.flops for i in infos),
                matmul_flops=sum(i.flops for i in infos if i.op_class in MATMUL_CLASSES),
                saved_bytes=sum(i.saved_bytes for i in infos)))
        return rows

    def fingerprint(self) -> str:
        """sha256 of the structure: nodes (op, target, arguments, shape, dtype), parameters
        (name, shape, dtype, tie) and inputs. Equal models captured alike hash alike."""
        h = hashlib.sha256()
        for node, info in self.nodes():
            h.update(repr((node.op, node.name, target_name(node.target), _args_repr(node),
                           info.shape, str(info.dtype))).encode())
        for p in self.params.values():
            h.update(repr((p.name, p.shape, str(p.dtype), p.tied_to)).encode())
        h.update(repr(sorted((k, s, str(d)) for k, (s, d) in self.inputs.items())).encode())
        return h.hexdigest()

    def summary(self) -> dict[str, Any]:
        """Everything ``fxplan graph --json`` prints, as JSON-ready values."""
        return {
            "model": self.name,
            "method": self.method,
            "method_note": self.method_note,
            "dtype": str(self.dtype).removeprefix("torch.") if self.dtype else None,
            "inputs": {k: {"shape": list(s), "dtype": str(d).removeprefix("torch.")}
                       for k, (s, d) in self.inputs.items()},
            "nodes": len(self.gm.graph.nodes),
            "num_params": self.num_params,
            "param_bytes": self.param_bytes,
            "tied_params": {p.name: p.tied_to for p in self.params.values() if p.tied_to},
            "forward_flops": self.forward_flops,
            "forward_matmul_flops": self.forward_matmul_flops,
            "training_flops": {"recompute": self.training_flops(True),
                               "no_recompute": self.training_flops(False)},
            "saved_activation_bytes": {
                "total": self.saved_bytes,
                "outside_layers": self.saved_bytes_by_layer().get(None, 0)},
            "block_method": self.block_method,
            "blocks": [{"signature": b.signature, "layers": b.layers,
                        "nodes_per_layer": len(b.nodes_per_layer[0])} for b in self.blocks],
            "leaf_modules": dict(self.leaf_modules),
            "unpriced_ops": dict(self.unpriced_ops),
            "per_layer": [asdict(r) for r in self.per_layer_table()],
            "fingerprint": self.fingerprint(),
            "capture_seconds": round(self.capture_seconds, 3),
        }


def _args_repr(node: torch.fx.Node) -> str:
    return repr(torch.fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{n.name}"))
