"""``fxplan export``: Megatron-LM arguments, torchtitan config functions and TOML, and DeepSpeed
JSON that parse, keep the plan's degrees through a round trip, and say what they approximate
(the frameworks' own rules: ``tests/export/test_export_frameworks.py``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from export_plans import PLANS, make_plan

from fxplan.cli.export import TARGET_NAMES
from fxplan.cli.main import main
from fxplan.core.plan import Plan
from fxplan.export import TARGETS, TargetConfig, export_plan, parse_export

#: ``offload`` as each format reads it back: Megatron offloads the optimizer only, torchtitan
#: (FSDP2's CPU offload) the parameters too, DeepSpeed either.
OFFLOAD_BACK = {"megatron": {"none": "none", "optimizer": "optimizer",
                             "optimizer+params": "optimizer"},
                "torchtitan": {"none": "none", "optimizer": "optimizer+params",
                               "optimizer+params": "optimizer+params"},
                "deepspeed": {"none": "none", "optimizer": "optimizer",
                              "optimizer+params": "optimizer+params"}}

#: What each format expresses (and so must round-trip exactly).
ROUND_TRIP = {
    "megatron": ("dp", "tp", "pp", "schedule", "virtual_stages", "microbatch_size",
                 "num_microbatches", "global_batch", "sequence_parallel", "recompute", "layers",
                 "stage_layers", "seq", "dtype", "cp", "ep", "fp8", "tp_comm_overlap"),
    "torchtitan": ("dp", "tp", "pp", "schedule", "virtual_stages", "microbatch_size",
                   "num_microbatches", "global_batch", "sequence_parallel", "recompute",
                   "stage_layers", "seq", "dtype", "cp", "ep", "fp8"),
    "deepspeed": ("dp", "microbatch_size", "num_microbatches", "global_batch", "zero_stage",
                  "dtype"),
}


#: Each target, torchtitan in its current form (a Python function) and as a release TOML.
FORMS = (("megatron", None), ("torchtitan", "current"), ("torchtitan", "0.2.2"),
         ("deepspeed", None))


@pytest.mark.parametrize("name", PLANS)
@pytest.mark.parametrize("target,version", FORMS)
def test_round_trip_keeps_the_degrees(name: str, target: str, version: str | None) -> None:
    plan = PLANS[name]
    expected, _ = TargetConfig.from_plan(plan)
    result = export_plan(plan, target, torchtitan_version=version)
    if version == "current":
        compile(result.text, "fxplan_plan.py", "exec")   # parses as Python
    elif target == "torchtitan":
        tomllib.loads(result.text)   # parses as TOML
    elif target == "deepspeed":
        json.loads(result.text)      # parses as JSON
    back = parse_export(result.text, target, world_size=plan.world_size, layers=expected.layers)
    # ds_config holds no context parallelism: its dp is the dp/cp replicas of samples
    dp = plan.dp // plan.config.cp if target == "deepspeed" else plan.dp
    for field in ROUND_TRIP[target]:
        want = dp if field == "dp" else getattr(expected, field)
        assert getattr(back, field) == want, (name, target, field)
    assert (back.dp, back.microbatch_size, back.num_microbatches) == \
        (dp, plan.microbatch_size, plan.num_microbatches)
    assert back.offload == OFFLOAD_BACK[target][plan.offload], (name, target)
    if target == "megatron" or version == "0.2.2":
        assert back.cp_comm == expected.cp_comm, (name, target)   # the K/V all-gather priced


@pytest.mark.parametrize("name", PLANS)
def test_zero_stage_reads_back_as_the_closest_the_target_has(name: str) -> None:
    plan = PLANS[name]
    zero = plan.zero_stage
    megatron = parse_export(export_plan(plan, "megatron").text, "megatron",
                            world_size=plan.world_size)
    offload = plan.offload != "none"   # Megatron offloads the distributed optimizer's shards
    assert megatron.zero_stage == (max(zero, 1) if offload else zero)   # ZeRO-2/3: FSDP
    for version in ("current", "0.2.2"):
        titan = parse_export(export_plan(plan, "torchtitan", torchtitan_version=version).text,
                             "torchtitan", layers=8)
        # DDP, FSDP never/always reshard; the releases refuse DDP beside tp or pp
        ddp = 2 if version == "0.2.2" and plan.dp > 1 and (plan.tp > 1 or plan.pp > 1) else 0
        assert titan.zero_stage == {0: ddp, 1: 2, 2: 2, 3: 3}[zero], (name, version)


def test_megatron_arguments_name_the_real_options() -> None:
    text = export_plan(PLANS["pp-interleaved"], "megatron").text
    for option in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2",
                   "--num-layers-per-virtual-pipeline-stage 2", "--micro-batch-size 1",
                   "--global-batch-size 16", "--sequence-parallel",
                   "--recompute-granularity full", "--recompute-method uniform",
                   "--recompute-num-layers 1", "--use-distributed-optimizer", "--bf16",
                   "--overlap-grad-reduce"):
        assert option in text
    uneven = export_plan(PLANS["pp-uneven"], "megatron").text
    assert "--decoder-first-pipeline-num-layers 1" in uneven
    assert "--decoder-last-pipeline-num-layers 1" in uneven
    selective = export_plan(PLANS["tp-sp"], "megatron").text
    assert "--recompute-granularity selective" in selective and "--recompute-method" not in selective


def _titan_toml(plan: Plan, version: str = "0.2.2") -> dict:
    return tomllib.loads(export_plan(plan, "torchtitan", torchtitan_version=version).text)


def test_torchtitan_sections_and_data_parallel_mapping() -> None:
    dp_only = _titan_toml(PLANS["dp-only"])
    assert dp_only["parallelism"]["data_parallel_replicate_degree"] == 8
    assert dp_only["parallelism"]["data_parallel_shard_degree"] == 1
    assert dp_only["activation_checkpoint"] == {"mode": "none"}
    assert dp_only["training"] == {"local_batch_size": 2, "global_batch_size": 32, "seq_len": 64,
                                   "mixed_precision_param": "bfloat16"}
    zero3 = _titan_toml(PLANS["zero3"])["parallelism"]
    assert (zero3["data_parallel_shard_degree"], zero3["fsdp_reshard_after_forward"]) == (4, "always")
    pipe = _titan_toml(PLANS["pp-interleaved"])
    assert pipe["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert pipe["training"]["local_batch_size"] == 8   # mb·m per dp rank, split into microbatches


def test_deepspeed_batch_arithmetic() -> None:
    data = json.loads(export_plan(PLANS["zero3"], "deepspeed").text)
    assert data == {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                    "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3},
                    "bf16": {"enabled": True}}
    assert data["train_batch_size"] == (data["train_micro_batch_size_per_gpu"]
                                        * data["gradient_accumulation_steps"] * 4)


def test_notes_say_what_is_approximated() -> None:
    zero3 = export_plan(PLANS["zero3"], "megatron")
    assert "--use-megatron-fsdp" in zero3.text.split()
    assert any("CUDA_DEVICE_MAX_CONNECTIONS unset" in n for n in zero3.notes)
    gpipe = make_plan("dp=2,tp=1,pp=4,mb=1,schedule=gpipe,zero=0,recompute=none,sp=off",
                      batch=8, layers=(2, 2, 2, 2))
    assert any("no GPipe schedule" in n for n in export_plan(gpipe, "megatron").notes)
    ragged = make_plan("dp=2,tp=1,pp=4,mb=1,schedule=1f1b,zero=0,recompute=none,sp=off,"
                       "stages=2/3/1/2", batch=8, layers=(2, 3, 1, 2))
    megatron = export_plan(ragged, "megatron")
    assert "decoder-first" not in megatron.text
    assert any("2/3/1/2" in n and "only the first and last" in n for n in megatron.notes)
    assert any("2/3/1/2" in n for n in export_plan(ragged, "torchtitan").notes)
    deepspeed = export_plan(PLANS["pp-interleaved"], "deepspeed").notes
    assert any("tensor parallelism (tp=2" in n for n in deepspeed)
    assert any("num_stages=2" in n and "interleaved:2" in n for n in deepspeed)
    assert any("ZeRO-1" in n for n in export_plan(PLANS["tp-sp"], "torchtitan").notes)


def test_per_block_recompute_exports_the_strongest_policy_with_a_note() -> None:
    plan = make_plan("dp=2,tp=1,pp=4,mb=1,schedule=1f1b,zero=0,recompute=none,sp=off",
                     batch=8, layers=(2, 2, 2, 2),
                     block_recompute=("none",) * 4 + ("selective",) * 3 + ("full",))
    result = export_plan(plan, "megatron")
    assert "--recompute-granularity full" in result.text
    assert any("none×4, selective×3, full×1" in n for n in result.notes)


def test_precision_is_omitted_with_a_note_when_the_cluster_is_unknown(tmp_path: Path) -> None:
    plan = make_plan("dp=8,tp=1,pp=1,mb=2,schedule=1f1b,zero=0,recompute=none,sp=off",
                     batch=32, layers=(8,), cluster=str(tmp_path / "gone.yaml"))
    result = export_plan(plan, "deepspeed")
    assert "bf16" not in result.text and "fp16" not in result.text
    assert any(n.startswith("precision omitted") for n in result.notes)


def test_cli_prints_text_and_notes(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = PLANS["zero3"].save(tmp_path / "plan.json")
    assert main(["export", str(path), "--to", "megatron"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# environment: CUDA_DEVICE_MAX_CONNECTIONS unset (Megatron-FSDP)\n"
                          "--tensor-model-parallel-size 2 \\\n")
    assert err.startswith("note: environment: leave CUDA_DEVICE_MAX_CONNECTIONS unset")
    toml = tmp_path / "job.toml"
    assert main(["export", str(path), "--to", "torchtitan", "--torchtitan-version", "0.2.2",
                 "-o", str(toml)]) == 0
    assert tomllib.loads(toml.read_text())["parallelism"]["tensor_parallel_degree"] == 2
    assert main(["export", str(path), "--to", "DeepSpeed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "deepspeed" and json.loads(data["text"])["zero_optimization"]
    assert any("tensor parallelism" in n for n in data["notes"])


def test_cli_bad_inputs_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = PLANS["dp-only"].save(tmp_path / "plan.json")
    assert main(["export", str(path), "--to", "nemo"]) == 2
    assert "unknown export target 'nemo': expected one of megatron, torchtitan, deepspeed" \
        in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.json"), "--to", "megatron"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_help_lists_the_targets_the_package_has() -> None:
    assert TARGET_NAMES == TARGETS


def test_offload_fp8_cp_ep_use_each_frameworks_options() -> None:
    plan = PLANS["offload-fp8"]
    megatron = export_plan(plan, "megatron")
    for option in ("--context-parallel-size 1", "--expert-model-parallel-size 1",
                   "--optimizer-cpu-offload", "--fp8-format hybrid"):
        assert option in megatron.text, option
    assert any("parameters stay on the device" in n for n in megatron.notes)
    assert "--use-precision-aware-optimizer" in megatron.text.split()
    titan = _titan_toml(plan)
    assert titan["model"]["converters"] == ["quantize.linear.float8"]
    assert "converters=[Float8LinearConverter.Config()]" not in export_plan(
        plan, "torchtitan").text   # gpt-tiny is no torchtitan model: no registry to convert
    assert titan["training"]["enable_cpu_offload"] is True
    assert titan["parallelism"]["context_parallel_degree"] == 1
    assert titan["parallelism"]["expert_parallel_degree"] == 1
    ds = export_plan(plan, "deepspeed")
    zero = json.loads(ds.text)["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert any("Transformer Engine" in n for n in ds.notes)


def test_context_parallelism_in_each_format() -> None:
    """Megatron's and torchtitan's data-parallel sizes leave the CP ranks out (world /
    (tp·pp·cp)); DeepSpeed has no K/V all-gather context parallelism and says so."""
    plan = PLANS["context-parallel"]
    megatron = export_plan(plan, "megatron").text
    assert "--context-parallel-size 2" in megatron and "--cp-comm-type all_gather" in megatron
    assert megatron.startswith("# environment: CUDA_DEVICE_MAX_CONNECTIONS unset")  # FSDP
    titan = _titan_toml(plan)["parallelism"]
    assert (titan["context_parallel_degree"], titan["data_parallel_shard_degree"],
            titan["tensor_parallel_degree"]) == (2, 2, 2)
    ds = export_plan(plan, "deepspeed")
    assert json.loads(ds.text)["train_batch_size"] == 8
    assert any("no context parallelism" in n and "Ulysses" in n for n in ds.notes)


def test_tp_overlap_is_megatrons_tp_comm_overlap() -> None:
    megatron = export_plan(PLANS["tp-overlap"], "megatron")
    assert "--tp-comm-overlap" in megatron.text.split()
    assert "--tp-comm-overlap" not in export_plan(PLANS["tp-sp"], "megatron").text
    assert any("--tp-comm-overlap" in n for n in export_plan(PLANS["tp-overlap"],
                                                              "torchtitan").notes)


def test_pg_overlap_is_megatrons_overlap_param_gather() -> None:
    plan = make_plan("dp=2,tp=4,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=on,"
                     "pg_overlap=on", batch=16, layers=(8,))
    megatron = export_plan(plan, "megatron")
    words = megatron.text.split()
    assert "--overlap-param-gather" in words and "--use-distributed-optimizer" in words
    assert "--overlap-grad-reduce" in words   # Megatron refuses the one without the other
    assert parse_export(megatron.text, "megatron", world_size=8).param_gather_overlap
    assert "--overlap-param-gather" not in export_plan(PLANS["tp-sp"], "megatron").text
    for target in ("torchtitan", "deepspeed"):
        assert any("--overlap-param-gather" in n for n in export_plan(plan, target).notes)


def test_cli_no_price_skips_the_estimate(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    gpipe = make_plan("dp=2,tp=1,pp=4,mb=1,schedule=gpipe,zero=0,recompute=none,sp=off",
                      batch=8, layers=(2, 2, 2, 2))
    path = gpipe.save(tmp_path / "plan.json")
    assert main(["export", str(path), "--to", "megatron"]) == 0
    assert "fxplan's estimate of the run as exported" in capsys.readouterr().err
    assert main(["export", str(path), "--to", "megatron", "--no-price"]) == 0
    assert "fxplan's estimate" not in capsys.readouterr().err


def test_unknown_torchtitan_version_exits_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = PLANS["dp-only"].save(tmp_path / "plan.json")
    assert main(["export", str(path), "--to", "torchtitan", "--torchtitan-version",
                 "0.1.0"]) == 2
    assert "releases before 0.2.0 are not supported" in capsys.readouterr().err
    assert main(["export", str(path), "--to", "megatron", "--torchtitan-version",
                 "0.2.2"]) == 2
    assert "--torchtitan-version applies to --to torchtitan" in capsys.readouterr().err
