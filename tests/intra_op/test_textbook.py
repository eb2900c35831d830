"""Textbook strategies arise from the rules and the ILP on real captured graphs — no model
patterns, no parameter names: Megatron column/row tensor parallelism with sequence parallelism
and a vocabulary-parallel embedding and loss inside an A100 node; data parallelism on a batch
axis."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.passes.capture import CapturedGraph
from fxplan.api import capture
from fxplan.intra_op import IntraOpInfeasible, IntraOpSolution, solve_intra_op

WIDE_GPT = "gpt:layers=2,hidden=4096,heads=32,vocab=51200,seq=2048"


@lru_cache(maxsize=None)
def _graph(spec: str, batch: int, seq: int) -> CapturedGraph:
    return capture(spec, batch=batch, seq=seq, dtype=torch.bfloat16)


@lru_cache(maxsize=None)
def _mesh(size: int, name: str) -> LogicalMesh:
    return LogicalMesh(Cluster.load("dgx-a100-80g"), (size,), (name,))


@lru_cache(maxsize=None)
def _tp_solution() -> tuple[CapturedGraph, IntraOpSolution]:
    graph = _graph(WIDE_GPT, 1, 2048)
    return graph, solve_intra_op(graph, _mesh(8, "tp"))


def _layer0(graph: CapturedGraph, name: str) -> bool:
    return graph.info(name).layer == 0


def test_megatron_column_then_row_parallel_linears() -> None:
    graph, sol = _tp_solution()
    assert sol.status == "optimal" and sol.fallbacks == ()
    by_role = {}
    for name, placements in sol.param_placements.items():
        if name.startswith("h.0.") and name.endswith(".weight") and len(graph.params[name].shape) == 2:
            by_role[name] = placements
    assert by_role == {"h.0.attn.qkv.weight": "S(0)", "h.0.attn.proj.weight": "S(1)",
                       "h.0.mlp.fc1.weight": "S(0)", "h.0.mlp.fc2.weight": "S(1)"}
    assert sol.output_placement("h_0_attn_proj") == "P" and sol.output_placement("h_0_mlp_fc2") == "P"
    assert sol.notes["split"]  # the fused QKV output is split along its sharded dim: interleaved


def test_one_all_reduce_or_reduce_scatter_plus_all_gather_per_sub_block() -> None:
    graph, sol = _tp_solution()
    layer = [r for r in sol.reshards if _layer0(graph, r.consumer) or _layer0(graph, r.producer)]
    kinds = sorted((r.kinds[0], r.producer if r.kinds[0] != "all_gather" else r.consumer) for r in layer)
    sequence_parallel = [("all_gather", "h_0_attn_qkv"), ("all_gather", "h_0_mlp_fc1"),
                         ("reduce_scatter", "h_0_attn_proj"), ("reduce_scatter", "h_0_mlp_fc2")]
    plain = [("all_reduce", "h_0_attn_proj"), ("all_reduce", "h_0_mlp_fc2")]
    assert kinds in (sequence_parallel, plain), kinds


def test_sequence_parallel_norms_and_vocab_parallel_embedding_and_loss() -> None:
    graph, sol = _tp_solution()
    assert sol.output_placement("h_0_ln1") == "S(1)" and sol.output_placement("h_0_ln2") == "S(1)"
    assert sol.param_placements["wte.weight"] == "S(0)" and sol.output_placement("wte") == "P"
    loss = next(n for n in sol.placements if n.startswith("cross_entropy"))
    assert sol.input_placement(loss, 0) == "S(1)" and "vocab-parallel loss" in sol.notes[loss]


def test_data_parallel_on_a_batch_axis() -> None:
    graph = _graph("gpt:layers=2,hidden=256,heads=8,vocab=1024,seq=128", 64, 128)
    sol = solve_intra_op(graph, _mesh(8, "dp"))
    activations = [n for n, s in sol.placements.items()
                   if graph.info(n).layer is not None and graph.info(n).op_class in ("matmul", "norm", "softmax")]
    assert activations and all(sol.output_placement(n) == "S(0)" for n in activations)
    assert all(p == "R" for p in sol.param_placements.values())
    assert sol.reshards == () or all(r.kinds != ("all_gather",) for r in sol.reshards)


def test_a_memory_budget_forces_parameters_to_be_sharded() -> None:
    graph = _graph("gpt:layers=2,hidden=256,heads=8,vocab=1024,seq=128", 64, 128)
    free = solve_intra_op(graph, _mesh(8, "dp"))
    budget = 0.97 * free.memory_bytes  # the smallest footprint is ~0.89 of it
    capped = solve_intra_op(graph, _mesh(8, "dp"), memory_budget_bytes=budget)
    assert capped.memory_bytes <= budget < free.memory_bytes
    assert capped.objective_s > free.objective_s
    assert any(p != "R" for p in capped.param_placements.values())
    with pytest.raises(IntraOpInfeasible, match="GiB"):
        solve_intra_op(graph, _mesh(8, "dp"), memory_budget_bytes=1e3)
