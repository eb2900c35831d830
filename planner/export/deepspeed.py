"""The DeepSpeed format: a ``ds_config`` JSON (``train_batch_size``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``zero_optimization``,
``bf16``/``fp16``).

:func:`export` writes it from a :class:`TargetConfig`; :func:`parse` reads it back with
:mod:`json`. ``ds_config`` describes data parallelism, ZeRO and precision; the rest is set in
code and comes back as notes: tensor (and sequence) parallelism comes from the model's
``mpu`` (Megatron-DeepSpeed's ``--tensor-model-parallel-size``), pipelining from
``deepspeed.pipe.PipelineModule(num_stages=…)``, activation checkpointing from
``deepspeed.checkpointing.checkpoint`` calls in the model. Offload is
``zero_optimization.offload_optimizer`` (and ``offload_param`` for ``optimizer+params``,
ZeRO-3 only) with ``"device": "cpu"``; expert parallelism is AutoEP's ``expert_parallel``
(``autoep_size = ep``, ``preset_model`` for the models DeepSpeed has a preset for); FP8 is
Transformer Engine in the model code (a note). DeepSpeed computes
``train_batch_size = micro · accumulation · dp`` with ``dp`` the data-parallel world size of
the ``mpu`` passed to ``deepspeed.initialize`` (``world / (tp · pp · cp)``), which a note
spells out. With ``pp > 1`` the pipeline engine takes ZeRO stages 0–1 only: a ZeRO-2/3 plan
is written as ZeRO-1, with a note and its price.
"""

from __future__ import annotations

import json
from typing import Any

from fxplan.core.schedule import Schedule
from fxplan.core.json_object import parse_json_object
from fxplan.export.errors import ExportError
from fxplan.export.target_config import TargetConfig

__all__ = ["STATE_LAYOUT", "export", "parse"]

#: How DeepSpeed keeps the model states under ZeRO with bf16 or fp16 (the ZeRO paper's layout,
#: :data:`fxplan.cost_model.memory.breakdown.STATE_LAYOUTS`): 16-bit weights and gradients,
#: fp32 masters and moments in the optimizer's partitions.
STATE_LAYOUT = "megatron"

_DTYPE_KEYS = {"bfloat16": "bf16", "float16": "fp16"}
#: A word in fxplan's model spec → DeepSpeed's AutoEP ``preset_model`` (DeepSpeed 0.19.8's
#: ``auto_ep_presets.registry``).
_AUTOEP_PRESETS = {"mixtral": "mixtral", "qwen3-moe": "qwen3_moe", "qwen3_moe": "qwen3_moe",
                   "deepseek-v2": "deepseek_v2", "deepseek-v3": "deepseek_v3"}


def export(target: TargetConfig) -> tuple[str, list[str], dict[str, Any]]:
    """A DeepSpeed ``ds_config`` JSON for ``target``, the notes on what it leaves to code and
    the changes (:class:`~fxplan.core.config.ParallelConfig` fields) of the run it describes."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    tp, pp = target.tp or 1, target.pp or 1
    zero = target.zero_stage or 0
    if pp > 1 and zero >= 2:
        changes["zero_stage"] = zero = 1
        notes.append(f"changed: ZeRO-{target.zero_stage} is written as ZeRO-1 because "
                     "DeepSpeed's PipelineEngine asserts \"ZeRO-2 and ZeRO-3 are incompatible "
                     "with pipeline parallelism\": gradients"
                     + (" and parameters" if target.zero_stage == 3 else "")
                     + " stay replicated over data parallelism (more memory than planned)")
    config: dict[str, Any] = {
        "train_batch_size": target.global_batch,
        "train_micro_batch_size_per_gpu": target.microbatch_size,
        "gradient_accumulation_steps": target.num_microbatches,
        "zero_optimization": {"stage": zero},
    }
    if target.offload not in (None, "none"):
        offload = config["zero_optimization"]
        offload["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if target.offload == "optimizer+params":
            if zero == 3:
                offload["offload_param"] = {"device": "cpu", "pin_memory": True}
            else:
                changes["offload"] = "optimizer"
                notes.append("changed: parameter offload needs ZeRO-3 in DeepSpeed; only the "
                             "optimizer is offloaded (offload_optimizer)")
    if target.dtype in _DTYPE_KEYS:
        config[_DTYPE_KEYS[target.dtype]] = {"enabled": True}
    if (target.ep or 1) > 1:
        config["expert_parallel"] = _expert_parallel(target, notes)
    if target.fp8:
        notes.append("not in ds_config: FP8 matrix products come from Transformer Engine "
                     "layers in the model code (te.Linear under te.fp8_autocast)")
    if (target.cp or 1) > 1:
        notes.append(f"approximated, not priced: DeepSpeed has no context parallelism with "
                     f"K/V all-gather (the plan's cp={target.cp}); the nearest is "
                     f"DeepSpeed-Ulysses sequence parallelism in the model code "
                     f"(Megatron-DeepSpeed --ds-sequence-parallel-size {target.cp}: "
                     "all-to-alls over the attention heads, which fxplan's cost model does not "
                     "price); train_batch_size counts the "
                     f"dp/cp = {(target.dp or 1) // target.cp} data-parallel replicas")
    if tp > 1 or pp > 1 or (target.cp or 1) > 1:
        notes.append(_mpu_note(target))
    if tp > 1:
        notes.append(f"not in ds_config: tensor parallelism (tp={tp}"
                     + (", sequence parallel" if target.sequence_parallel else "")
                     + ") comes from the model's mpu, e.g. Megatron-DeepSpeed "
                     f"--tensor-model-parallel-size {tp}"
                     + (" --sequence-parallel" if target.sequence_parallel else "")
                     + (" --tp-comm-overlap" if target.tp_comm_overlap else ""))
    if pp > 1:
        notes.append(_pipeline_note(target, pp, changes))
    if target.param_gather_overlap:
        changes["param_gather_overlap"] = False
        notes.append("not exported: the plan hides the updated parameters' all-gather behind "
                     "the next step's forward (Megatron-Core --overlap-param-gather); DeepSpeed "
                     "ZeRO-1/2 gathers them at the end of its step")
    if target.recompute and target.recompute != "none":
        notes.append(f"not in ds_config: {target.recompute} activation recompute is applied "
                     "in the model code (deepspeed.checkpointing.checkpoint around each "
                     + ("layer" if target.recompute == "full" else "attention core")
                     + "); ds_config's \"activation_checkpointing\" only tunes it")
    return json.dumps(config, indent=2) + "\n", notes, changes


def _expert_parallel(target: TargetConfig, notes: list[str]) -> dict[str, Any]:
    """DeepSpeed's AutoEP section: ``autoep_size`` experts groups of ``ep`` ranks, with the
    model preset when DeepSpeed has one for the plan's model."""
    section: dict[str, Any] = {"enabled": True, "autoep_size": target.ep}
    preset = _autoep_preset(target.model)
    if preset is not None:
        section["preset_model"] = preset
    else:
        notes.append(f"expert_parallel: DeepSpeed's AutoEP has no preset for the plan's model "
                     f"{target.model!r} (it has {', '.join(_AUTOEP_PRESETS)}); set its "
                     "moe_layer_pattern, expert_pattern and router_pattern for your model")
    return section


def _autoep_preset(model: str | None) -> str | None:
    name = (model or "").lower()
    return next((preset for key, preset in _AUTOEP_PRESETS.items() if key in name), None)


def _mpu_note(target: TargetConfig) -> str:
    """The model-parallel unit ``deepspeed.initialize(mpu=…)`` must get: DeepSpeed reads its
    data-parallel world size from it (``train_batch_size = micro · accumulation · dp``)."""
    tp, pp, cp = target.tp or 1, target.pp or 1, target.cp or 1
    replicas = (target.dp or 1) // cp
    return (f"mpu: pass deepspeed.initialize(..., mpu=mpu) a model-parallel unit with "
            f"get_data_parallel_world_size() = {replicas}, "
            f"get_model_parallel_world_size() = get_tensor_model_parallel_world_size() = {tp}"
            + (f", get_pipeline_model_parallel_world_size() = {pp}" if pp > 1 else "")
            + (f", get_sequence_parallel_world_size() = {cp}" if cp > 1 else "")
            + " (Megatron-DeepSpeed's megatron.core.mpu"
            + (", or the PipeModelDataParallelTopology of the PipelineModule" if pp > 1 else "")
            + "); without it DeepSpeed counts every rank as data parallel and refuses "
            "train_batch_size")


def _pipeline_note(target: TargetConfig, pp: int, changes: dict[str, Any]) -> str:
    note = (f"not in ds_config: pipeline parallelism (pp={pp}) is set in code, "
            f"deepspeed.pipe.PipelineModule(layers, num_stages={pp}, "
            "partition_method=\"uniform\"); its engine runs its own 1F1B-style schedule")
    if target.schedule != "1f1b":
        changes["schedule"] = Schedule("1f1b")
        note += f" (approximated: the plan's {target.schedule} is not available)"
    if target.stage_layers is not None:
        changes["stage_layers"] = None
        note += (f"; the planned stages {'/'.join(map(str, target.stage_layers))} are "
                 "approximated by an even split")
    return note


def parse(text: str, *, world_size: int | None = None,
          layers: int | None = None) -> TargetConfig:
    """Read a ``ds_config`` JSON back into a :class:`TargetConfig` (``tp`` and ``pp`` are
    ``None``: the config does not hold them; ``world_size`` and ``layers`` are unused)."""
    data = parse_json_object(text, what="DeepSpeed config", error=ExportError)
    try:
        batch = int(data["train_batch_size"])
        mb = int(data["train_micro_batch_size_per_gpu"])
        steps = int(data.get("gradient_accumulation_steps", 1))
    except (KeyError, TypeError, ValueError) as err:
        raise ExportError(f"DeepSpeed config: needs integer train_batch_size and "
                          f"train_micro_batch_size_per_gpu ({type(err).__name__}: {err})"
                          ) from None
    dtype = next((d for d, key in _DTYPE_KEYS.items()
                  if data.get(key, {}).get("enabled")), "float32")
    zero = data.get("zero_optimization", {})
    offload = ("optimizer+params" if _on_cpu(zero, "offload_param")
               else "optimizer" if _on_cpu(zero, "offload_optimizer") else "none")
    expert = data.get("expert_parallel", {})
    return TargetConfig(
        dp=batch // (mb * steps), microbatch_size=mb, num_microbatches=steps,
        global_batch=batch, zero_stage=int(data.get("zero_optimization", {}).get("stage", 0)),
        dtype=dtype, offload=offload,
        ep=int(expert.get("autoep_size", 1)) if isinstance(expert, dict)
        and expert.get("enabled") else 1,
    )


def _on_cpu(zero: Any, key: str) -> bool:
    """Whether ``zero_optimization[key]`` offloads to the host (``"device": "cpu"``)."""
    entry = zero.get(key) if isinstance(zero, dict) else None
    return isinstance(entry, dict) and entry.get("device") == "cpu"
