"""Jobs the rank pool runs: the launch trainer (token file, clipping, lr schedule) under a plan
against one process reading the same token file in the same order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply import apply_plan
from fxplan.runtime.data import TokenFile
from fxplan.core.training import lr_at
from fxplan.runtime.optim import param_groups
from fxplan.core.training import TrainConfig
from fxplan.runtime.trainer import train
from rt_plans import SEQ, VOCAB, build_model, fixed_batch, make_plan

SEED = 3


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


def reference(token_file: str, batch: int, config: TrainConfig, layers: int = 2
              ) -> tuple[list[float], list[float]]:
    """Losses and gradient norms of one process: same data order, optimizer groups, clipping
    (``torch.nn.utils.clip_grad_norm_``) and schedule."""
    model = build_model(layers)
    data = _data(token_file, batch)
    groups = param_groups(dict(model.named_parameters()), config.weight_decay)
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))
    else:
        optimizer = torch.optim.SGD(groups, lr=config.lr)
    losses, norms = [], []
    for step in range(1, config.steps + 1):
        (tokens,), targets = data.batch(step - 1, 0, batch)
        loss = lm_loss(model(tokens), targets)
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


def trainer_matches_reference(plan_kwargs: dict[str, Any], token_file: str,
                              config: dict[str, Any]) -> dict[str, Any] | None:
    """Train under the plan with :func:`fxplan.runtime.trainer.train`; rank 0 reports the
    curves of both and the largest relative differences."""
    plan = make_plan(**plan_kwargs)
    layers = plan_kwargs.get("layers", 2)
    cfg = TrainConfig(**config)
    sharded = apply_plan(build_model(layers), plan, fixed_batch(plan)[0], ranks=None)
    if sharded is None:
        return None
    result, _ = train(sharded, _data(token_file, plan.batch), lm_loss, cfg,
                      tokens_per_step=plan.batch * SEQ)
    ref_losses, ref_norms = reference(token_file, plan.batch, cfg, layers)
    rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))  # noqa: E731
    return dict(losses=result.losses, ref_losses=ref_losses, norms=result.grad_norms,
                ref_norms=ref_norms, lrs=result.lrs, batch=plan.batch,
                loss_error=rel(result.losses, ref_losses),
                norm_error=rel(result.grad_norms, ref_norms),
                step_times=len(result.step_times_s), peak=result.peak_memory_gib)
