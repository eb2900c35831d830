"""Exports checked by the frameworks' own rules: DeepSpeed's ``DeepSpeedConfig`` (and AutoEP's
validator) with the plan's data-parallel world size, Megatron-LM's and torchtitan's flags, keys
and cross-checks from the tables read at a named commit (``planner/export/data/``), and the
note that prices what an export runs differently from the plan."""

from __future__ import annotations

import ast
import json
import tomllib
from dataclasses import replace

import pytest
from export_plans import MORE, PLANS, make_plan

from fxplan.core.plan import Plan
from fxplan.export import export_plan, parse_export
from fxplan.export import torchtitan as titan_format
from fxplan.export.framework_checks import megatron_violations, torchtitan_violations
from fxplan.export.framework_tables import load_table

ALL = {**PLANS, **MORE}
VERSIONS = tuple(load_table("torchtitan")["versions"])


def _with_model(plan: Plan, model: str) -> Plan:
    return replace(plan, model=model)


@pytest.mark.parametrize("name", ALL)
def test_megatron_arguments_pass_its_parser_and_validate_args_rules(name: str) -> None:
    """Every flag known with a valid value, each companion flag present (--overlap-param-gather
    with --overlap-grad-reduce, --optimizer-cpu-offload with --use-precision-aware-optimizer,
    Megatron-FSDP with --ckpt-format fsdp_dtensor), CUDA_DEVICE_MAX_CONNECTIONS as required."""
    text = export_plan(ALL[name], "megatron", price=False).text
    assert megatron_violations(text) == [], text


def test_megatron_table_catches_what_the_old_export_wrote() -> None:
    old = ("--tensor-model-parallel-size 4 \\\n--use-distributed-optimizer \\\n"
           "--overlap-param-gather \\\n--optimizer-cpu-offload\n")
    assert megatron_violations(old) == [
        "Must use --overlap-param-gather with --overlap-grad-reduce",
        "The optimizer cpu offload must be used in conjunction with "
        "`--use-precision-aware-optimizer`",
        "Using tensor model parallelism or context parallelism require setting the "
        "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"]
    fsdp = "--use-megatron-fsdp\n"
    assert megatron_violations(fsdp) == ["Megatron-FSDP requires the `fsdp_dtensor` "
                                         "checkpointing format."]


@pytest.mark.parametrize("zero,strategy", [(2, "optim_grads"), (3, "optim_grads_params")])
def test_megatron_zero2_3_is_megatron_fsdp(zero: int, strategy: str) -> None:
    plan = make_plan(f"dp=4,tp=2,pp=1,mb=2,schedule=1f1b,zero={zero},recompute=full,sp=on",
                     batch=16, layers=(8,))
    result = export_plan(plan, "megatron", price=False)
    words = result.text.split()
    for flag in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
                 "--ckpt-format", "fsdp_dtensor"):
        assert flag in words
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in result.text
    assert not any("no ZeRO" in n for n in result.notes)
    assert parse_export(result.text, "megatron", world_size=8).zero_stage == zero


def test_megatron_offload_at_zero0_is_the_distributed_optimizer_with_a_note() -> None:
    result = export_plan(MORE["offload-zero0"], "megatron", price=False)
    assert "--use-distributed-optimizer" in result.text.split()
    assert any(n.startswith("changed: Megatron-LM offloads the distributed optimizer's shards")
               for n in result.notes)


def test_megatron_says_the_environment_tensor_parallelism_needs() -> None:
    result = export_plan(PLANS["tp-sp"], "megatron", price=False)
    assert result.text.startswith("# environment: export CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    assert any(n.startswith("environment: export CUDA_DEVICE_MAX_CONNECTIONS=1")
               for n in result.notes)
    assert "CUDA_DEVICE" not in export_plan(PLANS["dp-only"], "megatron", price=False).text


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ALL)
def test_torchtitan_config_passes_each_versions_keys_and_checks(name: str,
                                                                version: str) -> None:
    plan = _with_model(ALL[name], "hf:llama-3-8b")   # a model torchtitan has
    result = export_plan(plan, "torchtitan", torchtitan_version=version, price=False)
    assert torchtitan_violations(result.text, version, world_size=plan.world_size) == [], \
        result.text
    assert any(n.startswith(f"targets torchtitan {version} (") for n in result.notes)


def test_torchtitan_table_catches_what_the_old_export_wrote() -> None:
    old = ('[model]\nconverters = ["float8"]\n[parallelism]\n'
           'data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 1\n'
           'tensor_parallel_degree = 4\n')
    assert torchtitan_violations(old, "0.2.2") == [
        "KeyError: 'float8' (no such model converter)",
        "RuntimeError: DDP has not supported > 1D parallelism"]


def test_torchtitan_zero0_with_model_parallelism_is_fsdp_in_the_releases() -> None:
    plan = MORE["zero0-tp-pp"]
    release = export_plan(plan, "torchtitan", torchtitan_version="0.2.2", price=False)
    par = tomllib.loads(release.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["fsdp_reshard_after_forward"]) == (1, 2, "never")
    assert any("DDP has not supported > 1D parallelism" in n for n in release.notes)
    current = titan_format.parse(export_plan(plan, "torchtitan", price=False).text)
    assert (current.dp, current.zero_stage) == (2, 0)   # current torchtitan replicates


def test_torchtitan_zero2_keeps_parameters_gathered() -> None:
    for version in VERSIONS:
        text = export_plan(MORE["zero2-dp"], "torchtitan", torchtitan_version=version,
                           price=False).text
        back = parse_export(text, "torchtitan")
        assert back.zero_stage == 2, version
        assert "fsdp_reshard_after_forward" in text


def test_torchtitan_current_is_a_config_function_and_its_command() -> None:
    plan = _with_model(PLANS["offload-fp8"], "hf:llama-3-8b")
    result = export_plan(plan, "torchtitan", torchtitan_version="current", price=False)
    tree = ast.parse(result.text)
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["fxplan_plan"]
    assert "--module fxplan_plan --config fxplan_plan" in result.text
    assert "--nproc_per_node=8" in result.text
    assert "model_registry('8B', converters=[Float8LinearConverter.Config()])" in result.text
    assert "config = llama3_8b()" in result.text
    assert "config.training.enable_cpu_offload = True" in result.text


def test_torchtitan_release_names_the_model_and_float8_converter() -> None:
    plan = _with_model(PLANS["offload-fp8"], "hf:llama-3-70b")
    data = tomllib.loads(export_plan(plan, "torchtitan", torchtitan_version="0.2.0",
                                     price=False).text)
    assert data["model"] == {"name": "llama3", "flavor": "70B",
                             "converters": ["quantize.linear.float8"]}


def test_torchtitan_says_when_it_has_no_such_model() -> None:
    for version in ("current", "0.2.2"):
        result = export_plan(PLANS["dp-only"], "torchtitan", torchtitan_version=version,
                             price=False)
        assert any("has no model for the plan's 'gpt-tiny:layers=8'" in n for n in result.notes)
        assert len(torchtitan_violations(result.text, version)) == 1   # the model, only


def test_torchtitan_sequence_parallel_off_is_exact_now_and_priced_in_the_releases() -> None:
    plan = MORE["tp-no-sp"]
    current = export_plan(plan, "torchtitan", price=False)
    assert "config.parallelism.enable_sequence_parallel = False" in current.text
    assert not any("sequence" in n for n in current.notes)
    release = export_plan(plan, "torchtitan", torchtitan_version="0.2.2", price=False)
    assert any("sp=off" in n for n in release.notes)


def test_torchtitan_version_follows_the_installed_release(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(titan_format, "_installed_version", lambda: "0.2.1")
    text = export_plan(PLANS["dp-only"], "torchtitan", price=False).text
    assert text.startswith("# torchtitan 0.2.1:")
    monkeypatch.setattr(titan_format, "_installed_version", lambda: "0.3.0.dev20260801")
    assert export_plan(PLANS["dp-only"], "torchtitan", price=False).text.startswith(
        "# fxplan torchtitan recipe for torchtitan current")


# -- DeepSpeed, through its own configuration classes -----------------------------------------

deepspeed_config = pytest.importorskip(
    "deepspeed.runtime.config",
    reason="deepspeed is not installed (pip install -e '.[export]', CPU only: "
    "DS_BUILD_OPS=0)")


@pytest.fixture
def rank0(monkeypatch):  # type: ignore[no-untyped-def]
    """DeepSpeedConfig as rank 0 of the plan's world: it asks ``deepspeed.comm`` for its rank
    (no process group here) and reads the data-parallel world size from the mpu."""
    monkeypatch.setattr(deepspeed_config.dist, "get_rank", lambda *a, **k: 0)


class _Mpu:
    """The model-parallel unit the export's note says to pass: DeepSpeed reads the
    data-parallel world size from it."""

    def __init__(self, dp: int, tp: int) -> None:
        self.dp, self.tp = dp, tp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.tp


@pytest.mark.parametrize("name", ALL)
def test_deepspeed_config_is_accepted_by_deepspeed(name: str, rank0: None) -> None:
    plan = ALL[name]
    result = export_plan(plan, "deepspeed", price=False)
    replicas = plan.dp // plan.config.cp
    config = deepspeed_config.DeepSpeedConfig(json.loads(result.text),
                                              mpu=_Mpu(replicas, plan.tp))
    assert config.world_size == replicas
    assert config.train_batch_size == plan.batch
    assert config.gradient_accumulation_steps == plan.num_microbatches
    if plan.pp > 1:   # PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline ..."
        from deepspeed.runtime.zero.config import ZeroStageEnum

        assert config.zero_optimization_stage < ZeroStageEnum.gradients
    if plan.tp > 1 or plan.pp > 1:
        assert any(n.startswith("mpu: pass deepspeed.initialize(..., mpu=mpu)")
                   and f"get_data_parallel_world_size() = {replicas}" in n
                   for n in result.notes)


def test_deepspeed_pipeline_zero3_is_written_as_zero1_with_a_note() -> None:
    result = export_plan(MORE["zero3-pp"], "deepspeed", price=False)
    assert json.loads(result.text)["zero_optimization"]["stage"] == 1
    assert any(n.startswith("changed: ZeRO-3 is written as ZeRO-1") for n in result.notes)


def test_deepspeed_writes_expert_parallelism_autoep_accepts(rank0: None) -> None:
    from deepspeed.module_inject.auto_ep_config import (
        parse_autoep_config, validate_autoep_config,
    )

    plan = make_plan("dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=off,ep=8",
                     batch=16, layers=(8,))
    plan = _with_model(plan, "hf:mixtral-8x7b")
    result = export_plan(plan, "deepspeed", price=False)
    data = json.loads(result.text)
    assert data["expert_parallel"] == {"enabled": True, "autoep_size": 8,
                                       "preset_model": "mixtral"}
    config = deepspeed_config.DeepSpeedConfig(data, mpu=_Mpu(8, 1))
    assert config.expert_parallel_config.autoep_size == 8
    validate_autoep_config(parse_autoep_config(data["expert_parallel"]), world_size=8,
                           pp_size=1, tp_size=1, sp_size=1, zero_stage=1)
    assert parse_export(result.text, "deepspeed").ep == 8


# -- fxplan's estimate of what an export runs differently ------------------------------------

@pytest.fixture(scope="module")
def real() -> tuple[str, str]:
    """The graph and cluster fingerprints of the test plans' model and cluster."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype

    cluster = Cluster.load(PLANS["dp-only"].cluster)
    graph = capture_for_search("gpt-tiny:layers=8", seq=64, dtype=training_dtype(cluster))
    return graph.fingerprint(), cluster.fingerprint()


def test_a_changed_run_is_priced_by_the_cost_model(real: tuple[str, str]) -> None:
    """The changes, and DeepSpeed's layout of the model states where the plan was priced in
    the runtime's (16-bit weights and gradients beside fp32 masters)."""
    plan = replace(MORE["zero3-pp"], graph_fingerprint=real[0], cluster_fingerprint=real[1])
    note = export_plan(plan, "deepspeed").notes[-1]
    assert note.startswith("fxplan's estimate of the run as exported (zero=1, model states in "
                           "Megatron-LM's layout: 16-bit weights and gradients, fp32 masters): "
                           "step ")
    assert "against the plan's" in note and "peak memory per rank" in note
    assert note.endswith("fits") or "does not fit: pipeline rank" in note
    megatron = replace(plan, estimate={**plan.estimate, "state_layout": "megatron"})
    assert export_plan(megatron, "deepspeed").notes[-1].startswith(
        "fxplan's estimate of the run as exported (zero=1): step ")


def test_an_exact_export_in_the_plans_layout_has_no_price_note(real: tuple[str, str]) -> None:
    """An exact export is priced only for the framework's layout of the model states: none
    for a plan priced in Megatron-LM's exported to Megatron-LM, one naming the layout for a
    plan priced in the runtime's; its ZeRO-3 states are 16 B per parameter over dp in both,
    so the peak memory differs by the buffers alone."""
    plan = replace(PLANS["zero3"], graph_fingerprint=real[0], cluster_fingerprint=real[1])
    megatron = replace(plan, estimate={**plan.estimate, "state_layout": "megatron"})
    assert not any("estimate of the run as exported" in n
                   for n in export_plan(megatron, "megatron").notes)
    note = export_plan(plan, "megatron").notes[-1]
    assert note.startswith("fxplan's estimate of the run as exported (model states in "
                           "Megatron-LM's layout: 16-bit weights and gradients, fp32 masters): "
                           "step "), note


def test_a_plan_that_cannot_be_rebuilt_says_it_is_not_priced() -> None:
    note = export_plan(MORE["gpipe"], "megatron").notes[-1]
    assert note.startswith("fxplan's estimate of the run as exported (schedule=1f1b, model "
                           "states in Megatron-LM's layout: 16-bit weights and gradients, fp32 "
                           "masters): not priced, the plan's model and cluster cannot be "
                           "rebuilt here")


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_dualpipev_is_approximated_as_zbv_is(target: str) -> None:
    """No framework table here has DualPipeV: Megatron-LM and torchtitan run the same two
    chunks per rank interleaved, DeepSpeed its own 1F1B, each said in a note."""
    notes = " ".join(export_plan(ALL["dualpipev"], target, price=False).notes)
    assert "dualpipev" in notes, notes
    assert ("interleaved:2" if target != "deepspeed" else "1F1B") in notes, notes
