"""Plan: validation, one-line summary, JSON round trip, refusal of foreign plans."""

from __future__ import annotations

import json

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.core.placements import PlacementMap, parse_placements
from fxplan.core.plan import Plan, PlanError, SolverInfo, StageAssignment, load_plan

CONFIG = dict(pp=2, dp=2, tp=1, schedule="1f1b", microbatch_size=2, num_microbatches=4,
              zero_stage=1, recompute="none", sequence_parallel=True)


def make_plan(**overrides) -> Plan:
    """The test plan; ``overrides`` may name config fields (``schedule`` as text)."""
    config = {k: overrides.pop(k, v) for k, v in CONFIG.items()}
    config["schedule"] = Schedule.parse(config["schedule"])
    fields = dict(
        model="gpt-tiny",
        cluster="local-cpu:devices=4",
        graph_fingerprint="a" * 64,
        cluster_fingerprint="b" * 64,
        batch=16,
        seq=64,
        config=ParallelConfig(**config),
        stages=(StageAssignment(0, (0, 2), has_embedding=True), StageAssignment(1, (2, 4), has_head=True)),
        block_recompute=("none", "none", "selective", "selective"),
        placements=PlacementMap(params={"blocks.0.attn.qkv.weight": parse_placements("RS(0)")}),
        solver=SolverInfo(backend="highs", status="optimal", gap=0.0, time_s=0.12),
    )
    fields.update(overrides)
    return Plan(**fields)


def test_summary_line_names_every_dimension():
    plan = make_plan()
    assert plan.summary == "pp=2 dp=2 tp=1 | zero=1 | 1f1b mb=2×4 | recompute=mixed | sp=on"
    assert plan.degrees == {"pp": 2, "dp": 2, "tp": 1, "cp": 1, "ep": 1}
    assert plan.world_size == 4


def test_json_round_trip_is_identity(tmp_path):
    plan = make_plan(schedule="interleaved:2",
                     stages=tuple(StageAssignment(i, (i, i + 1), i == 0, i == 3) for i in range(4)))
    path = plan.save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["format_version"] == 2
    assert data["summary"].startswith("pp=2 dp=2 tp=1")
    assert load_plan(path) == plan


def test_batch_must_equal_dp_times_microbatching():
    with pytest.raises(PlanError, match=r"batch 15 ≠ dp·microbatch_size·num_microbatches = 2·2·4 = 16"):
        make_plan(batch=15)


def test_interleaved_needs_pp_times_v_stages():
    with pytest.raises(PlanError, match=r"2 stages given but pp·v = 2·3 = 6 expected"):
        make_plan(schedule="interleaved:3")


@pytest.mark.parametrize("schedule", ["zigzag", "interleaved:1", "interleaved:x"])
def test_unknown_schedule_is_refused(schedule):
    data = make_plan().to_dict()   # a schedule is text only in a plan file
    data["config"] = data["config"].replace("schedule=1f1b", f"schedule={schedule}")
    with pytest.raises(PlanError, match="is not one of gpipe, 1f1b, interleaved:v"):
        Plan.from_dict(data)


def test_plan_for_another_graph_or_cluster_or_world_size_is_refused(tmp_path):
    path = make_plan().save(tmp_path / "plan.json")
    with pytest.raises(PlanError, match=r"made for model 'gpt-tiny'"):
        load_plan(path, graph_fingerprint="c" * 64)
    with pytest.raises(PlanError, match=r"made for cluster 'local-cpu:devices=4'"):
        load_plan(path, cluster_fingerprint="d" * 64)
    with pytest.raises(PlanError, match=r"needs world size pp·dp·tp = 2·2·1 = 4, but 8"):
        make_plan().check_matches(world_size=8)


def test_other_format_versions_and_garbage_are_refused(tmp_path):
    data = make_plan().to_dict()
    data["format_version"] = 99
    bad = tmp_path / "v99.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="format_version 99 is not supported"):
        load_plan(bad)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(PlanError, match="not a JSON plan file"):
        load_plan(garbage)
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "missing.json")


@pytest.mark.parametrize("change,message", [
    (lambda d: d["solver"].update(extra=1), r"solver has unknown keys \['extra'\]"),
    (lambda d: d["stages"][0].pop("index"), r"stages\[0\] is missing key 'index'"),
    (lambda d: d["stages"][1].update(layers=[2]), r"stages\[1\]\.layers must be \[start, stop\]"),
    (lambda d: d.update(batch="16"), r"batch must be an integer, got '16'"),
    (lambda d: d.update(mesh_shape=[2, "2", 1]), r"mesh_shape\[1\] must be an integer"),
    (lambda d: d.update(stages=7), r"stages must be a list"),
    (lambda d: d.update(solver="highs"), r"solver must be an object"),
])
def test_malformed_fields_are_plan_errors_naming_the_key(change, message):
    data = json.loads(make_plan().to_json())
    change(data)
    with pytest.raises(PlanError, match=r"^plan\.json: " + message):
        Plan.from_dict(data, source="plan.json")


def test_format_version_1_files_are_refused_with_a_re_plan_hint():
    data = make_plan().to_dict()
    data["format_version"] = 1
    with pytest.raises(PlanError, match=r"format_version 1 is not supported.*re-run `fxplan plan`"):
        Plan.from_dict(data)


def test_per_block_recompute_overrides_the_config_policy():
    plan = make_plan()
    assert [plan.recompute(i) for i in range(4)] == ["none", "none", "selective", "selective"]
    uniform = make_plan(block_recompute=("none",) * 4)
    assert uniform.block_recompute is None and uniform.recompute_summary == "none"
    with pytest.raises(PlanError, match="block_recompute is 'full' for every block but the "
                                        "config's recompute is 'none'"):
        make_plan(block_recompute=("full",) * 4)
    with pytest.raises(PlanError, match="lists 3 policies but the stages hold 4"):
        make_plan(block_recompute=("none", "full", "none"))


def test_typed_placements_round_trip_and_derived_keys_are_checked():
    from fxplan.core.placements import DataEdge

    placements = PlacementMap(nodes={"ln": parse_placements("S(0)S(1)")},
                              inputs={DataEdge("qkv", "ln"): parse_placements("S(0)R")},
                              params={"w": parse_placements("RS(0)")})
    plan = make_plan(placements=placements)
    data = json.loads(plan.to_json())
    assert data["placements"]["inputs"] == [{"consumer": "qkv", "producer": "ln",
                                             "placements": "S(0)R"}]
    assert data["degrees"] == {"pp": 2, "dp": 2, "tp": 1, "cp": 1, "ep": 1}
    assert data["mesh_shape"] == [2, 2, 1] and data["offload"] == "none"
    assert Plan.from_dict(data) == plan
    data["mesh_shape"] = [1, 4, 1]
    with pytest.raises(PlanError, match=r"mesh_shape \[1, 4, 1\] disagrees with the config's "
                                        r"pp·dp·tp = 2·2·1"):
        Plan.from_dict(data)
    bad = json.loads(plan.to_json())
    bad["placements"]["nodes"]["ln"] = "S(0)"
    with pytest.raises(PlanError, match=r"key 'placements'.*must be one torch Placement per mesh "
                                        r"axis \('dp', 'tp'\)"):
        Plan.from_dict(bad)


def test_recompute_layers_per_stage_give_the_blocks_policies():
    """A configuration that recomputes the first k layers of each stage fills in the blocks'
    policies, the ones its estimate priced; one given beside it must agree."""
    config = ParallelConfig(pp=2, dp=2, microbatch_size=2, num_microbatches=4, zero_stage=1,
                            recompute="full", stage_layers=(2, 2), recompute_layers=(2, 1))
    plan = make_plan(config=config, block_recompute=None)
    assert plan.block_recompute == ("full", "full", "full", "none")
    assert plan.recompute_summary == "mixed" and plan.recompute(3) == "none"
    assert Plan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match="disagrees with the config's recompute_layers=2/1"):
        make_plan(config=config, block_recompute=("full", "none", "full", "none"))
