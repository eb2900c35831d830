"""Split an outlined graph into the plan's pipeline stages.

Input: the top graph from :class:`~passes.rewrite.layers.OutlineLayers`, which calls
``embed``, ``layer_0`` … ``layer_{L-1}``, ``head``. The plan's ``stages`` give stage ``k`` the
blocks ``[a_k, b_k)`` (``embed`` goes to the stage flagged ``has_embedding``, default the first;
``head`` to the one flagged ``has_head``, default the last). Stages must tile ``0 … L-1`` in order
(with ``interleaved:v`` there are ``pp·v`` of them; stage ``k`` later runs on pipeline rank
``k mod pp``, which does not change the split).

Stage ``k`` is a graph module of its own. A pipeline stage only talks to its neighbours, so its
interface is the set of values that cross the cut after it:

    out(k) = { v : stage(v) ≤ k and some user of v is in a stage > k }      (graph order)
    in(k)  = out(k-1),  in(0) = the model's inputs

(a value used two stages later is passed through the stage in between). Values that are not
tensors (a length, a shape) cannot travel between pipeline ranks; they are fixed for the planned
microbatch shape, so they are folded into their consumers as constants, read from one run of the
graph on fake tensors of microbatch shape. The same run gives each stage's input and output
shapes, stored in ``program.stage_io`` for :class:`torch.distributed.pipelining.PipelineStage`.

Output: :class:`StagedProgram`, an ``nn.Module`` whose ``stage_k`` children, called in order,
compute exactly what the original graph did (so this pass can be tested on one process).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

from fxplan.core.stage_io import StageIO
from fxplan.passes.rewrite.base import PassResult, RewritePass
from fxplan.passes.rewrite.layers import EMBED, HEAD

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["SplitStages", "StagedProgram", "StageIO"]


class StagedProgram(nn.Module):
    """``stage_0 … stage_{S-1}`` run in order; each stage's outputs are the next one's inputs."""

    def __init__(self, stages: list[fx.GraphModule], stage_io: list[StageIO]) -> None:
        super().__init__()
        for k, stage in enumerate(stages):
            self.add_module(f"stage_{k}", stage)
        self.num_stages = len(stages)
        self.stage_io = stage_io

    def stage(self, k: int) -> nn.Module:
        return getattr(self, f"stage_{k}")

    def forward(self, *args: Any) -> Any:
        out: Any = args
        for k in range(self.num_stages):
            out = self.stage(k)(*out)
            if k < self.num_stages - 1 and not isinstance(out, tuple):
                out = (out,)
        return out


def _to_meta(value: Any) -> torch.Tensor:
    return torch.empty(value.shape, dtype=value.dtype, device="meta")


class SplitStages(RewritePass):
    """Outlined graph → :class:`StagedProgram` (see the module docstring).

    ``example_inputs``: one microbatch of the model's inputs, in placeholder order.
    """

    name = "split-stages"

    def __init__(self, example_inputs: tuple[torch.Tensor, ...]) -> None:
        self.example_inputs = example_inputs

    def _stage_of_call(self, plan: "Plan", num_layers: int) -> dict[str, int]:
        stages = plan.stages
        covered = [i for s in stages for i in range(*s.layers)]
        if covered != list(range(num_layers)):
            raise self.error(
                f"stages {[s.layers for s in stages]} do not tile blocks 0…{num_layers - 1} in order"
            )
        owner = {f"layer_{i}": s.index for s in stages for i in range(*s.layers)}
        owner[EMBED] = next((s.index for s in stages if s.has_embedding), stages[0].index)
        owner[HEAD] = next((s.index for s in stages if s.has_head), stages[-1].index)
        return owner

    def _example_values(self, gm: fx.GraphModule) -> dict[str, Any]:
        values: dict[str, Any] = {}

        class Recorder(fx.Interpreter):
            def run_node(self, node: fx.Node) -> Any:
                values[node.name] = result = super().run_node(node)
                return result

        # parameters on meta (per-stage build) take part as fake tensors on the inputs' device
        device = self.example_inputs[0].device if self.example_inputs else torch.device("cpu")
        tensors = [*gm.named_parameters(remove_duplicate=False),
                   *gm.named_buffers(remove_duplicate=False)]
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = {name: torch.empty(t.shape, dtype=t.dtype, device=device)
                     for name, t in tensors if t.is_meta}
            with _reparametrize_module(gm, fakes) if fakes else contextlib.nullcontext():
                Recorder(gm).run(*(mode.from_tensor(x) for x in self.example_inputs))
        return values

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        num_stages = max(len(plan.stages), 1)
        num_layers = getattr(gm, "meta", {}).get("fxplan_num_layers")
        if num_layers is None and num_stages > 1:
            raise self.error("the graph is not outlined into blocks (run outline-layers first)")
        owner = self._stage_of_call(plan, num_layers) if num_stages > 1 else {}
        stage: dict[fx.Node, int] = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                stage[node] = -1
            elif num_stages == 1 and node.op not in ("output", "get_attr"):
                stage[node] = 0
            elif node.op == "call_module":
                stage[node] = owner[node.target]
            elif node.op == "get_attr":  # a buffer/parameter read at the top: copied per user stage
                continue
            elif node.op == "call_function":  # getitem of a multi-output block
                stage[node] = max(stage.get(a, -1) for a in node.all_input_nodes)
            elif node.op != "output":
                raise self.error(f"unexpected {node.op} at the top of an outlined graph", node)
        values = self._example_values(gm)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        last_use = {n: max((num_stages if u.op == "output" else stage[u]) for u in n.users)
                    if n.users else -1 for n in stage}
        crossing = [
            [n for n in stage if stage[n] <= k < last_use[n] and isinstance(values[n.name], torch.Tensor)]
            for k in range(num_stages)
        ]
        inputs = [[n for n in gm.graph.nodes
                    if n.op == "placeholder" and isinstance(values.get(n.name), torch.Tensor)]] + crossing[:-1]
        graphs, io = [], []
        for k in range(num_stages):
            graph = fx.Graph()
            env: dict[fx.Node, Any] = {n: graph.placeholder(n.name) for n in inputs[k]}

            def lookup(a: fx.Node) -> Any:
                if a not in env and a.op == "get_attr":
                    env[a] = graph.node_copy(a)
                return env[a] if a in env else values[a.name]

            for node in gm.graph.nodes:
                if stage.get(node) == k:
                    env[node] = graph.node_copy(node, lookup)
            if k == num_stages - 1:
                graph.output(fx.map_arg(output.args[0], lambda a: env[a]))
                outs = fx.map_arg(output.args[0], lambda a: values[a.name])
                outs = outs if isinstance(outs, tuple) else (outs,)
            else:
                result = [env[n] for n in crossing[k]]
                graph.output(result[0] if len(result) == 1 else tuple(result))
                outs = tuple(values[n.name] for n in crossing[k])
            graphs.append(fx.GraphModule(gm, graph, class_name=f"Stage{k}"))
            io.append(StageIO(tuple(_to_meta(values[n.name]) for n in inputs[k]),
                              tuple(_to_meta(o) for o in outs)))
        return PassResult(StagedProgram(graphs, io), True)
