"""Jobs the rank pool runs: the launch trainer (token file, clipping, lr schedule) under a plan
against one process reading the same token file in the same order."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.train.data import TokenFile
from fxplan.runtime.apply.probe import model_output
from fxplan.runtime.apply.precision import DTYPES, Precision, fp32_outputs
from fxplan.core.training import lr_at
from fxplan.runtime.train.optim import param_groups
from fxplan.core.training import TrainConfig
from fxplan.runtime.train.trainer import train
from fxplan.core.plan import Plan
from rt_plans import SEQ, VOCAB, build_model, fixed_batch, make_plan

SEED = 3
#: A tiny ``hf:llama`` reading the tiny GPT's token file (vocabulary 512, sequence 16).
LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=4,"
         f"num_key_value_heads=2,vocab_size={VOCAB},max_position_embeddings={SEQ}")


def llama_model() -> torch.nn.Module:
    """The tiny Llama, seeded as the tiny GPT is (:func:`rt_plans.build_model`)."""
    from fxplan.examples.model_spec import resolve_model

    torch.manual_seed(0)
    return resolve_model(LLAMA).build("cpu")


def llama_plan(**kwargs: Any) -> Plan:
    """A hand-made Megatron-placement plan for :func:`llama_model` at sequence length 16."""
    from rt_module_cases import plan_for

    return plan_for(llama_model(), seq=SEQ, **kwargs)


#: The three plan shapes of the trainer acceptance (dp, tp+sp, pp+ZeRO) on 4 CPU
#: ranks, as ``plan_kwargs`` of :func:`trainer_matches_reference`: the same global batch (8)
#: under every plan, so all three train on the same samples.
TRAINER_PLANS = {
    "dp": dict(dp=2, microbatch_size=2, num_microbatches=2),
    "tp_sp": dict(tp=2, sp=True, microbatch_size=4, num_microbatches=2),
    "pp_zero3": dict(pp=2, dp=2, zero=3, microbatch_size=2, num_microbatches=2, schedule="gpipe"),
}


def make_token_file(path: str, tokens: int = 6000) -> str:
    """A learnable stream: ``t_{i+1} = 5·t_i + 3 mod V``, one id in ten replaced at random."""
    rng = np.random.default_rng(0)
    out = np.empty(tokens, dtype=np.uint16)
    out[0] = 1
    noise, random = rng.random(tokens) < 0.1, rng.integers(0, VOCAB, tokens)
    for i in range(1, tokens):
        out[i] = random[i] if noise[i] else (int(out[i - 1]) * 5 + 3) % VOCAB
    out.tofile(path)
    return path


def _data(path: str, batch: int) -> TokenFile:
    return TokenFile(path, seq=SEQ, global_batch=batch, dtype=np.dtype("uint16"), vocab=VOCAB,
                     seed=SEED)


def reference(token_file: str, batch: int, config: TrainConfig, layers: int = 2,
              dtype: str = "fp32", model: torch.nn.Module | None = None
              ) -> tuple[list[float], list[float]]:
    """Losses and gradient norms of one process: same data order, optimizer groups, clipping
    (``torch.nn.utils.clip_grad_norm_``) and schedule; ``dtype`` bf16: the forward under
    ``torch.autocast("cpu", bfloat16)``, the loss on fp32 logits, fp32 parameters."""
    model = build_model(layers) if model is None else model
    compute = DTYPES[dtype]
    data = _data(token_file, batch)
    groups = param_groups(dict(model.named_parameters()), config.weight_decay)
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))
    else:
        optimizer = torch.optim.SGD(groups, lr=config.lr)
    losses, norms = [], []
    for step in range(1, config.steps + 1):
        (tokens,), targets = data.batch(step - 1, 0, batch)
        with torch.autocast("cpu", dtype=compute, enabled=compute != torch.float32):
            logits = model(tokens)
        loss = lm_loss(fp32_outputs(model_output(logits)), targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip or float("inf"))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr=config.lr, steps=config.steps,
                                warmup=config.warmup_steps, min_lr=config.min_lr)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        norms.append(float(norm))
    return losses, norms


#: One process's curves per (token file, batch, config, layers, dtype, model), kept for the
#: worker's life: the parametrized plans of a test module compare against the same reference,
#: which is deterministic (seeded model, fixed data order), so it is computed once.
_REFERENCES: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}


def cached_reference(token_file: str, batch: int, config: TrainConfig, layers: int, dtype: str,
                     model: str | None, build: Callable[[], torch.nn.Module]
                     ) -> tuple[list[float], list[float]]:
    """:func:`reference` on ``build()``, computed once per distinct argument set (see
    ``_REFERENCES``); ``model`` names what ``build`` builds (None: the tiny GPT)."""
    key = (token_file, batch, repr(config), layers, dtype, model)
    if key not in _REFERENCES:
        _REFERENCES[key] = reference(token_file, batch, config, layers, dtype, build())
    losses, norms = _REFERENCES[key]
    return list(losses), list(norms)


def linear_output_dtypes(sharded: Any) -> tuple[set[str], list[Any]]:
    """Forward hooks on every ``nn.Linear`` of this rank's stages recording the dtypes their
    outputs have (a matmul run in bf16 writes bf16); returns the set and the hook handles."""
    seen: set[str] = set()

    def record(module: torch.nn.Module, args: Any, out: Any) -> None:
        seen.add(str(out.dtype).removeprefix("torch."))

    handles = [m.register_forward_hook(record) for stage in sharded.stages
               for m in stage.inner.modules() if isinstance(m, torch.nn.Linear)]
    return seen, handles


def precision_facts(sharded: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Dtypes of the parameters (the fp32 masters) and of the optimizer's state tensors."""
    params = {str(p.dtype).removeprefix("torch.") for p in sharded.parameters()}
    states = {str(v.dtype).removeprefix("torch.") for state in optimizer.state.values()
              for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return dict(param_dtypes=sorted(params), state_dtypes=sorted(states))


def trainer_matches_reference(plan_kwargs: dict[str, Any], token_file: str,
                              config: dict[str, Any], dtype: str = "fp32",
                              model: str | None = None, cp: int = 1) -> dict[str, Any] | None:
    """Train under the plan with :func:`fxplan.runtime.train.trainer.train` in ``dtype``
    (:mod:`fxplan.runtime.apply.precision`); rank 0 reports the curves of both, the largest relative
    differences, and the dtypes seen (Linear outputs, parameters, optimizer state); the other
    ranks train and return ``None`` (only rank 0 runs the one-process reference, see
    :func:`cached_reference`). ``model``: ``"llama"`` for the tiny ``hf:llama`` of
    :mod:`rt_module_cases` (default the tiny GPT); ``cp``: the plan's context-parallel degree
    (:func:`rt_cp_cases.with_cp`)."""
    from rt_cp_cases import with_cp

    plan = make_plan(**plan_kwargs) if model is None else llama_plan(**plan_kwargs)
    plan = with_cp(plan, cp) if cp > 1 else plan
    layers = plan_kwargs.get("layers", 2)
    cfg = TrainConfig(**config)
    build = (lambda: build_model(layers)) if model is None else llama_model
    sharded = apply_plan(build(), plan, fixed_batch(plan)[0], ranks=None,
                         precision=Precision(DTYPES[dtype]))
    if sharded is None:
        return None
    seen, handles = linear_output_dtypes(sharded)
    result, optimizer = train(sharded, _data(token_file, plan.batch), lm_loss, cfg,
                              tokens_per_step=plan.batch * SEQ)
    for handle in handles:
        handle.remove()
    if dist.get_rank() != 0:
        return None
    ref_losses, ref_norms = cached_reference(token_file, plan.batch, cfg, layers, dtype, model,
                                             build)
    rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))  # noqa: E731
    return dict(losses=result.losses, ref_losses=ref_losses, norms=result.grad_norms,
                ref_norms=ref_norms, lrs=result.lrs, batch=plan.batch, path=sharded.path,
                loss_error=rel(result.losses, ref_losses),
                norm_error=rel(result.grad_norms, ref_norms), linear_dtypes=sorted(seen),
                step_times=len(result.step_times_s), peak=result.peak_memory_gib,
                **precision_facts(sharded, optimizer))
