"""Insert reshards so a graph with DTensor parameters runs SPMD on the tensor-parallel axis.

The graph runs on DTensors: every op propagates sharding by DTensor's own rules, so the result
equals the single-device one for *any* placement. What the plan adds is *where* activations
live; at each node ``v`` the plan annotates (``placements.nodes[v]``, tp token ``π_v``) this pass
inserts after ``v``

    v' = Reshard(π_v)(v)        # = v.redistribute(tp_mesh, [π_v]) when v's placement ≠ π_v

and points every user of ``v`` at ``v'``. That is the reshard between a producer's placement
(what propagation gives) and what its consumers are planned to see: e.g. with sequence
parallelism the plan puts LayerNorm/residual activations at ``S(1)`` (sequence dim), and the
``R``→``S(1)`` / ``P``→``S(1)`` reshards become reduce-scatters and all-gathers.

Cases for ``Reshard(π)`` on a value ``x``:
  1. ``x`` is not a DTensor (an int, a shape): returned unchanged;
  2. ``x.placements == (π,)``: unchanged;
  3. ``π`` is ``P`` (partial): DTensor cannot redistribute *to* partial; unchanged, counted in
     ``Reshard.fallbacks`` and logged the first time (the consumer reduces later);
     :attr:`Reshard.fallback_line` is what ``ShardedModule.fallbacks`` reports. A consumer
     that cannot take a partial input — dropout, whose mask DTensor draws in place
     (``bernoulli_``) and which does not commute with the pending sum — gets the edge's
     reshard before it instead: ``Reshard(π_u)`` on its input, ``π_u`` the consumer's own
     planned placement (elementwise: input and output placed alike), the reshard the plan's
     search priced on that edge (``P → S(1)`` is a reduce-scatter);
  4. otherwise ``x.redistribute(tp_mesh, [π])``.
In debug mode ``Reshard`` asserts after the fact that the value has the planned placement.

The graph's boundary is made explicit too: each tensor input enters as
``DTensor.from_local(x, tp_mesh, [R])`` (:class:`EnterSPMD`) and each output leaves replicated and
local (:class:`ExitSPMD`), so the module's caller — a pipeline stage, a loss — sees plain tensors.
Nested graph modules (outlined layers) get their reshards too; only the top graph gets a boundary.

Planned node names that are in none of the program's graphs (``known_nodes``: all stages', given
by the runtime; default: the graphs of the module the pass runs on) are skipped and reported as
one fallback (e.g. nodes the capture had outside ``forward``: ``targets`` and the loss).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_map

from fxplan.core.placements import format_placements
from fxplan.passes.rewrite.base import PassResult, RewritePass, record_fallback
from fxplan.passes.rewrite.placements import axis_placement, normalize

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["InsertReshards", "Reshard", "EnterSPMD", "ExitSPMD"]


class Reshard(nn.Module):
    """``x ↦ x.redistribute(mesh, [placement])`` when needed (cases in the module docstring)."""

    def __init__(self, mesh: DeviceMesh, placement: Placement, node: str, debug: bool = False):
        super().__init__()
        self.mesh, self.placement, self.node, self.debug = mesh, placement, node, debug
        self.fallbacks = 0

    def forward(self, x: Any) -> Any:
        if not isinstance(x, DTensor):
            return x
        target = normalize(self.placement, x.ndim)
        if x.placements == (target,):
            return x
        if isinstance(target, Partial):
            self.fallbacks += 1
            if self.fallbacks == 1:
                record_fallback(None, self.fallback_line)
            return x
        out = x.redistribute(self.mesh, [target])
        if self.debug and out.placements != (target,):
            raise AssertionError(
                f"node {self.node!r}: planned {format_placements([target])}, "
                f"runs {format_placements(out.placements)}"
            )
        return out

    @property
    def fallback_line(self) -> str:
        return (f"[insert-reshards] node {self.node!r} is planned P (partial) on tp; DTensor "
                "cannot redistribute to partial, so it keeps its propagated placement")

    def extra_repr(self) -> str:
        return f"{self.node}: → {format_placements([self.placement])}"


#: Dropout as the graph holds it: the module, the functional and the ATen ops.
_DROPOUT_FUNCTIONS = {torch.nn.functional.dropout, torch.dropout, torch.ops.aten.dropout.default,
                      torch.ops.aten.native_dropout.default}


def _is_dropout(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` applies dropout (an ``nn.Dropout`` module, ``F.dropout`` or its ATen
    ops)."""
    if node.op == "call_module":
        try:
            return isinstance(gm.get_submodule(str(node.target)), nn.modules.dropout._DropoutNd)
        except AttributeError:
            return False
    return node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS


class EnterSPMD(nn.Module):
    """A plain input tensor enters the SPMD region replicated: ``from_local(x, mesh, [R])``."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: Any) -> Any:
        def enter(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
                return DTensor.from_local(value, self.mesh, [Replicate()], run_check=False)
            return value

        return tree_map(enter, x)


class ExitSPMD(nn.Module):
    """Outputs leave replicated and local: ``x.redistribute(mesh, [R]).to_local()``."""

    def forward(self, x: Any) -> Any:
        def leave(value: Any) -> Any:
            if isinstance(value, DTensor):
                return value.redistribute(value.device_mesh, [Replicate()] * value.device_mesh.ndim).to_local()
            return value

        return tree_map(leave, x)


class InsertReshards(RewritePass):
    """Add :class:`Reshard` after planned nodes and an SPMD boundary (see the module docstring)."""

    name = "insert-reshards"

    def __init__(self, tp_mesh: DeviceMesh, *, debug: bool = False,
                 known_nodes: Collection[str] | None = None) -> None:
        self.tp_mesh = tp_mesh
        self.debug = debug
        self.known_nodes = None if known_nodes is None else set(known_nodes)
        self.inserted: list[str] = []
        self.skipped: list[str] = []

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        if self.tp_mesh.size() == 1:
            return PassResult(gm, False)
        graphs = [m for m in gm.modules() if isinstance(m, fx.GraphModule)]
        self._report_unknown(plan, graphs)
        for sub in graphs:
            self._insert_reshards(sub, plan)
        self._insert_boundary(gm)
        return PassResult(gm, True)

    def _report_unknown(self, plan: "Plan", graphs: list[fx.GraphModule]) -> None:
        known = self.known_nodes
        if known is None:
            known = {node.name for sub in graphs for node in sub.graph.nodes}
        unknown = [name for name in plan.placements.nodes if name not in known]
        new = [name for name in unknown if name not in self.skipped]
        if not new:
            return
        self.skipped.extend(new)
        shown = ", ".join(unknown[:8]) + (f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else "")
        self.fallback(f"{len(unknown)} planned node(s) are not in the traced program, their "
                      f"placements are not applied: {shown}")

    def _insert_reshards(self, gm: fx.GraphModule, plan: "Plan") -> None:
        for node in list(gm.graph.nodes):
            self.at = f"node {node.name!r}"
            planned = plan.placements.nodes.get(node.name)
            if planned is None or node.op in ("placeholder", "output", "get_attr"):
                continue
            placement = axis_placement(plan, planned, "tp")
            target = f"reshard_{node.name}"
            gm.add_submodule(target, Reshard(self.tp_mesh, placement, node.name, self.debug))
            with gm.graph.inserting_after(node):
                new = gm.graph.call_module(target, (node,))
            node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
            self.inserted.append(node.name)
            if isinstance(placement, Partial):
                self._reshard_before_dropout(gm, new, plan)
        gm.recompile()

    def _reshard_before_dropout(self, gm: fx.GraphModule, value: fx.Node, plan: "Plan") -> None:
        """Case 3's dropout consumers of a partial ``value``: its input resharded to the
        consumer's planned placement (or replicated when it has none)."""
        for user in list(value.users):
            if not _is_dropout(gm, user):
                continue
            planned = plan.placements.nodes.get(user.name)
            placement = Replicate() if planned is None else axis_placement(plan, planned, "tp")
            if isinstance(placement, Partial):
                placement = Replicate()
            target = f"reshard_into_{user.name}"
            gm.add_submodule(target, Reshard(self.tp_mesh, placement, user.name, self.debug))
            with gm.graph.inserting_before(user):
                edge = gm.graph.call_module(target, (value,))
            user.replace_input_with(value, edge)

    def _insert_boundary(self, gm: fx.GraphModule) -> None:
        gm.add_submodule("enter_spmd", EnterSPMD(self.tp_mesh))
        gm.add_submodule("exit_spmd", ExitSPMD())
        for node in list(gm.graph.nodes):
            if node.op == "placeholder":
                with gm.graph.inserting_after(node):
                    new = gm.graph.call_module("enter_spmd", (node,))
                node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
            elif node.op == "output":
                with gm.graph.inserting_before(node):
                    new = gm.graph.call_module("exit_spmd", (node.args[0],))
                node.args = (new,)
        gm.recompile()
