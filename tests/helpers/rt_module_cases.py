"""Jobs the rank pool runs for the module-level runtime: a tiny Hugging Face Llama and a user
``nn.TransformerEncoder`` model train under a plan like one process, and their state dicts
round-trip between the sharded and the unsharded model."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.core.placements import PlacementMap, parse_placements
from fxplan.core.plan import Plan
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.apply.probe import model_output
from torch.distributed.tensor import DTensor
from rt_cases import train_steps
from rt_plans import stages_for

LR = 0.1
SEQ = 8
LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=4,"
         "num_key_value_heads=2,vocab_size=64,max_position_embeddings=16")
ENCODER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime",
                       "models", "encoder_lm.py:build")
ENCODER_WIDE = ENCODER + "_wide"
#: The Llama with its LM head tied to the embedding (one Parameter, two names).
LLAMA_TIED = LLAMA + ",tie_word_embeddings=True"
#: Hugging Face mixtures of experts (``transformers`` ≥ 5's routed experts modules): Mixtral
#: (4 experts, top-2) and Qwen2-MoE (4 experts, top-2, a gated shared expert; layer 1 sparse)
MIXTRAL = ("hf:mixtral:num_hidden_layers=2,hidden_size=32,intermediate_size=48,"
           "num_attention_heads=4,num_key_value_heads=2,num_local_experts=4,vocab_size=64,"
           "max_position_embeddings=16")
QWEN_MOE = ("hf:qwen2_moe:num_hidden_layers=2,hidden_size=32,intermediate_size=64,"
            "moe_intermediate_size=24,shared_expert_intermediate_size=32,num_attention_heads=4,"
            "num_key_value_heads=2,num_experts=4,num_experts_per_tok=2,vocab_size=64,"
            "max_position_embeddings=16,decoder_sparse_step=2")
#: Mixtral with the router's auxiliary loss in its training loss (``output_router_logits``;
#: a coefficient large enough that leaving it out, or computing it per replica, shows)
MIXTRAL_AUX = MIXTRAL + ",output_router_logits=True,router_aux_loss_coef=0.1"
#: The model spec of each kind of test model.
SPECS = {"llama": LLAMA, "llama-tied": LLAMA_TIED, "encoder": ENCODER,
         "encoder-wide": ENCODER_WIDE, "mixtral": MIXTRAL, "qwen-moe": QWEN_MOE,
         "mixtral-aux": MIXTRAL_AUX}
VOCAB = 64

_MEGATRON = {"q_proj": "S(0)", "k_proj": "S(0)", "v_proj": "S(0)", "o_proj": "S(1)",
             "gate_proj": "S(0)", "up_proj": "S(0)", "down_proj": "S(1)", "wq": "S(0)",
             "wk": "S(0)", "wv": "S(0)", "wo": "S(1)", "w1": "S(0)", "w3": "S(0)", "w2": "S(1)",
             "embed_tokens": "S(0)", "lm_head": "S(0)", "tok_embeddings": "S(0)",
             "output": "S(0)"}


def plan_for(model: torch.nn.Module, *, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
             sp: bool = False,
             zero: int = 0, layers: int = 2, overrides: dict[str, str] | None = None,
             microbatch_size: int = 2, num_microbatches: int = 1, schedule: str = "1f1b",
             seq: int = SEQ, recompute: str = "none") -> Plan:
    """A hand-made plan with Megatron placements over ``("dp", "tp")`` for ``model``."""
    params = {}
    for name, _ in model.named_parameters():
        module = name.rsplit(".", 2)[-2]
        token = _MEGATRON.get(module, "R") if tp > 1 and name.endswith("weight") else "R"
        params[name] = "R" + token
    params.update(overrides or {})
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, ep=ep, microbatch_size=microbatch_size,
                            num_microbatches=num_microbatches, sequence_parallel=sp,
                            zero_stage=zero, schedule=Schedule.parse(schedule),
                            recompute=recompute)
    return Plan(model="test", cluster="test", graph_fingerprint="t", cluster_fingerprint="t",
                batch=microbatch_size * num_microbatches * dp, seq=seq, config=config, stages=stages_for(layers, pp, 1),
                placements=PlacementMap(params={k: parse_placements(v) for k, v in params.items()}))



def build(kind: str, seed: int = 0, meta: bool = False) -> torch.nn.Module:
    """The tiny model ``kind`` (a key of :data:`SPECS`), seeded; ``meta``: parameters on meta."""
    import contextlib

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.build import meta_parameters

    torch.manual_seed(seed)
    with meta_parameters() if meta else contextlib.nullcontext():
        return resolve_model(SPECS[kind]).build("cpu")


def batch(plan: Plan, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (plan.batch, SEQ + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def reference(kind: str, plan: Plan, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and parameters of one process after ``steps`` SGD steps (with the router's
    auxiliary loss ``transformers`` returns, ``coef · aux_loss``, when the model has one)."""
    model = build(kind)
    tokens, targets = batch(plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        out = model(tokens)
        loss = lm_loss(model_output(out), targets)
        if getattr(out, "aux_loss", None) is not None:
            loss = loss + model.router_aux_loss_coef * out.aux_loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def train_matches_reference(kind: str, plan_json: str, steps: int = 3, meta: bool = False
                            ) -> dict[str, Any] | None:
    """Train ``steps`` SGD steps under the plan; errors against one process (every member
    reports; rank 0's report is the one tests read)."""
    plan = Plan.from_json(plan_json)
    tokens, targets = batch(plan)
    init = (lambda: build(kind)) if meta else None
    sharded = apply_plan(build(kind, meta=meta), plan, tokens, init=init)
    if sharded is None:
        return None
    losses = train_steps(sharded, sharded.optimizer(torch.optim.SGD, lr=LR), (tokens, targets),
                         steps)
    tied_equal = _tied_copies_equal(sharded, build(kind, meta=True))
    params = sharded.full_parameters()
    ref_losses, ref_params = reference(kind, plan, steps)
    errors = {k: _error(params[k], ref_params[k]) for k in ref_params if k in params}
    worst = max(errors, key=errors.get)
    unsharded = build(kind, seed=5)            # the gathered parameters load into the user's model
    result = unsharded.load_state_dict(params, strict=False)
    loaded = dict(unsharded.named_parameters(remove_duplicate=False))
    loads_back = not result.unexpected_keys and all(torch.equal(loaded[k], params[k])
                                                    for k in params)
    experts = {k: (tuple(p.to_local().shape), tuple(p.shape))
               for k, p in sharded.named_parameters().items()
               if isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ())}
    from rt_ep_cases import tp_split_names

    return dict(path=sharded.path, fallbacks=sharded.fallbacks, losses=losses, experts=experts,
                tp_split=tp_split_names(sharded),
                tied_equal=tied_equal, loads_back=loads_back,
                missing_on_load=sorted(result.missing_keys),
                ref_losses=ref_losses, missing=sorted(set(ref_params) - set(params)),
                extra=sorted(set(params) - set(ref_params)),
                loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                param_error=errors[worst], worst=worst)


def _tied_copies_equal(sharded: Any, model: torch.nn.Module) -> bool:
    """Every tied weight is one Parameter under all its names on each stage, and its copies on
    all ranks (pipeline stages, replicas) are equal after training (collective)."""
    import torch.distributed as dist

    from fxplan.runtime.apply.module_tied import tied_aliases

    aliases = tied_aliases(model)
    one_object = True
    for stage in sharded.stages:
        held: dict[str, Any] = {}
        for name, param in stage.inner.named_parameters(remove_duplicate=False):
            if name in aliases:
                one_object &= held.setdefault(aliases[name], param) is param
    local = {}
    for name, param in sharded.named_parameters().items():
        if name in set(aliases.values()):
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            local[name] = full.detach().cpu().clone()
    everyone: list[Any] = [None] * dist.get_world_size(sharded.group)
    dist.all_gather_object(everyone, local, group=sharded.group)
    copies: dict[str, list[torch.Tensor]] = {}
    for held_here in everyone:
        for name, value in (held_here or {}).items():
            copies.setdefault(name, []).append(value)
    return one_object and bool(copies) == bool(aliases) and all(
        torch.equal(c[0], other) for c in copies.values() for other in c[1:])


def state_dict_round_trip(kind: str, plan_json: str) -> dict[str, Any] | None:
    """HF-format (unsharded) state dict → sharded model → one step → gathered full state dict
    (``get_model_state_dict(full_state_dict=True)``) → the unsharded model, ``strict=True``."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)

    plan = Plan.from_json(plan_json)
    tokens, targets = batch(plan)
    source = build(kind, seed=3)                     # "the checkpoint": other values than seed 0
    saved = {k: v.clone() for k, v in source.state_dict().items()}
    sharded = apply_plan(build(kind), plan, tokens)
    if sharded is None:
        return None
    (stage,) = sharded.stages
    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(stage.inner, {k: v.clone() for k, v in saved.items()}, options=full)
    loaded = sharded.full_parameters()
    load_error = max(_error(loaded[k], saved[k]) for k in loaded)
    optimizer = sharded.optimizer(torch.optim.SGD, lr=LR)
    sharded.train_step((tokens, targets), lm_loss)
    optimizer.step()
    gathered = get_model_state_dict(stage.inner, options=full)
    trained = sharded.full_parameters()
    unsharded = build(kind, seed=5)
    unsharded.load_state_dict(gathered, strict=True)  # raises on any missing / unexpected key
    back_error = max(_error(unsharded.state_dict()[k], trained[k]) for k in trained)
    return dict(path=sharded.path, keys_equal=sorted(gathered) == sorted(saved),
                load_error=load_error, back_error=back_error,
                changed=max(_error(trained[k], saved[k]) for k in trained))


#: Tensor parallelism inside ``nn.TransformerEncoderLayer``'s MLP (``linear1`` column-,
#: ``linear2`` row-parallel), its ``nn.MultiheadAttention`` replicated.
ENCODER_MLP_TP = {f"encoder.layers.{i}.{name}": tp for i in range(2) for name, tp in (
    ("linear1.weight", "RS(0)"), ("linear1.bias", "RS(0)"), ("linear2.weight", "RS(1)"))}


#: Head-parallel ``nn.MultiheadAttention`` (fused ``in_proj`` rows per head group, ``out_proj``
#: row-parallel) on top of :data:`ENCODER_MLP_TP`.
ENCODER_TP = {**ENCODER_MLP_TP, **{f"encoder.layers.{i}.self_attn.{name}": tp for i in range(2)
                                   for name, tp in (("in_proj_weight", "RS(0)"),
                                                    ("in_proj_bias", "RS(0)"),
                                                    ("out_proj.weight", "RS(1)"))}}


def encoder_mlp_tp_plan(sp: bool = False, attention: bool = False, zero: int = 3,
                        extra: dict[str, str] | None = None) -> str:
    """A 2×2 (dp, tp) plan for the encoder with :data:`ENCODER_MLP_TP` (:data:`ENCODER_TP`
    with ``attention``) and the ``extra`` placements, JSON."""
    model = build("encoder")
    overrides = {**(ENCODER_TP if attention else ENCODER_MLP_TP), **(extra or {})}
    return plan_for(model, tp=2, dp=2, zero=zero, sp=sp, overrides=overrides).to_json()
