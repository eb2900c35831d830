"""The torchtitan format: a job-config TOML (``train_configs/*.toml``, fields of
``torchtitan/config/job_config.py``) with ``[training]``, ``[parallelism]`` and
``[activation_checkpoint]``.

:func:`export` writes it from a :class:`TargetConfig`; :func:`parse` reads it back with
:mod:`tomllib`. The mapping:

* data parallelism: ZeRO-0 replicates (``data_parallel_replicate_degree = dp``, DDP); ZeRO-3
  shards (``data_parallel_shard_degree = dp``, FSDP with ``fsdp_reshard_after_forward =
  "always"``); ZeRO-1/2 have no counterpart, the closest is FSDP that keeps the parameters
  gathered from forward to backward (``"never"``), a note says so;
* sequence parallelism is implied by ``tensor_parallel_degree > 1``;
* batching: ``local_batch_size`` is per data-parallel rank; with pipelining it is split into
  microbatches of ``pipeline_parallel_microbatch_size``, without it the step accumulates
  ``global_batch_size / (dp · local_batch_size)`` gradients;
* context and expert parallelism: ``context_parallel_degree``, ``expert_parallel_degree``;
  torchtitan's mesh is ``replicate · shard · cp · tp · pp``, so its data-parallel degrees are
  fxplan's ``dp/cp`` (fxplan counts the CP ranks in ``dp``), and it shards the parameters over
  ``shard · cp`` (FSDP over the CP ranks too);
* offload: ``[training] enable_cpu_offload`` (FSDP2's ``CPUOffloadPolicy``: parameters,
  gradients and optimizer states on the host, i.e. ``optimizer+params``);
* FP8: ``[model] converters = ["float8"]`` (torchao's float8 training);
* stages: ``pipeline_parallel_layers_per_stage`` with the embedding and head counted as no
  layers (``pipeline_parallel_first/last_stage_less_layers``), which also expresses a first or
  last stage lighter than the rest.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

from fxplan.export.errors import ExportError
from fxplan.export.target_config import TargetConfig

__all__ = ["export", "parse"]

#: fxplan schedule kinds → torchtitan (``torch.distributed.pipelining``) schedule names.
_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
#: ``fsdp_reshard_after_forward`` → the ZeRO stage it reads as.
_RESHARD_ZERO = {"always": 3, "default": 3, "never": 2}
#: torchtitan's ``[training] mixed_precision_param`` choices.
_PARAM_DTYPES = ("bfloat16", "float32")


def export(target: TargetConfig) -> tuple[str, list[str]]:
    """A torchtitan job-config TOML for ``target`` and the notes on what it approximates."""
    notes: list[str] = []
    cp = target.cp or 1
    dp, tp, pp = (target.dp or 1) // cp, target.tp or 1, target.pp or 1
    mb, m = target.microbatch_size or 1, target.num_microbatches or 1
    training: dict[str, Any] = {
        "local_batch_size": mb * m if pp > 1 else mb,
        "global_batch_size": target.global_batch,
    }
    if target.seq is not None:
        training["seq_len"] = target.seq
    if target.dtype is not None:
        training["mixed_precision_param"] = _param_dtype(target.dtype, notes)
    parallelism: dict[str, Any] = _data_parallel(dp, target.zero_stage or 0, notes)
    parallelism["tensor_parallel_degree"] = tp
    parallelism["enable_async_tensor_parallel"] = False
    if tp > 1 and not target.sequence_parallel:
        notes.append(f"approximated: torchtitan always shards activations over the sequence "
                     f"with tensor parallelism (tp={tp}); the plan keeps them replicated "
                     "(sp=off), so torchtitan uses less activation memory and other "
                     "collectives than planned")
    parallelism["pipeline_parallel_degree"] = pp
    parallelism["context_parallel_degree"] = cp
    if cp > 1 and (target.zero_stage or 0) == 0:
        notes.append(f"approximated: torchtitan shards the parameters over the cp={cp} ranks "
                     "(FSDP over data_parallel_shard_degree · context_parallel_degree) where "
                     "the plan's ZeRO-0 replicates them")
    parallelism["expert_parallel_degree"] = target.ep or 1
    if target.offload not in (None, "none"):
        training["enable_cpu_offload"] = True
        if target.offload == "optimizer":
            notes.append("approximated: torchtitan's enable_cpu_offload is FSDP2's CPU offload, "
                         "which keeps the parameter shards on the host too (less device memory, "
                         "more host↔device copies than the plan's offload=optimizer)")
    if pp > 1:
        parallelism["pipeline_parallel_schedule"] = _SCHEDULES[(target.schedule or "1f1b")
                                                               .partition(":")[0]]
        parallelism["pipeline_parallel_microbatch_size"] = mb
        parallelism.update(_stage_layout(target, notes))
    checkpoint: dict[str, Any] = {"mode": target.recompute or "none"}
    if target.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
        notes.append("approximated: fxplan's selective recompute is the attention core "
                     "(Megatron's definition); torchtitan's per-op selective checkpointing "
                     "(selective_ac_option = \"op\") saves by its own op policy")
    if target.tp_comm_overlap:
        notes.append("not exported: the plan overlaps the tensor-parallel collectives with "
                     "their GEMMs (Megatron-Core --tp-comm-overlap); torchtitan's closest is "
                     "its async tensor parallelism under torch.compile, which is not priced "
                     "the same way")
    if target.param_gather_overlap:
        notes.append("not exported: the plan hides the updated parameters' all-gather behind "
                     "the next step's forward (Megatron-Core --overlap-param-gather); "
                     "torchtitan's FSDP prefetches per layer instead, which is not priced the "
                     "same way")
    sections = [("training", training), ("parallelism", parallelism),
                ("activation_checkpoint", checkpoint)]
    if target.fp8:
        sections.insert(0, ("model", {"converters": ["float8"]}))
    text = "\n".join(_section(name, body, tp) for name, body in sections)
    return text, notes


def _param_dtype(dtype: str, notes: list[str]) -> str:
    if dtype in _PARAM_DTYPES:
        return dtype
    notes.append(f"approximated: torchtitan's mixed_precision_param is bfloat16 or float32; "
                 f"the plan's {dtype} is exported as float32")
    return "float32"


def _data_parallel(dp: int, zero: int, notes: list[str]) -> dict[str, Any]:
    """Replicate/shard degrees and the FSDP resharding policy for ``dp`` and a ZeRO stage."""
    if dp == 1 or zero == 0:
        return {"data_parallel_replicate_degree": dp, "data_parallel_shard_degree": 1}
    if zero in (1, 2):
        notes.append(f"approximated: torchtitan has no ZeRO-{zero}; exported as FSDP over "
                     f"dp={dp} that keeps parameters gathered from forward to backward "
                     "(fsdp_reshard_after_forward = \"never\"): parameters are sharded between "
                     "steps too (less memory, an all-gather per step)")
        reshard = "never"
    else:
        reshard = "always"
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": dp,
            "fsdp_reshard_after_forward": reshard}


def _stage_layout(target: TargetConfig, notes: list[str]) -> dict[str, int]:
    """``pipeline_parallel_layers_per_stage`` and the first/last stage reductions."""
    pp, v = target.pp or 1, target.virtual_stages or 1
    if target.layers is None:
        notes.append("not exported: the layers per stage, which the plan does not record; "
                     "torchtitan splits the model itself"
                     + (f" (Interleaved1F1B into 2 stages per rank, the plan has {v})"
                        if v != 2 and v > 1 else ""))
        return {}
    counts = target.stage_layers or (target.layers // (pp * v),) * (pp * v)
    middle = counts[1:-1]
    per_stage = middle[0] if middle else max(counts[0], counts[-1])
    if any(c != per_stage for c in middle) or max(counts[0], counts[-1]) > per_stage:
        notes.append(f"approximated: torchtitan's layers_per_stage lets only the first and "
                     f"last stage hold fewer layers; the planned stages "
                     f"{'/'.join(map(str, counts))} are not exported and torchtitan splits "
                     "the layers itself")
        return {}
    return {"pipeline_parallel_layers_per_stage": per_stage,
            "pipeline_parallel_first_stage_less_layers": per_stage - counts[0],
            "pipeline_parallel_last_stage_less_layers": per_stage - counts[-1]}


def _section(name: str, body: dict[str, Any], tp: int) -> str:
    lines = [f"[{name}]"]
    if name == "parallelism" and tp > 1:
        lines.append("# sequence parallelism is implied by tensor_parallel_degree > 1")
    lines += [f"{key} = {_toml_value(value)}" for key, value in body.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def parse(text: str, *, world_size: int | None = None,
          layers: int | None = None) -> TargetConfig:
    """Read a torchtitan job-config TOML back into a :class:`TargetConfig`.

    ``layers`` (the model's, which the job config does not hold) gives the virtual stages and
    per-stage layers from ``pipeline_parallel_layers_per_stage``; ``world_size`` resolves a
    ``data_parallel_shard_degree`` of -1 (the leftover ranks).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ExportError(f"torchtitan config: not TOML: {err}") from err
    par, train = data.get("parallelism", {}), data.get("training", {})
    tp, pp = par.get("tensor_parallel_degree", 1), par.get("pipeline_parallel_degree", 1)
    replicate, shard = par.get("data_parallel_replicate_degree", 1), \
        par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        if world_size is None:
            raise ExportError("torchtitan config: data_parallel_shard_degree = -1 (the leftover "
                              "ranks) needs the world size")
        shard = world_size // (replicate * tp * pp * par.get("context_parallel_degree", 1))
    dp = replicate * shard      # replicas of samples: fxplan's dp/cp
    name = par.get("pipeline_parallel_schedule", "1F1B") if pp > 1 else "1F1B"
    kinds = {v: k for k, v in _SCHEDULES.items()}
    if name not in kinds:
        raise ExportError(f"torchtitan config: schedule {name!r} is not one of "
                          f"{', '.join(kinds)}")
    kind = kinds[name]
    local = train.get("local_batch_size", 8)
    mb = par.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    batch = train.get("global_batch_size", -1)
    batch = local * dp if batch == -1 else batch
    v, counts = _virtual_stages(par, kind, pp, layers)
    cp = par.get("context_parallel_degree", 1)
    return TargetConfig(
        dp=dp * cp, tp=tp, pp=pp,
        schedule=f"interleaved:{v}" if kind == "interleaved" else kind,
        virtual_stages=v, microbatch_size=mb, num_microbatches=batch // (dp * mb),
        global_batch=batch, sequence_parallel=tp > 1,
        recompute=data.get("activation_checkpoint", {}).get("mode", "selective"),
        zero_stage=_RESHARD_ZERO[par.get("fsdp_reshard_after_forward", "default")]
        if shard > 1 else 0,
        layers=layers, stage_layers=counts, seq=train.get("seq_len"),
        dtype=train.get("mixed_precision_param", "bfloat16"),
        cp=cp, ep=par.get("expert_parallel_degree", 1),
        offload="optimizer+params" if train.get("enable_cpu_offload") else "none",
        fp8="float8" in data.get("model", {}).get("converters", []),
    )


def _virtual_stages(par: dict[str, Any], kind: str, pp: int,
                    layers: int | None) -> tuple[int, tuple[int, ...] | None]:
    """Stages per rank and, when they differ, the layers of each virtual stage."""
    per_stage = par.get("pipeline_parallel_layers_per_stage")
    if pp == 1:
        return 1, None
    if per_stage is None or layers is None:
        return (2 if kind == "interleaved" else 1), None
    first = par.get("pipeline_parallel_first_stage_less_layers", 1)
    last = par.get("pipeline_parallel_last_stage_less_layers", 1)
    stages = math.ceil((layers + first + last) / per_stage)
    counts = (per_stage - first,) + (per_stage,) * (stages - 2) + (per_stage - last,)
    return stages // pp, counts if len(set(counts)) > 1 else None
