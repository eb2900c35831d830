"""The torchtitan format, for the torchtitan version the export targets
(:data:`fxplan.export.framework_tables` ``torchtitan.json``):

* ``current`` (the default; torchtitan's main branch, commit and date in the table): a Python
  config function returning ``Trainer.Config``, selected with ``--module/--config``
  (:mod:`fxplan.export.torchtitan_recipe` writes and reads it);
* a release, ``0.2.0`` … ``0.2.2`` (``--torchtitan-version``, or the installed torchtitan): a
  job-config TOML (``--job.config_file``) with ``[model]``, ``[training]``, ``[parallelism]``
  and ``[activation_checkpoint]``, written and read here.

Both write the same :func:`settings`:

* data parallelism: ZeRO-0 replicates (``data_parallel_replicate_degree = dp``); ZeRO-2 is
  FSDP that keeps the parameters gathered from forward to backward
  (``fsdp_reshard_after_forward = "never"``), ZeRO-3 FSDP that reshards (``"always"``); the
  policy is always written, torchtitan's ``"default"`` depends on pipelining. ZeRO-1 has no
  counterpart (FSDP ``"never"``, ZeRO-2, priced in a note); the releases refuse DDP beside
  tensor or pipeline parallelism ("DDP has not supported > 1D parallelism"), so a ZeRO-0 plan
  with ``tp`` or ``pp`` is written for them as FSDP ``"never"``, priced in a note;
* sequence parallelism: current torchtitan's ``enable_sequence_parallel``; the releases apply
  it with every ``tensor_parallel_degree > 1`` (a plan without it is priced with it);
* batching: the releases' ``local_batch_size`` is per data-parallel rank (with pipelining split
  into microbatches of ``pipeline_parallel_microbatch_size``); current torchtitan counts
  tokens: ``num_tokens_per_microbatch_per_dp_rank = mb · seq``, ``num_pp_microbatches = m``
  with pipelining, ``num_tokens_per_train_step = batch · seq``; either way the step
  accumulates ``batch / (dp · mb · m_pp)`` gradients;
* context and expert parallelism: ``context_parallel_degree``, ``expert_parallel_degree``;
  torchtitan's mesh is ``replicate · shard · cp · tp · pp``, so its data-parallel degrees are
  fxplan's ``dp/cp`` (fxplan counts the CP ranks in ``dp``), and it shards the parameters over
  ``shard · cp``; the releases exchange K/V by all-gather
  (``context_parallel_rotate_method = "allgather"``, what fxplan prices);
* offload: ``enable_cpu_offload`` (FSDP2's ``CPUOffloadPolicy``: parameters, gradients and
  optimizer states on the host, i.e. ``optimizer+params``);
* FP8: ``Float8LinearConverter`` (current) or ``converters = ["quantize.linear.float8"]``
  (releases): torchao's float8 training;
* stages: ``pipeline_parallel_layers_per_stage`` with the embedding and head counted as no
  layers (``pipeline_parallel_first/last_stage_less_layers``);
* the model: torchtitan's own model and flavor when fxplan's model is one of them
  (:data:`MODELS`); otherwise a note says torchtitan has no such model.

Every approximation is returned as a change of the plan's configuration, which
:func:`fxplan.export.export_plan` prices.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any

from fxplan.export.errors import ExportError
from fxplan.export.framework_tables import load_table
from fxplan.export.target_config import TargetConfig, without_zero_bubble
from fxplan.export.torchtitan_recipe import is_recipe, render, sections
from fxplan.export.torchtitan_settings import Settings

__all__ = ["MODELS", "STATE_LAYOUT", "export", "from_sections", "parse", "resolve_version",
           "settings"]

#: How torchtitan keeps the model states (one of
#: :data:`fxplan.cost_model.memory.breakdown.STATE_LAYOUTS`): FSDP2 over fp32 parameters,
#: gathered in bf16 (``mixed_precision_param``) and reduced in fp32 (``mixed_precision_reduce``),
#: as fxplan's runtime does.
STATE_LAYOUT = "runtime"

#: fxplan schedule kinds → torchtitan (``torch.distributed.pipelining``) schedule names.
_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}
#: ``fsdp_reshard_after_forward`` → the ZeRO stage it reads as (``default``: by pipelining).
_RESHARD_ZERO = {"always": 3, "never": 2}
#: torchtitan's ``[training] mixed_precision_param`` choices.
_PARAM_DTYPES = ("bfloat16", "float32")
#: A name in fxplan's model spec → torchtitan's model and flavor (Llama-3 shapes).
MODELS: dict[str, tuple[str, str]] = {
    "llama-3-8b": ("llama3", "8B"), "llama-3.1-8b": ("llama3", "8B"),
    "meta-llama-3-8b": ("llama3", "8B"), "llama-3-70b": ("llama3", "70B"),
    "llama-3.1-70b": ("llama3", "70B"), "meta-llama-3-70b": ("llama3", "70B"),
    "llama-3.1-405b": ("llama3", "405B"),
}
#: The release TOML's float8 converter name (torchtitan ≥ 0.2.0).
FLOAT8_CONVERTER = "quantize.linear.float8"


def resolve_version(version: str | None) -> str:
    """``current`` or a release the table has; ``None`` asks the installed torchtitan (its
    release when the table has it, ``current`` for a newer build or none installed)."""
    versions = load_table("torchtitan")["versions"]
    if version is None:
        version = _installed_version()
        if version is None or version not in versions:
            return "current"
    name = version.strip().lower().removeprefix("v")
    if name not in versions:
        raise ExportError(f"--torchtitan-version {version!r}: fxplan writes torchtitan "
                          f"{', '.join(versions)} (the TOML releases and the Python config "
                          "functions of current torchtitan); releases before 0.2.0 are not "
                          "supported")
    return name


def _installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torchtitan").split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def export(target: TargetConfig, *, version: str | None = None
           ) -> tuple[str, list[str], dict[str, Any]]:
    """torchtitan configuration for ``target`` (a Python config function for ``current``, a
    TOML for a release), the notes on what it approximates and the changes it runs."""
    s = settings(target, resolve_version(version))
    text = render(s) if s.version == "current" else _toml(s)
    return text, s.notes, s.changes


def settings(target: TargetConfig, version: str) -> Settings:
    """The :class:`Settings` of ``target`` for torchtitan ``version`` (module docstring)."""
    table = load_table("torchtitan")["versions"][version]
    model = _model(target.model, table)
    s = Settings(version=version, model=model)
    info = table["commit"][:12] + ", " + table["date"]
    s.notes.append(f"targets torchtitan {version} ({info})"
                   + (": a Python config function, run with --module/--config"
                      if version == "current" else ": a job-config TOML, run with "
                      "--job.config_file"))
    if model is None:
        s.notes.append(f"torchtitan {version} has no model for the plan's {target.model!r} "
                       f"(it has {', '.join(sorted(table['models']))}); the export names the "
                       "plan's model, which torchtitan refuses until such a model is "
                       "registered with it")
    cp = target.cp or 1
    dp, tp, pp = (target.dp or 1) // cp, target.tp or 1, target.pp or 1
    mb, m = target.microbatch_size or 1, target.num_microbatches or 1
    _batching(s, target, mb, m, pp)
    if target.dtype is not None:
        s.training["mixed_precision_param"] = _param_dtype(target.dtype, s.notes)
    if target.offload not in (None, "none"):
        s.training["enable_cpu_offload"] = True
        if target.offload == "optimizer":
            s.changes["offload"] = "optimizer+params"
            s.notes.append("approximated: torchtitan's CPU offload (FSDP2's CPUOffloadPolicy) "
                           "moves the parameters and gradients to the host too, where the plan "
                           "offloads the optimizer only")
    s.parallelism.update(_data_parallel(s, target, dp, cp, tp, pp))
    s.parallelism["tensor_parallel_degree"] = tp
    if tp > 1:
        _sequence_parallel(s, target, tp)
    s.parallelism["pipeline_parallel_degree"] = pp
    s.parallelism["context_parallel_degree"] = cp
    if cp > 1 and version != "current":
        s.parallelism["context_parallel_rotate_method"] = "allgather"
    s.parallelism["expert_parallel_degree"] = target.ep or 1
    if pp > 1:
        schedule = (without_zero_bubble(target, "this torchtitan's table", s.notes, s.changes)
                    or target.schedule or "1f1b")
        s.parallelism["pipeline_parallel_schedule"] = _SCHEDULES[schedule.split(":")[0]]
        s.parallelism.update(_stage_layout(target, s.notes, s.changes))
    s.recompute = target.recompute or "none"
    if target.recompute == "selective":
        s.notes.append("approximated, not priced: fxplan's selective recompute is the "
                       "attention core (Megatron's definition); torchtitan's selective "
                       "checkpointing saves by its own per-op policy")
    if target.tp_comm_overlap:
        s.changes["tp_comm_overlap"] = False
        s.notes.append("not exported: the plan overlaps the tensor-parallel collectives with "
                       "their GEMMs (Megatron-Core --tp-comm-overlap); torchtitan's closest is "
                       "async tensor parallelism under torch.compile, left off")
    if target.param_gather_overlap:
        s.changes["param_gather_overlap"] = False
        s.notes.append("not exported: the plan hides the updated parameters' all-gather behind "
                       "the next step's forward (Megatron-Core --overlap-param-gather); "
                       "torchtitan's FSDP prefetches per layer instead")
    s.fp8 = bool(target.fp8)
    return s


def _model(spec: str | None, table: dict[str, Any]) -> tuple[str, str] | None:
    """torchtitan's model and flavor for fxplan's model spec, when the version has it."""
    name = (spec or "").lower()
    for key, (model, flavor) in MODELS.items():
        if key in name and flavor in table["models"].get(model, ()):
            return model, flavor
    return None


def _batching(s: Settings, target: TargetConfig, mb: int, m: int, pp: int) -> None:
    seq = target.seq or 2048
    if s.version == "current":
        s.training["num_tokens_per_microbatch_per_dp_rank"] = mb * seq
        s.training["num_tokens_per_train_step"] = (target.global_batch or mb) * seq
        s.training["max_context_length"] = seq
        if pp > 1:
            s.parallelism["num_pp_microbatches"] = m
        return
    s.training["local_batch_size"] = mb * m if pp > 1 else mb
    s.training["global_batch_size"] = target.global_batch
    s.training["seq_len"] = seq
    if pp > 1:
        s.parallelism["pipeline_parallel_microbatch_size"] = mb


def _param_dtype(dtype: str, notes: list[str]) -> str:
    if dtype in _PARAM_DTYPES:
        return dtype
    notes.append(f"approximated: torchtitan's mixed_precision_param is bfloat16 or float32; "
                 f"the plan's {dtype} is exported as float32")
    return "float32"


def _sequence_parallel(s: Settings, target: TargetConfig, tp: int) -> None:
    if s.version == "current":
        s.parallelism["enable_sequence_parallel"] = bool(target.sequence_parallel)
    elif not target.sequence_parallel:
        s.changes["sequence_parallel"] = True
        s.notes.append(f"approximated: torchtitan {s.version} shards activations over the "
                       f"sequence with every tensor parallelism (tp={tp}); the plan keeps them "
                       "replicated (sp=off)")


def _data_parallel(s: Settings, target: TargetConfig, dp: int, cp: int, tp: int,
                   pp: int) -> dict[str, Any]:
    """Replicate/shard degrees and the FSDP resharding policy (module docstring)."""
    zero = target.zero_stage or 0
    fsdp = dp > 1 and zero > 0
    if dp > 1 and zero == 0 and (tp > 1 or pp > 1) and s.version != "current":
        fsdp = True
        s.changes["zero_stage"] = 2
        s.notes.append(f"changed: torchtitan {s.version} refuses DDP beside tensor or pipeline "
                       f"parallelism (\"DDP has not supported > 1D parallelism\"); the plan's "
                       f"ZeRO-0 over dp={dp} is written as FSDP that keeps the parameters "
                       "gathered from forward to backward (ZeRO-2: sharded gradients and "
                       "optimizer states, an all-gather per step)")
    elif zero == 1 and dp > 1:
        s.changes["zero_stage"] = 2
        s.notes.append(f"approximated: torchtitan has no ZeRO-1; written as FSDP over dp={dp} "
                       "that keeps the parameters gathered from forward to backward "
                       "(fsdp_reshard_after_forward = \"never\", ZeRO-2: gradients sharded too)")
    if cp > 1 and not fsdp and zero == 0:
        s.notes.append(f"approximated, not priced: torchtitan shards the parameters over the "
                       f"cp={cp} ranks (FSDP over data_parallel_shard_degree · "
                       "context_parallel_degree) where the plan's ZeRO-0 replicates them")
    if not fsdp:
        out: dict[str, Any] = {"data_parallel_replicate_degree": dp,
                               "data_parallel_shard_degree": 1}
        if cp > 1:   # FSDP over the cp ranks
            out["fsdp_reshard_after_forward"] = "always" if zero == 3 else "never"
        return out
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": dp,
            "fsdp_reshard_after_forward": "always" if zero == 3 else "never"}


def _stage_layout(target: TargetConfig, notes: list[str],
                  changes: dict[str, Any]) -> dict[str, int]:
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
        changes["stage_layers"] = None
        notes.append(f"approximated: torchtitan's layers_per_stage lets only the first and "
                     f"last stage hold fewer layers; the planned stages "
                     f"{'/'.join(map(str, counts))} are not exported and torchtitan splits "
                     "the layers itself (priced as an even split)")
        return {}
    return {"pipeline_parallel_layers_per_stage": per_stage,
            "pipeline_parallel_first_stage_less_layers": per_stage - counts[0],
            "pipeline_parallel_last_stage_less_layers": per_stage - counts[-1]}


def _toml(s: Settings) -> str:
    """The release job-config TOML of ``s``."""
    name, flavor = s.model if s.model is not None else (_UNKNOWN, "")
    model: dict[str, Any] = {"name": name}
    if flavor:
        model["flavor"] = flavor
    if s.fp8:
        model["converters"] = [FLOAT8_CONVERTER]
    checkpoint: dict[str, Any] = {"mode": s.recompute}
    if s.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    sections = [("model", model), ("training", s.training), ("parallelism", s.parallelism),
                ("activation_checkpoint", checkpoint)]
    header = f"# torchtitan {s.version}: torchrun ... -m torchtitan.train --job.config_file FILE\n"
    return header + "\n".join(_section(n, body) for n, body in sections)


#: The ``[model] name`` written when torchtitan has no model for the plan.
_UNKNOWN = "fxplan-model-not-in-torchtitan"


def _section(name: str, body: dict[str, Any]) -> str:
    lines = [f"[{name}]"] + [f"{key} = {_toml_value(value)}" for key, value in body.items()]
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
    """Read torchtitan configuration back into a :class:`TargetConfig`: a release TOML, or
    a Python config function written by :mod:`fxplan.export.torchtitan_recipe`.

    ``layers`` (the model's, which the config does not hold) gives the virtual stages and
    per-stage layers from ``pipeline_parallel_layers_per_stage``; ``world_size`` resolves a
    ``data_parallel_shard_degree`` of -1 (the leftover ranks).
    """
    if is_recipe(text):
        return from_sections(sections(text), world_size=world_size, layers=layers)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ExportError(f"torchtitan config: not TOML: {err}") from err
    return from_sections(data, world_size=world_size, layers=layers)


def from_sections(data: dict[str, Any], *, world_size: int | None,
                  layers: int | None) -> TargetConfig:
    """A :class:`TargetConfig` from torchtitan's sections (release keys, or current ones:
    token counts instead of sample counts)."""
    par, train = data.get("parallelism", {}), data.get("training", {})
    tp, pp = par.get("tensor_parallel_degree", 1), par.get("pipeline_parallel_degree", 1)
    cp = par.get("context_parallel_degree", 1)
    replicate, shard = par.get("data_parallel_replicate_degree", 1), \
        par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        if world_size is None:
            raise ExportError("torchtitan config: data_parallel_shard_degree = -1 (the leftover "
                              "ranks) needs the world size")
        shard = world_size // (replicate * tp * pp * cp)
    dp = replicate * shard      # replicas of samples: fxplan's dp/cp
    name = par.get("pipeline_parallel_schedule", "1F1B") if pp > 1 else "1F1B"
    kinds = {v: k for k, v in _SCHEDULES.items()}
    if name not in kinds:
        raise ExportError(f"torchtitan config: schedule {name!r} is not one of "
                          f"{', '.join(kinds)}")
    kind = kinds[name]
    mb, m, batch, seq = _batch_back(train, par, dp, pp)
    v, counts = _virtual_stages(par, kind, pp, layers)
    policy = par.get("fsdp_reshard_after_forward", "default")
    if policy == "default":
        policy = "never" if pp > 1 else "always"
    converters = data.get("model", {}).get("converters", [])
    return TargetConfig(
        dp=dp * cp, tp=tp, pp=pp,
        schedule=f"interleaved:{v}" if kind == "interleaved" else kind,
        virtual_stages=v, microbatch_size=mb, num_microbatches=m,
        global_batch=batch,
        sequence_parallel=tp > 1 and par.get("enable_sequence_parallel", True),
        recompute=data.get("activation_checkpoint", {}).get("mode", "selective"),
        zero_stage=_RESHARD_ZERO[policy] if shard > 1 else 0,
        layers=layers, stage_layers=counts, seq=seq,
        dtype=train.get("mixed_precision_param", "bfloat16"),
        cp=cp, ep=par.get("expert_parallel_degree", 1),
        offload="optimizer+params" if train.get("enable_cpu_offload") else "none",
        fp8=FLOAT8_CONVERTER in converters or "Float8LinearConverter" in converters,
        cp_comm=(par.get("context_parallel_rotate_method", "allgather").replace(
            "allgather", "all_gather") if cp > 1 else None),
    )


def _batch_back(train: dict[str, Any], par: dict[str, Any], dp: int,
                pp: int) -> tuple[int, int, int, int | None]:
    """``(mb, m, global batch, seq)`` from a release's sample counts or current token counts."""
    if "num_tokens_per_microbatch_per_dp_rank" in train:
        seq = train.get("max_context_length", 2048)
        mb = train["num_tokens_per_microbatch_per_dp_rank"] // seq
        m_pp = par.get("num_pp_microbatches", 1) if pp > 1 else 1
        step = train.get("num_tokens_per_train_step", -1)
        batch = mb * m_pp * dp if step == -1 else step // seq
        return mb, batch // (dp * mb), batch, seq
    local = train.get("local_batch_size", 8)
    mb = par.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    batch = train.get("global_batch_size", -1)
    batch = local * dp if batch == -1 else batch
    return mb, batch // (dp * mb), batch, train.get("seq_len")


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
