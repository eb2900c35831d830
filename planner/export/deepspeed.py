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
ZeRO-3 only) with ``"device": "cpu"``; FP8 is Transformer Engine in the model code (a note). DeepSpeed computes
``train_batch_size = micro · accumulation · dp`` with ``dp = world / (tp · pp)``.
"""

from __future__ import annotations

import json
from typing import Any

from fxplan.core.json_object import parse_json_object
from fxplan.export.errors import ExportError
from fxplan.export.target_config import TargetConfig

__all__ = ["export", "parse"]

_DTYPE_KEYS = {"bfloat16": "bf16", "float16": "fp16"}


def export(target: TargetConfig) -> tuple[str, list[str]]:
    """A DeepSpeed ``ds_config`` JSON for ``target`` and the notes on what it leaves to code."""
    notes: list[str] = []
    config: dict[str, Any] = {
        "train_batch_size": target.global_batch,
        "train_micro_batch_size_per_gpu": target.microbatch_size,
        "gradient_accumulation_steps": target.num_microbatches,
        "zero_optimization": {"stage": target.zero_stage or 0},
    }
    if target.offload not in (None, "none"):
        zero = config["zero_optimization"]
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if target.offload == "optimizer+params":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if target.dtype in _DTYPE_KEYS:
        config[_DTYPE_KEYS[target.dtype]] = {"enabled": True}
    if target.fp8:
        notes.append("not in ds_config: FP8 matrix products come from Transformer Engine "
                     "layers in the model code (te.Linear under te.fp8_autocast)")
    tp, pp = target.tp or 1, target.pp or 1
    if (target.cp or 1) > 1:
        notes.append(f"approximated: DeepSpeed has no context parallelism with K/V all-gather "
                     f"(the plan's cp={target.cp}); the nearest is DeepSpeed-Ulysses sequence "
                     f"parallelism in the model code (Megatron-DeepSpeed "
                     f"--ds-sequence-parallel-size {target.cp}: all-to-alls over the attention "
                     "heads, other traffic than planned); train_batch_size counts the "
                     f"dp/cp = {(target.dp or 1) // target.cp} data-parallel replicas")
    if tp > 1:
        notes.append(f"not in ds_config: tensor parallelism (tp={tp}"
                     + (", sequence parallel" if target.sequence_parallel else "")
                     + ") comes from the model's mpu, e.g. Megatron-DeepSpeed "
                     f"--tensor-model-parallel-size {tp}"
                     + (" --sequence-parallel" if target.sequence_parallel else "")
                     + (" --tp-comm-overlap" if target.tp_comm_overlap else ""))
    if pp > 1:
        notes.append(_pipeline_note(target, pp))
    if target.param_gather_overlap:
        notes.append("not exported: the plan hides the updated parameters' all-gather behind "
                     "the next step's forward (Megatron-Core --overlap-param-gather); DeepSpeed "
                     "ZeRO-1/2 gathers them at the end of its step")
    if target.recompute and target.recompute != "none":
        notes.append(f"not in ds_config: {target.recompute} activation recompute is applied "
                     "in the model code (deepspeed.checkpointing.checkpoint around each "
                     + ("layer" if target.recompute == "full" else "attention core")
                     + "); ds_config's \"activation_checkpointing\" only tunes it")
    return json.dumps(config, indent=2) + "\n", notes


def _pipeline_note(target: TargetConfig, pp: int) -> str:
    note = (f"not in ds_config: pipeline parallelism (pp={pp}) is set in code, "
            f"deepspeed.pipe.PipelineModule(layers, num_stages={pp}"
            + (", partition_method=\"parameters\"" if target.stage_layers else "")
            + "); its engine runs its own 1F1B-style schedule")
    if target.schedule != "1f1b":
        note += f" (approximated: the plan's {target.schedule} is not available)"
    if target.stage_layers is not None:
        note += (f"; the planned stages {'/'.join(map(str, target.stage_layers))} are "
                 "approximated by DeepSpeed's partitioning")
    if (target.zero_stage or 0) >= 2:
        note += (f"; DeepSpeed's pipeline engine supports ZeRO stages 0 and 1 only, not "
                 f"the plan's ZeRO-{target.zero_stage}")
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
    return TargetConfig(
        dp=batch // (mb * steps), microbatch_size=mb, num_microbatches=steps,
        global_batch=batch, zero_stage=int(data.get("zero_optimization", {}).get("stage", 0)),
        dtype=dtype, offload=offload,
    )


def _on_cpu(zero: Any, key: str) -> bool:
    """Whether ``zero_optimization[key]`` offloads to the host (``"device": "cpu"``)."""
    entry = zero.get(key) if isinstance(zero, dict) else None
    return isinstance(entry, dict) and entry.get("device") == "cpu"
