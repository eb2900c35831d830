"""Reshard costs on a (dp=2, tp=8) mesh of two DGX A100 nodes, by hand.

tp is one node's NVSwitch: 231 GB/s per GPU, hop 2 µs; dp spans the nodes, one GPU per node:
a 24 GB/s rail, hop 8 µs; base latency 6 µs. The tensor is 8192 × 4096 bf16 = 64 MiB.
"""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.core.placements import Partial, Replicate, Shard
from fxplan.cost_model.comm.reshard import reshard_cost

SHAPE = (8192, 4096)
FULL = 8192 * 4096 * 2
US = 1e-6


@pytest.fixture(scope="module")
def mesh() -> LogicalMesh:
    return LogicalMesh(Cluster.load("dgx-a100-80g:nodes=2"), (2, 8), ("dp", "tp"))


def tp_all_gather(nbytes: float) -> float:
    return 7 / 8 * nbytes / 231e9 + (6 + 7 * 2) * US


def tp_all_reduce(nbytes: float) -> float:
    return 2 * 7 / 8 * nbytes / 231e9 + (6 + 14 * 2) * US


def dp_all_reduce(nbytes: float) -> float:
    return 2 * 1 / 2 * nbytes / 24e9 + (6 + 2 * 8) * US


def test_single_axis_collectives(mesh: LogicalMesh) -> None:
    gather = reshard_cost("RS(0)", "RR", SHAPE, 2, mesh)
    assert gather.time_s == pytest.approx(tp_all_gather(FULL))
    assert [(s.axis, s.kind, s.nbytes) for s in gather.steps] == [("tp", "all_gather", FULL)]
    assert reshard_cost("RP", "RR", SHAPE, 2, mesh).time_s == pytest.approx(tp_all_reduce(FULL))
    scatter = reshard_cost("RP", "RS(1)", SHAPE, 2, mesh)
    assert scatter.time_s == pytest.approx(tp_all_gather(FULL))  # a reduce-scatter costs the same
    assert scatter.steps[0].kind == "reduce_scatter"


def test_all_to_all_between_shard_dims(mesh: LogicalMesh) -> None:
    cost = reshard_cost("RS(0)", "RS(1)", SHAPE, 2, mesh)
    local = FULL // 8
    assert cost.steps[0].kind == "all_to_all" and cost.steps[0].nbytes == local
    assert cost.time_s == pytest.approx(7 / 8 * local / 231e9 + (6 + 7 * 2) * US)


def test_local_steps_are_free(mesh: LogicalMesh) -> None:
    assert reshard_cost("RR", "S(0)S(1)", SHAPE, 2, mesh).time_s == 0.0
    to_partial = reshard_cost("RR", "RP", SHAPE, 2, mesh)
    assert to_partial.time_s == 0.0 and to_partial.steps[0].kind == "local"
    same = reshard_cost("S(0)R", "S(0)R", SHAPE, 2, mesh)
    assert same.time_s == 0.0 and same.steps == ()


def test_partial_on_both_axes_takes_the_reduce_scatter_detour(mesh: LogicalMesh) -> None:
    cost = reshard_cost("PP", "RR", SHAPE, 2, mesh)
    naive = dp_all_reduce(FULL) + tp_all_reduce(FULL)
    detour = tp_all_gather(FULL) + dp_all_reduce(FULL / 8) + tp_all_gather(FULL)
    assert [s.kind for s in cost.steps] == ["reduce_scatter", "all_reduce", "all_gather"]
    assert [s.axis for s in cost.steps] == ["tp", "dp", "tp"]
    assert cost.time_s == pytest.approx(detour)
    assert cost.time_s < naive / 3


def test_slice_before_reducing(mesh: LogicalMesh) -> None:
    cost = reshard_cost("PR", "S(0)S(1)", SHAPE, 2, mesh)
    assert [s.kind for s in cost.steps] == ["slice", "reduce_scatter"]
    quarter = FULL / 8  # the dp reduce-scatter moves the tp-sliced buffer
    assert cost.steps[1].nbytes == quarter
    assert cost.time_s == pytest.approx(1 / 2 * quarter / 24e9 + (6 + 8) * US)


def test_nested_shards_gather_inner_axis_first(mesh: LogicalMesh) -> None:
    cost = reshard_cost("S(0)S(0)", "S(0)R", SHAPE, 2, mesh)
    assert [(s.axis, s.kind) for s in cost.steps] == [("tp", "all_gather")]
    assert cost.time_s == pytest.approx(tp_all_gather(FULL / 2))
    full = reshard_cost("S(0)S(0)", "RR", SHAPE, 2, mesh)
    state = {"dp": "S(0)", "tp": "S(0)"}
    for step in full.steps:  # dp never moves a dim-0 shard while tp still splits dim 0
        assert state[step.axis] == step.src
        if step.axis == "dp" and "S(0)" in (step.src, step.dst):
            assert state["tp"] != "S(0)"
        state[step.axis] = step.dst
    assert state == {"dp": "R", "tp": "R"}
    naive = tp_all_gather(FULL / 2) + (1 / 2 * FULL / 24e9 + (6 + 8) * US)
    assert full.time_s < naive


def test_inputs_and_memoization(mesh: LogicalMesh) -> None:
    by_string = reshard_cost("S(0)P", "RS(-1)", SHAPE, 2, mesh)
    by_objects = reshard_cost((Shard(0), Partial()), (Replicate(), Shard(1)), SHAPE, 2, mesh)
    assert by_string == by_objects
    assert reshard_cost("S(0)P", "RS(1)", SHAPE, 2, mesh) is by_objects
    with pytest.raises(ValueError, match="2-D mesh"):
        reshard_cost("S(0)", "R", SHAPE, 2, mesh)
    with pytest.raises(ValueError, match="does not fit"):
        reshard_cost("S(2)R", "RR", SHAPE, 2, mesh)


def test_axis_of_size_one_is_free() -> None:
    mesh = LogicalMesh(Cluster.load("dgx-a100-80g"), (1, 8), ("dp", "tp"))
    assert reshard_cost("PR", "S(0)R", SHAPE, 2, mesh).time_s == 0.0
